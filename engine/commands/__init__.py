"""The CLI's subcommands (`python -m engine COMMAND`), one module each with add_parser(sub) and main(args).

The top of the engine beside engine.api: may import any engine module; nothing in engine imports these but
engine/cli.py.
"""
