"""`python -m engine export <preset or cell.json> -I I -H H -L L -o DIR`: a standalone CUDA program.

Writes DIR/<cell>_rnn.cu, which builds with `nvcc -O2 -arch=sm_90 -o <cell>_rnn <cell>_rnn.cu -lcublas`
(its header documents the file formats). With --example T B, also writes weights.bin (seeded
parameters, packed), x.bin, states.bin and expected.bin (the NumPy reference's out.bin), so that
the program's out.bin can be compared with what the engine computes.
"""
from __future__ import annotations

import numpy as np

from ..backends import reference
from ..explain import build_plan
from ..export import program_name, write_export, write_run_files
from ..network import Network
from ..params import init_params
from ._common import add_size_args
from .explain import add_pass_args, resolve_target


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="write a self-contained .cu program (kernels + cuBLAS host driver + main)")
    p.add_argument("cell", help="preset name or path to a cell JSON file")
    p.add_argument("-o", "--output", required=True, help="output directory")
    add_size_args(p)
    add_pass_args(p)
    p.add_argument("--arch", default="sm_90", help="GPU architecture in the documented nvcc command")
    p.add_argument("--example", nargs=2, type=int, metavar=("T", "B"),
                   help="also write example inputs, seeded weights and the reference's expected output")
    p.add_argument("--seed", type=int, default=0, help="seed of the example weights and input")
    p.set_defaults(func=main)


def main(args) -> int:
    target = resolve_target(args.cell)
    passes = {name: False for name in args.off}
    path = write_export(args.output, target, args.input_size, args.hidden_size, args.layers, passes=passes,
                        layout=args.layout, chunk_steps=args.chunk_steps, arch=args.arch)
    print(f"wrote {path}")
    if args.example:
        steps, batch = args.example
        plan = build_plan(target, args.input_size, args.hidden_size, args.layers, steps, batch, passes,
                          args.layout, args.chunk_steps)
        network: Network = plan.network
        params = init_params(network, seed=args.seed)
        rng = np.random.default_rng(args.seed + 1)
        x = rng.standard_normal((steps, batch, args.input_size))
        paths = write_run_files(args.output, plan.program, network, params, x)
        ref = reference.run(network, params, x)
        expected = [ref.outputs] + [ref.final_states[s] for s in plan.program.cell.state_names]
        with open(paths["x"].with_name("expected.bin"), "wb") as f:
            for a in expected:
                f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())
        name = program_name(plan)
        print(f"wrote {', '.join(str(p) for p in paths.values())} and expected.bin")
        print(f"run: cd {args.output} && nvcc -O2 -std=c++17 -arch={args.arch} -o {name} {name}.cu -lcublas && "
              f"./{name} weights.bin x.bin {steps} {batch} out.bin states.bin")
    return 0
