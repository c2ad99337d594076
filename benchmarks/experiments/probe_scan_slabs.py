"""Probe: the minGRU scan in slabs of time, each slab's GEMM output read by the scan's passes while it is still in
L2 (issue #33's 10x target). One layer, I = H = 512, B = 8, T = 4096, float32 (TF32 off); CUDA-event medians after
warm-up; each slabbed output compared with the one-call scan's.

    python3 benchmarks/experiments/probe_scan_slabs.py
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # benchmarks/: the scan probe's case
os.environ.setdefault("CUPY_TF32", "0")

from probe_scan_forward import median_ms, mingru_case  # noqa: E402

from engine.schedules import scan, scan_values  # noqa: E402


def main() -> int:
    import cupy
    T, B, H = 4096, 8, 512
    network, x, program = mingru_case(T, B, H)
    cell, plan, p0 = network.cell, program.plan, program.params[0]
    print("device", cupy.cuda.runtime.getDeviceProperties(0)["name"].decode())
    want = program.run(x).outputs
    print(f"whole call            {median_ms(lambda: program.run(x)):.3f} ms")
    rows = x.reshape(T * B, H)
    env = {"x": rows}
    blocks = scan_values.grouped_matmuls(cell, plan.found.free, env, p0, cupy, plan.groups)
    (name, (product, _)), = list(blocks.items())[:1]
    stacked = p0[[k for k in p0 if "+" in k][0]]
    print(f"GEMM alone            {median_ms(lambda: cupy.matmul(rows, stacked.T, out=product)):.3f} ms")
    initial = cupy.zeros((B, H), dtype=cupy.float32)
    scan._inline_scan(plan, cell, env, blocks, p0, T, B, H, initial, np.float32, cupy, False)
    kernel = plan.kernel
    layouts, _ = scan.kernel_inputs(kernel.inputs, env, blocks, p0, H, cupy)
    chunks, carry, apply = plan.launches[layouts]
    out = cupy.empty((T, B, H), dtype=cupy.float32)
    n = B * H
    blocks_x = -(-n // scan.THREADS)

    def slabbed(S: int, chunk: int, gemm: bool = True, passes: bool = True):
        steps = T // S
        count = -(-steps // chunk)
        map_a = cupy.empty((count, n), dtype=cupy.float32)
        map_b, entering = cupy.empty_like(map_a), cupy.empty_like(map_a)
        sizes = (np.int32(steps), np.int32(B), np.int64(H), np.int32(chunk))

        def run():
            for s in range(S):
                r0, r1 = s * steps * B, (s + 1) * steps * B
                part = product[r0:r1]
                if gemm:
                    cupy.matmul(rows[r0:r1], stacked.T, out=part)
                if not passes:
                    continue
                slab_blocks = {k: (part, off) for k, (_, off) in blocks.items()}
                _, pointers = scan.kernel_inputs(kernel.inputs, env, slab_blocks, p0, H, cupy)
                start = initial if s == 0 else out[s * steps - 1]
                dest = out[s * steps:(s + 1) * steps]
                chunks((blocks_x, count), (scan.THREADS,), (*pointers, map_a, map_b, *sizes))
                carry((blocks_x,), (scan.THREADS,), (map_a, map_b, start, entering, np.int32(count), np.int64(n)))
                apply((blocks_x, count), (scan.THREADS,), (*pointers, entering, dest, *sizes))
        return run

    for round_ in range(2):
        for S in (1, 2, 4, 8, 16):
            for chunk in (16, 32, 64):
                run = slabbed(S, chunk)
                out.fill(np.nan)
                run()
                err = float(cupy.abs(out - want).max())
                print(f"slabs {S:2d} chunk {chunk:2d}   {median_ms(run):.3f} ms   max |diff| {err:.2e}  (round {round_})")
            print(f"slabs {S:2d} GEMMs only  {median_ms(slabbed(S, 64, passes=False)):.3f} ms")
            print(f"slabs {S:2d} passes only {median_ms(slabbed(S, 32, gemm=False)):.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
