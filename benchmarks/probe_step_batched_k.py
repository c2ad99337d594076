"""A step's skinny product with K cut into S slices as one strided-batched cublasLt call (issue #34: blogA in bf16).

cublasLt's product at blogA's LSTM step (64 x 2560 by 2560 x 10240, bf16) reads its 52 MB weight at ~2.5 TB/s, where
a kernel that only reads it reaches 4.66 (NOTES 2026-11-28 01:49), and every algorithm the heuristic offers plans
under one wave (0.7-0.97 waves, benchmarks/probe_step_algos.py). Its split-K, which adds a reduction launch, was
slower everywhere. The same product as a batch of S K slices (A and W batch members K / S columns apart, leading
dimension K; each slice's product its own plane of out) gives cublasLt S times the tiles of one product, and the
planes' sum can go where the step already reads the product: the cell kernel (or float32x3's fold,
engine/schedules/split_products.py, which sums its chunks that way). So each row here is timed twice: the batched
GEMM alone (what the cell kernel summing the planes would leave) and the GEMM with a separate sum kernel.

Each variant is checked against float64 on the mode's values, then timed as 50 products captured into a CUDA graph
(median of 11 launches).

    python3 benchmarks/probe_step_batched_k.py --out /tmp/probe
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_chain import graph_ms  # noqa: E402

from engine.codegen.cublas_enums import (  # noqa: E402
    CUBLAS_COMPUTE_32F,
    CUBLAS_COMPUTE_32F_FAST_TF32,
    CUDA_R_16BF,
    CUDA_R_32F,
)
from engine.schedules.cublaslt import LtProjection, Product  # noqa: E402
from engine.schedules.project import operand_dtype, round_into  # noqa: E402

CASES = [("lstm blogA", "bfloat16", 64, 2560, 10240), ("gru blogA", "bfloat16", 64, 2560, 7680),
         ("lstm blogA", "tf32", 64, 2560, 10240), ("lstm large (a layer)", "bfloat16", 128, 1024, 4096),
         ("lstm large (a layer)", "tf32", 128, 1024, 4096), ("lstm B=16 H=512", "bfloat16", 16, 512, 2048)]
SLICES = (1, 2, 4, 5, 8, 10)
CHAIN = 50
MODES = {"bfloat16": (CUDA_R_16BF, CUBLAS_COMPUTE_32F), "tf32": (CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32)}
SUM_SOURCE = r"""
extern "C" __global__ void sum_planes(const float* __restrict__ p, float* __restrict__ out, const long n, const int S)
{
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        float s = p[i];
        for (int k = 1; k < S; ++k) s += p[k * n + i];
        out[i] = s;
    }
}
"""


def main() -> None:
    import cupy as cp
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    lt = LtProjection.on_current_device(cp)
    sum_planes = cp.RawKernel(SUM_SOURCE, "sum_planes")
    stream = cp.cuda.Stream(non_blocking=True)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    rows = []
    for case, mode, B, K, N in CASES:
        data_type, compute = MODES[mode]
        rng = np.random.default_rng(0)
        x32 = cp.asarray(rng.uniform(-1, 1, (B, K)).astype(np.float32))
        w32 = cp.asarray((rng.standard_normal((N, K)) / K ** 0.5).astype(np.float32))
        x = round_into(cp, x32, cp.empty((B, K), operand_dtype(cp, mode)), mode)
        w = round_into(cp, w32, cp.empty((N, K), operand_dtype(cp, mode)), mode)
        as64 = (lambda a: (a.astype(cp.uint32) << 16).view(cp.float32).astype(cp.float64)) if mode == "bfloat16" \
            else (lambda a: a.astype(cp.float64))
        exact = as64(x) @ as64(w).T
        out = cp.empty((B, N), dtype=cp.float32)
        cp.cuda.Device().synchronize()              # made on the null stream, used on `stream`
        for S in SLICES:
            if K % S or (K // S) % 8:
                continue
            planes = cp.empty((S, B, N), dtype=cp.float32)
            cp.cuda.Device().synchronize()
            shape = Product(B, N, K // S, K, K, S, (K // S, K // S, B * N)) if S > 1 else Product.dense(B, N, K)

            def gemm(shape=shape, planes=planes, S=S):
                target = out if S == 1 else planes
                if not lt.product(shape, x.data.ptr, w.data.ptr, target.data.ptr, data_type, compute):
                    raise RuntimeError(f"cublasLt offers no algorithm for {shape}")

            def total(S=S, planes=planes):
                gemm()
                if S > 1:
                    sum_planes((min(-(-B * N // 256), sms * 16),), (256,), (planes, out, np.int64(B * N), np.int32(S)))

            out.fill(float("nan"))
            cp.cuda.Device().synchronize()
            with stream:
                total()
            stream.synchronize()
            error = float(cp.abs(out - exact).max() / cp.abs(exact).max())
            if not error < 1e-4:           # the mode's values multiplied exactly, summed in fp32: ~1e-6
                raise AssertionError(f"{case} {mode} in {S} slices: {error:.2e} from float64 (NaN: a plane unwritten)")
            row = {"case": case, "mode": mode, "B": B, "K": K, "N": N, "slices": S, "rel_err": error}
            for label, issue in (("gemm_us", gemm), ("with_sum_us", total)):
                with stream:
                    stream.begin_capture()
                    for _ in range(CHAIN):
                        issue()
                    graph = stream.end_capture()
                row[label] = graph_ms(cp, stream, graph) * 1e3 / CHAIN
            weight_bytes = N * K * (2 if mode == "bfloat16" else 4)
            row["weight_TB_per_s"] = weight_bytes / (row["gemm_us"] * 1e-6) / 1e12
            rows.append(row)
            print(json.dumps(row), flush=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "probe_step_batched_k.json").write_text(json.dumps(
        {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "cupy": cp.__version__, "rows": rows},
        indent=1))
    print("\ncase                  mode      S  GEMM us  +sum us  weight TB/s  rel err")
    for r in rows:
        print(f"{r['case']:21s} {r['mode']:9s} {r['slices']:2d} {r['gemm_us']:8.2f} {r['with_sum_us']:8.2f} "
              f"{r['weight_TB_per_s']:11.2f}  {r['rel_err']:.1e}")


if __name__ == "__main__":
    main()
