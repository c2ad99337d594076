"""`python -m engine <command>`: the headless CLI. Each command is a module in engine/commands/ with
`add_parser(subparsers)` and `main(args) -> int`; they are discovered, so a new command is a new file.

Exit status: 0 done; 2 the request was refused (a bad flag or file, an invalid cell, a request the engine cannot
carry out): stderr holds one `error: ...` line and its `  hint: ...`; 1 an internal error (a bug: one line says
so, and how to see the traceback); 130 interrupted. `--debug` (or ENGINE_DEBUG=1) prints the traceback too.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import re
import sys
import traceback

from . import commands
from .errors import CellGraphError, EngineError, Problem

EXIT_OK, EXIT_INTERNAL, EXIT_REFUSED, EXIT_INTERRUPTED = 0, 1, 2, 130
REPORT_TO = "the cellforge maintainers (the project's issue tracker)"

# Where a message's hint starts: "...; hint: ...", "... hint: ...", "...\n  hint: ..."
HINT = re.compile(r"[\s;.,]*\bhint:\s*", re.IGNORECASE)


class Parser(argparse.ArgumentParser):
    """argparse, with usage errors in the CLI's own two-line form (exit status 2). `command_parsers`: each
    command's own parser, by name (on the top-level parser)."""

    command_parsers: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str):
        message = " ".join(message.splitlines())        # a value given on the command line may hold line breaks
        self.exit(EXIT_REFUSED, f"error: {message}\n  hint: `{self.prog} --help` lists the options\n")


def build_parser() -> Parser:
    parser = Parser(prog="python -m engine",
                    description="Design, validate, compile, run and benchmark recurrent cells.",
                    epilog="Exit status: 0 done, 2 refused (one 'error:' line and a hint on stderr), 1 internal "
                           "error (a bug; --debug shows its traceback), 130 interrupted.")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an error too (also: environment variable ENGINE_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"engine.commands.{info.name}")
        module.add_parser(sub)
    for command in sub.choices.values():     # `python -m engine run lstm --debug` works as well
        command.add_argument("--debug", dest="debug_command", action="store_true", help=argparse.SUPPRESS)
    parser.command_parsers = dict(sub.choices)
    return parser


def split_message(error: EngineError) -> tuple[str, list[str]]:
    """(the message's first line, its hint lines) of an engine error, whichever way the message spells its hint."""
    if isinstance(error, CellGraphError):
        first = error.problems[0]
        text = str(Problem(first.message, node=first.node, field=first.field))
        hints = [first.hint] if first.hint else []
        if len(error.problems) > 1:
            text += f" (the first of {len(error.problems)} problems; --debug prints them all)"
        return text.splitlines()[0] if text.strip() else type(error).__name__, hints
    text = str(error).strip()
    parts = HINT.split(text)
    message = parts[0].strip().splitlines()[0] if parts[0].strip() else type(error).__name__
    hints = [" ".join(part.split()) for part in parts[1:] if part.strip()]
    attribute = getattr(error, "hint", None)
    if not hints and isinstance(attribute, str) and attribute.strip():
        hints = [" ".join(attribute.split())]
    return message, hints


def report_refusal(error: EngineError) -> None:
    message, hints = split_message(error)
    print(f"error: {message}", file=sys.stderr)
    for hint in hints:
        print(f"  hint: {hint}", file=sys.stderr)


def report_internal(error: BaseException) -> None:
    what = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    print(f"internal error (a bug in cellforge, not in your input): {what}; rerun with `python -m engine --debug "
          f"...` for the traceback and report it to {REPORT_TO}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:                     # told by the command's parser, so that the hint names its --help
            parser.command_parsers[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as stop:          # --help (0) or a usage error (2, already printed)
        return stop.code if isinstance(stop.code, int) else EXIT_REFUSED
    debug = args.debug or getattr(args, "debug_command", False) or os.environ.get("ENGINE_DEBUG", "").strip() not in ("", "0")
    try:
        return int(args.func(args) or 0)
    except EngineError as e:
        if debug:
            traceback.print_exc()
        report_refusal(e)
        return EXIT_REFUSED
    except MemoryError as e:            # sizes beyond this machine: the request, not the engine, is at fault
        if debug:
            traceback.print_exc()
        print(f"error: out of memory ({e or 'an allocation failed'})", file=sys.stderr)
        print("  hint: smaller sizes (-I, -H, -L, -T, -B) or a machine with more memory", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:             # `python -m engine explain lstm | head`: the reader left; stop quietly
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_INTERNAL
    except Exception as e:  # noqa: BLE001 -- the one boundary where a bug becomes a one-line report, not a traceback
        if debug:
            traceback.print_exc()
        report_internal(e)
        return EXIT_INTERNAL
