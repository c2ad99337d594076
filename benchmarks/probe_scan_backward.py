"""Where the scan's forward + backward spends its GPU time (minGRU, I = H = 512, B = 8, T = 4096, float32): one warm
call of engine.bptt(backend="scan") between cudaProfilerStart and Stop, for
`ncu --profile-from-start off --print-summary per-kernel python3 benchmarks/probe_scan_backward.py`; without ncu it
prints the call's CUDA-event time and the host time around it."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402


def main() -> int:
    os.environ.setdefault("CUPY_TF32", "0")
    import cupy
    T, B, H = 4096, 8, 512
    network = engine.Network(engine.preset("mingru").cell, H, H, 1)
    params = engine.init_params(network, seed=0)
    rng = np.random.default_rng(1)
    x = cupy.asarray(rng.standard_normal((T, B, H)), dtype=cupy.float32)
    d_out = cupy.asarray(rng.standard_normal((T, B, H)), dtype=cupy.float32)

    def call():
        return engine.bptt(network, params, x, d_outputs=d_out, dtype=np.float32, backend="scan")
    for _ in range(3):
        call()
    cupy.cuda.Device().synchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    host = time.perf_counter()
    cupy.cuda.profiler.start()
    start.record()
    call()
    end.record()
    cupy.cuda.profiler.stop()
    issued = time.perf_counter() - host
    end.synchronize()
    print(f"one call: {cupy.cuda.get_elapsed_time(start, end):.3f} ms on the GPU clock, {issued * 1e3:.3f} ms to issue")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
