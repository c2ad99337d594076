"""float32x3's hoisted projection on cuBLAS: error against float64 and time, of the ways to sum the three TF32
products. Tensor cores add into their accumulator with truncation (Fasi et al. 2021, "Numerical behavior of NVIDIA
tensor cores", PeerJ CS 7:e330), so a long K in one accumulator drifts toward zero; an fp32 addition of partial sums
(cuBLAS's epilogue, beta = 1) rounds to nearest. Variants: the three GEMMs (x_hi w_lo, x_lo w_hi, then x_hi w_hi)
with x_hi w_hi in K chunks of 1024 (one accumulator over all of K), 512, 256, 128 (each chunk its own GEMM into the
output with beta = 1); engine.schedules.project as it is; and cuBLAS's strict fp32 SGEMM for scale. Random normal operands, M x N x K of the
`large` projection (T*B = 12800 rows cut to 3200, N = 4H = 4096, K = 1024).

    python benchmarks/probe_fp32x3_projection.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json

import cupy
import numpy as np
from probe_schedules import time_ms  # (benchmarks/, the script's folder; it puts the repository on the path)

from engine.schedules import project as p


def chunked(source, weight, out, chunk):
    """float32x3's three GEMMs with x_hi w_hi in K chunks of `chunk` (pointer offsets, no copies)."""
    (x_hi, x_lo), (w_hi, w_lo) = p.split_tf32(cupy, source), p.split_tf32(cupy, weight)
    for w_part, x_part, beta in ((w_lo, x_hi, p._ZERO), (w_hi, x_lo, p._ONE)):
        p._gemm_ex(cupy, w_part, x_part, out, p.CUDA_R_32F, p.CUBLAS_COMPUTE_32F_FAST_TF32, beta)
    K = source.shape[1]
    for k in range(0, K, chunk):
        p._gemm_ex(cupy, w_hi, x_hi, out, p.CUDA_R_32F, p.CUBLAS_COMPUTE_32F_FAST_TF32, p._ONE, (k, min(chunk, K - k)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    rng = np.random.default_rng(5)
    M, N, K = 3200, 4096, 1024
    source = cupy.asarray(rng.standard_normal((M, K)), dtype=cupy.float32)
    weight = cupy.asarray(rng.uniform(-1, 1, (N, K)) / np.sqrt(K), dtype=cupy.float32)
    exact = source.astype(cupy.float64) @ weight.astype(cupy.float64).T
    scale = float(cupy.linalg.norm(exact))
    variants = {
        "sgemm (strict fp32)": lambda out: cupy.matmul(source, weight.T, out=out),
        f"project() (chunks of {p.K_CHUNK_X3})": lambda out: p.project(cupy, source, weight, None, out, "float32x3"),
        **{f"3xtf32, hi*hi in K chunks of {c}": (lambda out, c=c: chunked(source, weight, out, c))
           for c in (1024, 512, 256, 128)},
    }
    rows = []
    for name, fn in variants.items():
        out = cupy.full((M, N), cupy.nan, dtype=cupy.float32)      # poisoned
        fn(out)
        error = float(cupy.linalg.norm(out.astype(cupy.float64) - exact)) / scale
        worst = float(cupy.max(cupy.abs(out - exact)) / cupy.max(cupy.abs(exact)))
        bias = float(cupy.mean((out.astype(cupy.float64) - exact) * cupy.sign(exact)) / cupy.mean(cupy.abs(exact)))
        ms = time_ms(lambda: fn(out), warmup=3, repeats=20)
        rows.append({"variant": name, "norm_rel_error": error, "max_rel_error": worst, "bias_toward_zero": -bias,
                     "ms": ms})
        print(f"{name:36s} norm-rel {error:.3g}  max-rel {worst:.3g}  bias {-bias:+.3g}  {ms:.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"M": M, "N": N, "K": K, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
