"""Where the minGRU scan's forward goes (issue #33's 10x target): the whole call as scan_bench times it, the GEMM
alone, the scan kernel alone, and the host's time before the GEMM's launch. One layer, I = H = 512, B = 8,
T = 4096, float32 (TF32 off). CUDA-event medians after warm-up, as engine.bench times every row.

    python3 benchmarks/probe_scan_forward.py
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("CUPY_TF32", "0")

import engine  # noqa: E402
from engine.bench.timing import cupy_timer, time_runs  # noqa: E402
from engine.schedules import scan, scan_values  # noqa: E402


def median_ms(run, warmup=5, reps=30) -> float:
    return time_runs(lambda k: run(), cupy_timer, buffers=1, warmup=warmup, reps=reps).median_ms


def mingru_case(T: int = 4096, B: int = 8, H: int = 512):
    """(network, x on the GPU, the scan's program) of the probe: minGRU, one layer, I = H, float32 inputs."""
    import cupy
    network = engine.Network(engine.preset("mingru").cell, H, H, 1)
    params = engine.init_params(network, seed=0)
    x = cupy.asarray(np.random.default_rng(1).standard_normal((T, B, H)).astype(np.float32))
    return network, x, scan.prepare(network, params)


def main() -> int:
    import cupy
    T, B, H = 4096, 8, 512
    network, x, program = mingru_case(T, B, H)
    if len(sys.argv) > 1:                    # --unroll N: the whole call with that unroll (for ncu), then stop
        u1, u3 = int(sys.argv[2]), int(sys.argv[3])
        source = scan.scan_kernel.fused_scan_source
        scan.scan_kernel.fused_scan_source = lambda *a: (source(*a).replace("#define SCAN_U1 ", f"#define SCAN_U1 {u1} //")
                                                         .replace("#define SCAN_U3 ", f"#define SCAN_U3 {u3} //"))
        for _ in range(3):
            program.run(x)
        cupy.cuda.Device().synchronize()
        return 0
    print("device", cupy.cuda.runtime.getDeviceProperties(0)["name"].decode())
    print(f"whole call        {median_ms(lambda: program.run(x)):.3f} ms")
    stacked = cupy.ascontiguousarray(cupy.concatenate([program.params[0]["W_z"], program.params[0]["W_h"]]))
    rows = x.reshape(T * B, H)
    print(f"GEMM (cupy @)     {median_ms(lambda: rows @ stacked.T):.3f} ms")

    plan = program.plan
    env = {"x": rows}
    blocks = scan_values.grouped_matmuls(network.cell, plan.found.free, env, program.params[0], cupy, plan.groups)
    initial = cupy.zeros((B, H), dtype=cupy.float32)
    def kernel_ms():
        return median_ms(lambda: scan._inline_scan(plan, network.cell, env, blocks, program.params[0], T, B, H,
                                                   initial, np.float32, cupy, False))
    source = scan.scan_kernel.fused_scan_source
    for round_ in range(2):                  # A/B in one process: the unroll against one step at a time
        for u1, u3 in ((1, 1), (1, 16), (4, 16), (16, 16)):
            plan.launches.clear()
            scan.scan_kernel.fused_scan_source = (
                lambda *a, u1=u1, u3=u3: source(*a).replace("#define SCAN_U1 ", f"#define SCAN_U1 {u1} //")
                .replace("#define SCAN_U3 ", f"#define SCAN_U3 {u3} //"))
            print(f"scan kernels      {kernel_ms():.3f} ms (unroll {u1}, {u3}; round {round_})")
    scan.scan_kernel.fused_scan_source = source
    plan.launches.clear()
    for label, fn in (("check_inputs", lambda: scan.check_inputs(network, x, None, xp=cupy)),
                      ("cupy @", lambda: rows @ stacked.T)):
        samples = []
        for _ in range(50):
            cupy.cuda.Device().synchronize()
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
        print(f"host, {label:12s}{np.median(samples):.3f} ms")
    cupy.cuda.Device().synchronize()
    samples = []
    for _ in range(30):
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        program.run(x)
        samples.append((time.perf_counter() - t0) * 1e3)
    cupy.cuda.Device().synchronize()
    print(f"host, whole call  {np.median(samples):.3f} ms (issue time, no sync)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
