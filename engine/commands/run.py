"""`python -m engine run <preset or cell.json>`: run a network on random or given inputs and save outputs."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..api import run
from ..errors import BackendError
from ..network import Network
from ..params import Params, init_params
from ._common import add_size_args, resolve_cell


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run a network of the cell (reference on the CPU, or a GPU backend)")
    p.add_argument("cell", help="preset name or path to a cell JSON file")
    add_size_args(p, steps=True, batch=True)
    p.add_argument("--input", help=".npy file with x of shape (T, B, I); random normal if omitted")
    p.add_argument("--params", help=".npz parameter file (keys layer<l>.<name>); seeded init if omitted")
    p.add_argument("--seed", type=int, default=0, help="seed for parameters and random inputs (default 0)")
    p.add_argument("--backend", default="reference", help="auto | reference | naive | fused | graph | persistent (default reference)")
    p.add_argument("--dtype", default="float64", choices=["float32", "float64"], help="precision (default float64)")
    p.add_argument("--check-finite", action="store_true",
                   help="refuse NaN or Inf in the input, the initial states or the parameters, naming the first")
    p.add_argument("--precision", default="float32", choices=["float32", "tf32", "float16", "bfloat16"],
                   help="matmul precision mode: the schedules run it on tensor cores, the reference emulates it "
                        "(default float32: strict)")
    p.add_argument("-o", "--output", default="run_outputs.npz",
                   help="where to save outputs and final states (.npz; default run_outputs.npz)")
    p.set_defaults(func=main)


def main(args) -> int:
    cell = resolve_cell(args.cell)
    if args.input:
        path = Path(args.input)
        if not path.exists():
            raise BackendError(f"--input: file '{path}' does not exist")
        try:
            x = np.load(path)
        except ValueError as e:
            raise BackendError(f"--input: '{path}' is not a .npy array ({e})") from None
        if x.ndim != 3:
            raise BackendError(f"--input: x must have shape (T, B, I), got {x.shape}")
        steps, batch, input_size = x.shape
    else:
        steps, batch, input_size = args.steps, args.batch, args.input_size
        for flag, value in (("--steps", steps), ("--batch", batch)):
            if value < 1:
                raise BackendError(f"{flag} must be at least 1, got {value}")
        x = np.random.default_rng(args.seed + 1).standard_normal((steps, batch, input_size))
    net = Network(cell, input_size, args.hidden_size, args.layers, args.proj_size)
    params = Params.load(args.params, net) if args.params else init_params(net, seed=args.seed)
    result = run(net, params, x, backend=args.backend, dtype=np.dtype(args.dtype).type, precision=args.precision,
                 check_finite=args.check_finite)
    outputs = np.asarray(result.outputs.get() if hasattr(result.outputs, "get") else result.outputs)
    finals = {f"final_{k}": np.asarray(v.get() if hasattr(v, "get") else v) for k, v in result.final_states.items()}
    out = Path(args.output)
    np.savez(out, outputs=outputs, **finals)
    mode = "" if args.precision == "float32" else f" in {args.precision}"
    print(f"ran {cell.name}: x {x.shape} -> outputs {outputs.shape} on backend '{result.backend}'{mode}")
    print(f"saved outputs and final states ({', '.join(result.final_states)}) to {out}")
    return 0
