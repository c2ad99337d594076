"""`python -m engine run <preset or cell.json>`: run a network on random or given inputs and save outputs."""
from __future__ import annotations

import numpy as np

from ..api import run
from ..backends import BACKENDS
from ..errors import BackendError, FileError
from ..files import check_destination, write_with
from ..network import Network
from ..params import Params, init_params
from ._common import add_seed_arg, add_size_args, check_array_fits, check_input_file, resolve_cell

INPUT_HINT = "give a .npy file of x with shape (T, B, I), written by numpy.save"


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run a network of the cell (reference on the CPU, or a GPU backend)")
    p.add_argument("cell", help="preset name or path to a cell JSON file")
    add_size_args(p, steps=True, batch=True)
    p.add_argument("--input", help=".npy file with x of shape (T, B, I); random normal if omitted")
    p.add_argument("--params", help=".npz parameter file (keys layer<l>.<name>); seeded init if omitted")
    add_seed_arg(p, "the parameters and random inputs")
    p.add_argument("--backend", default="reference", choices=("auto", *BACKENDS),
                   help="auto | reference | naive | fused | graph | persistent (default reference)")
    p.add_argument("--dtype", default="float64", choices=["float32", "float64"], help="precision (default float64)")
    p.add_argument("--check-finite", action="store_true",
                   help="refuse NaN or Inf in the input, the initial states or the parameters, naming the first")
    p.add_argument("--precision", default="float32", choices=["float32", "tf32", "float16", "bfloat16", "float32x3"],
                   help="matmul precision mode: the schedules run it on tensor cores, the reference emulates it "
                        "(default float32: strict; float32x3: fp32 operands split into two tf32 parts, three tensor-core "
                        "products: fp32-level error)")
    p.add_argument("--allow-tensor-core-fp32", action="store_true",
                   help="with --backend auto and --precision float32: let the autotuner also time the schedules in "
                        "float32x3 (3xTF32) and pick one if it is faster")
    p.add_argument("-o", "--output", default="run_outputs.npz",
                   help="where to save outputs and final states (an .npz archive, written at exactly this path "
                        "and replaced if it exists; default run_outputs.npz)")
    p.set_defaults(func=main)


def main(args) -> int:
    if args.allow_tensor_core_fp32 and (args.backend != "auto" or args.precision != "float32"):
        raise BackendError(f"--allow-tensor-core-fp32 lets --backend auto choose float32x3 for --precision float32; "
                           f"got --backend {args.backend} --precision {args.precision}; hint: --backend auto "
                           "--precision float32, or --precision float32x3 to run a backend in that mode")
    cell = resolve_cell(args.cell)
    out = check_destination(args.output, "outputs", flag="--output", example="run_outputs.npz")   # before the work
    if args.params:
        check_input_file(args.params, "--params", "parameter", "give an .npz written by Params.save")
    if args.input:
        x = load_input(args.input)
        steps, batch, input_size = x.shape
    else:
        steps, batch, input_size = args.steps, args.batch, args.input_size
        check_array_fits("the random input x", (steps, batch, input_size), "--steps, --batch or --input-size")
        x = np.random.default_rng(args.seed + 1).standard_normal((steps, batch, input_size))
    net = Network(cell, input_size, args.hidden_size, args.layers, args.proj_size)
    params = Params.load(args.params, net) if args.params else init_params(net, seed=args.seed)
    result = run(net, params, x, backend=args.backend, dtype=np.dtype(args.dtype).type, precision=args.precision,
                 allow_tensor_core_fp32=args.allow_tensor_core_fp32,
                 check_finite=args.check_finite)
    outputs = np.asarray(result.outputs.get() if hasattr(result.outputs, "get") else result.outputs)
    finals = {f"final_{k}": np.asarray(v.get() if hasattr(v, "get") else v) for k, v in result.final_states.items()}
    write_with(out, lambda f: np.savez(f, outputs=outputs, **finals), "outputs", flag="--output")
    mode = "" if args.precision == "float32" else f" in {args.precision}"
    print(f"ran {cell.name}: x {x.shape} -> outputs {outputs.shape} on backend '{result.backend}'{mode}")
    print(f"saved outputs and final states ({', '.join(result.final_states)}) to {out}")
    return 0


def load_input(name: str) -> np.ndarray:
    """x of shape (T, B, I) from a .npy file; anything else is refused naming --input."""
    path = check_input_file(name, "--input", "input", INPUT_HINT)
    try:
        x = np.load(path, allow_pickle=False)
    except (ValueError, EOFError, OSError) as e:
        raise FileError(f"--input: {str(path)!r} is not a .npy array ({' '.join(str(e).split())[:200]}); "
                        f"hint: {INPUT_HINT}") from None
    if not isinstance(x, np.ndarray):           # an .npz archive loads as a mapping of arrays
        x.close()
        raise FileError(f"--input: {str(path)!r} is an .npz archive, not one array; hint: {INPUT_HINT}, e.g. "
                        "numpy.save('x.npy', archive['x'])")
    if x.ndim != 3 or 0 in x.shape:
        raise BackendError(f"--input: x must have shape (T, B, I) with no size 0, got {x.shape}; hint: {INPUT_HINT}")
    if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
        raise BackendError(f"--input: x must hold real numbers, got dtype {x.dtype}; hint: {INPUT_HINT}")
    return x
