"""`python -m engine export <preset or cell.json> -I I -H H -L L -o DIR`: a standalone CUDA program.

Writes DIR/<cell>_rnn.cu (or, given `-o NAME.cu`, exactly NAME.cu), which builds with `nvcc -O2 -arch=sm_90 -o <cell>_rnn <cell>_rnn.cu -lcublas`
(its header documents the file formats). With --example T B, also writes weights.bin (seeded
parameters, packed), x.bin, states.bin and expected.bin (the NumPy reference's out.bin), so that
the program's out.bin can be compared with what the engine computes. Every file is checked before the
work and not replaced unless --force is given.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ..backends import reference
from ..errors import FileError
from ..explain import build_plan
from ..export import export_plan, program_name, render_program, write_f32, write_run_files
from ..files import check_destination, write_text
from ..network import Network
from ..params import init_params
from ._common import add_seed_arg, add_size_args, batch_flag, check_array_fits, steps_flag
from .explain import add_pass_args, resolve_target

RUN_FILES = ("weights.bin", "x.bin", "states.bin", "expected.bin")


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="write a self-contained .cu program (kernels + cuBLAS host driver + main)")
    p.add_argument("cell", help="preset name or path to a cell JSON file")
    p.add_argument("-o", "--output", required=True, metavar="DIR|FILE.cu",
                   help="output folder (the program is written to DIR/<cell>_rnn.cu), or the program's own .cu "
                        "file name (example files go beside it)")
    p.add_argument("--force", action="store_true", help="replace files that exist (else they are refused)")
    add_size_args(p)
    add_pass_args(p)
    p.add_argument("--arch", default="sm_90", help="GPU architecture in the documented nvcc command")
    p.add_argument("--example", nargs=2, metavar=("T", "B"),
                   help="also write example inputs, seeded weights and the reference's expected output")
    add_seed_arg(p, "the example weights and input")
    p.set_defaults(func=main)


def example_sizes(values: list[str] | None) -> tuple[int, int] | None:
    """--example T B, each checked as -T and -B are (argparse cannot type the two values of one flag apart)."""
    if values is None:
        return None
    sizes = []
    for name, text, parse in zip(("T", "B"), values, (steps_flag, batch_flag)):
        try:
            sizes.append(parse(text))
        except argparse.ArgumentTypeError as e:
            raise FileError(f"--example {name}: {e}; hint: --example 20 4 writes 20 steps of a batch of 4") from None
    return sizes[0], sizes[1]


def destinations(output: str, name: str, example: bool, force: bool) -> tuple[Path, dict[str, Path]]:
    """The program's path and the example files' paths, every one checked before anything is computed."""
    given = Path(output)
    if given.suffix == ".cu":
        program, folder = given, given.parent
    elif given.exists() and not given.is_dir():
        raise FileError(f"--output: {output!r} is a file; -o takes a folder or a .cu file name; hint: "
                        f"-o {given.with_suffix('.cu')} or -o {given.with_suffix('')}_export")
    else:
        program, folder = given / f"{name}.cu", given
    check_destination(program, "CUDA program", flag="--output", overwrite=force)
    files = {f: folder / f for f in RUN_FILES} if example else {}
    for path in files.values():
        check_destination(path, "example file", flag="--output", overwrite=force)
    return program, files


def main(args) -> int:
    target = resolve_target(args.cell)
    example = example_sizes(args.example)
    passes = {name: False for name in args.off}
    plan = export_plan(target, args.input_size, args.hidden_size, args.layers, passes, args.layout, args.chunk_steps)
    name = program_name(plan)
    program, files = destinations(args.output, name, example is not None, args.force)
    if example:
        steps, batch = example
        check_array_fits("the example input x", (steps, batch, args.input_size), "--example T B or --input-size")
        run_plan = build_plan(target, args.input_size, args.hidden_size, args.layers, steps, batch, passes,
                              args.layout, args.chunk_steps)
        network: Network = run_plan.network
        params = init_params(network, seed=args.seed)
        x = np.random.default_rng(args.seed + 1).standard_normal((steps, batch, args.input_size))
        ref = reference.run(network, params, x)         # computed before any file is written
    write_text(program, render_program(plan, arch=args.arch), "CUDA program", flag="--output")
    print(f"wrote {program}")
    if example:
        paths = write_run_files(files["x.bin"].parent, run_plan.program, network, params, x)
        expected = [ref.outputs] + [ref.final_states[s] for s in run_plan.program.cell.state_names]
        write_f32(files["expected.bin"], expected, "expected outputs")
        print(f"wrote {', '.join(str(p) for p in [*paths.values(), files['expected.bin']])}")
        print(f"run: cd {program.parent} && nvcc -O2 -std=c++17 -arch={args.arch} -o {name} {program.name} "
              f"-lcublas && ./{name} weights.bin x.bin {steps} {batch} out.bin states.bin")
    return 0
