"""Where the scan's gradients spend their time in a precision mode (engine/schedules/scan_modes.py): each of the
backward's two GEMMs alone (the weights' gradient q^T X, a long K of T x B rows and few output tiles; the input's
adjoint q W), in every training mode beside strict fp32 through CuPy, and a CellRNN training step of minGRU split
into its forward and its backward, per mode. minGRU at I = H = 512, B = 8, T = 4096 by default.

    python3 benchmarks/probe_scan_modes.py
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.bench.timing import cupy_timer, time_runs  # noqa: E402
from engine.schedules.scan_modes import Products  # noqa: E402

MODES = ("float32", "tf32", "float16", "bfloat16")


def median_ms(run, reps=20) -> float:
    return time_runs(lambda k: run(), cupy_timer, buffers=1, warmup=3, reps=reps).median_ms


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    args = parser.parse_args(argv)
    import cupy
    os.environ.setdefault("CUPY_TF32", "0")
    T, B, H = args.steps, args.batch, args.hidden
    rows = T * B
    rng = np.random.default_rng(0)
    q = cupy.asarray(rng.standard_normal((rows, 2 * H)), dtype=cupy.float32)
    x = cupy.asarray(rng.standard_normal((rows, H)), dtype=cupy.float32)
    w = cupy.asarray(rng.standard_normal((2 * H, H)), dtype=cupy.float32)
    print(f"GEMMs of the scan's backward, rows = T x B = {rows}, H = {H}: median ms")
    print(f"{'mode':10s} {'q^T X (weights)':>16s} {'q W (input)':>12s} {'X W^T (forward)':>16s}")
    for mode in MODES:
        products = Products(mode, cupy)
        d_w = median_ms(lambda: products.matmul(q.T, x))
        d_x = median_ms(lambda: products.matmul(q, w))
        fwd = median_ms(lambda: products.project(x, w))
        print(f"{mode:10s} {d_w:16.3f} {d_x:12.3f} {fwd:16.3f}")
    try:
        import torch
    except ImportError:
        print("CellRNN: torch not installed")
        return 0
    from engine.torch_module import CellRNN
    tx = torch.tensor(rng.standard_normal((T, B, H)), device="cuda", dtype=torch.float32)
    print("CellRNN minGRU training step (x data), host wall ms a call after warm-up (median of 10)")
    print(f"{'mode':10s} {'forward':>9s} {'backward':>9s} {'backend':>8s}")
    for mode in MODES:
        rnn = CellRNN(engine.preset("mingru").cell, H, H, 1, seed=0, precision=mode).cuda()
        forward, backward = [], []
        for k in range(13):
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = rnn(tx)[0]
            torch.cuda.synchronize()
            middle = time.perf_counter()
            out.sum().backward()
            torch.cuda.synchronize()
            if k >= 3:
                forward.append((middle - start) * 1e3)
                backward.append((time.perf_counter() - middle) * 1e3)
        print(f"{mode:10s} {np.median(forward):9.3f} {np.median(backward):9.3f} {rnn.last_backend:>8s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
