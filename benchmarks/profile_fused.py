"""The fused backend in a precision mode, one configuration, run a few times (the first directly, the next captured,
the rest replayed from CUDA graphs): a target for nsys, to see where a step's time goes kernel by kernel.

    nsys profile --cuda-graph-trace=node -o /tmp/x3 python benchmarks/profile_fused.py --preset lstm --config large
    nsys stats --report cuda_gpu_kern_sum /tmp/x3.nsys-rep

Options of fused_modes.prepare as --option name=value (e.g. --option step_product=cublaslt).
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_run import case  # noqa: E402

from engine.schedules import fused_modes  # noqa: E402


def option(text: str) -> tuple[str, object]:
    name, _, value = text.partition("=")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="lstm")
    parser.add_argument("--config", default="large")
    parser.add_argument("--precision", default="float32x3")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--option", action="append", default=[], type=option, help="name=value for prepare()")
    args = parser.parse_args(argv)
    import cupy

    network, params, x = case(cupy, args.preset, args.config, seed=0)
    program = fused_modes.prepare(network, params, precision=args.precision, **dict(args.option))
    for _ in range(args.runs):
        result = program.run(x)
    cupy.cuda.Device().synchronize()
    print({k: v for k, v in result.info.items() if k != "program"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
