"""float32x3's step product in fp16 parts on a kernel of the engine's own that promotes each K chunk's tensor-core
accumulator into an fp32 sum in registers (NOTES 2026-11-28 08:13; issue #34's fp32-accurate target).

    out (R, N) = (h_lo W_hi + h_hi W_lo) / 2^11 + sum over K chunks of (h_hi W_hi over the chunk)

The fused backend makes this product on cublasLt as a strided batch of K chunks (a plane of P per chunk, written and
read again), because the tensor cores add into their accumulator with truncation and one accumulator over a long K
drifts (Fasi et al. 2021). Here one block owns 64 features (W rows) and 64 batch rows; a cp.async ring brings 64
columns of W_hi, W_lo, h_hi and h_lo a stage; each k step issues three wgmma (m64n64k16, fp16 in, fp32 accumulators):
big += h_hi W_hi, small += h_lo W_hi and h_hi W_lo. Every PROMOTE chunks the block adds `big` into `sum` with
ordinary fp32 adds (round to nearest) and the next chunk's first MMA starts `big` from zero, as DeepSeek-V3's FP8 GEMM
promotes its partial sums every 128 elements (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", section 3.3.2). So K
is one product, P is gone, and the accuracy is the chunk's. The small products need no chunks (2^-11 of the result).

Against: the same product on cublasLt as the engine issues it (split_products.stacked_calls in fp16 parts and the
fold), each with its error against the float64 product and its time in a chain of 50 captured into a CUDA graph
(median of 11 launches). sm_90a only (wgmma); B a multiple of 64, K of 64, N of 64.

    python3 benchmarks/probe_x3_promote.py --out /tmp/probe [--promote 2,4,8]

Written 2026-11-28 and compiled for sm_90a (tests/test_probe_sources.py); not yet run on a GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_chain import product_chain  # noqa: E402

from engine.codegen.cublas_enums import CUBLAS_COMPUTE_32F, CUDA_R_16F  # noqa: E402
from engine.codegen.cuda import helper_source  # noqa: E402
from engine.codegen.nvrtc import load_module  # noqa: E402
from engine.schedules.cublaslt import LtProjection  # noqa: E402
from engine.schedules.split_products import (  # noqa: E402
    LO_SCALE,
    chunking,
    fold,
    partial_size,
    split_into,
    stack_split,
    stacked_calls,
)

SHAPES = [("lstm", "large", 128, 1024, 4096), ("gru", "large", 128, 1024, 3072),
          ("lstm", "blogA", 64, 2560, 10240), ("gru", "blogA", 64, 2560, 7680)]
STAGES = 4
CHAIN = 50

SOURCE = r"""
#define NT 64              // features (W rows) a block
#define MT 64              // batch rows a block
#define KC 64              // K columns a stage
#define TILE 8192          // one 64 x 64 fp16 tile: 64 rows of 128 bytes
#define STAGE (4 * TILE)   // W_hi, W_lo, h_hi, h_lo

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// d (m64n64 fp32, 32 a thread) = A B^T + (scale_d ? d : 0) for one k step of 16 fp16 columns, A and B K-major tiles
// of 128-byte swizzled rows (kernels/wgmma.cuh's layout and descriptors; its own specializations are bf16 and tf32).
__device__ __forceinline__ void x3_mma(float (&d)[32], unsigned long long a, unsigned long long b, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" RNN_WGMMA_OUT32 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : RNN_WGMMA_D32 : "l"(a), "l"(b), "r"(scale_d));
}

// One stage: 64 rows of each of W_hi, W_lo (from feature n0), h_hi, h_lo (the block's batch rows), 64 columns from
// k0, 16-byte copies into swizzled 128-byte rows (rnn_swz128).
__device__ __forceinline__ void x3_load(const unsigned sw, const unsigned short* __restrict__ w_hi,
                                        const unsigned short* __restrict__ w_lo, const unsigned short* __restrict__ h_hi,
                                        const unsigned short* __restrict__ h_lo, const int n0, const int K,
                                        const long k0, const int tid)
{
    #pragma unroll 4
    for (int i = tid; i < 4 * 64 * 8; i += 128) {
        const int tile = i >> 9, r = (i >> 3) & 63, c = i & 7;
        const unsigned short* src = tile == 0 ? w_hi + (long)(n0 + r) * K : tile == 1 ? w_lo + (long)(n0 + r) * K
                                  : tile == 2 ? h_hi + (long)r * K : h_lo + (long)r * K;
        const unsigned dst = sw + tile * TILE + rnn_swz128(r, c);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src + k0 + c * 8));
    }
}

// out (R, N) rows MT blockIdx.z .., features NT blockIdx.x ..; the parts (2, R, K) = [h_hi; h_lo] and the stacked
// weight (2N, K) = [W_hi; W_lo], fp16 bits; promote: K chunks of 64 a promoted accumulator; scale: 1 / 2^11.
template <int STAGES_>
__device__ __forceinline__ void x3_promote_body(const unsigned short* __restrict__ parts,
                                                const unsigned short* __restrict__ weight, float* __restrict__ out,
                                                const int R, const int N, const int K, const int promote,
                                                const float scale)
{
    extern __shared__ unsigned char raw[];
    unsigned char* aligned = raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);     // wgmma's tiles: 1024-byte aligned
    const unsigned base = smem_u32(aligned);
    const int tid = threadIdx.x, n0 = blockIdx.x * NT, m0 = blockIdx.z * MT, chunks = K / KC;
    const unsigned short* h_hi = parts + (long)m0 * K;
    const unsigned short* h_lo = parts + (long)R * K + (long)m0 * K;
    const unsigned short* w_hi = weight;
    const unsigned short* w_lo = weight + (long)N * K;
    float big[32], small[32], sum[32];
    #pragma unroll
    for (int i = 0; i < 32; ++i) big[i] = small[i] = sum[i] = 0.0f;
    #pragma unroll
    for (int s = 0; s < STAGES_ - 1; ++s) {
        if (s < chunks) x3_load(base + s * STAGE, w_hi, w_lo, h_hi, h_lo, n0, K, (long)s * KC, tid);
        asm volatile("cp.async.commit_group;");
    }
    for (int chunk = 0; chunk < chunks; ++chunk) {
        asm volatile("cp.async.wait_group %0;" :: "n"(STAGES_ - 2));
        rnn_fence_async_shared();              // cp.async wrote through the generic proxy; wgmma reads the async one
        __syncthreads();                       // every thread's copies in, and chunk - 1's slot free (wait<0> below)
        const int next = chunk + STAGES_ - 1;
        if (next < chunks) x3_load(base + (next % STAGES_) * STAGE, w_hi, w_lo, h_hi, h_lo, n0, K, (long)next * KC, tid);
        asm volatile("cp.async.commit_group;");
        const unsigned sw = base + (chunk % STAGES_) * STAGE;
        const int fresh = chunk % promote == 0;                 // big starts a new accumulation here
        rnn_wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const unsigned long long whi = rnn_wgmma_desc(sw + kk * 32), wlo = rnn_wgmma_desc(sw + TILE + kk * 32);
            const unsigned long long hhi = rnn_wgmma_desc(sw + 2 * TILE + kk * 32);
            const unsigned long long hlo = rnn_wgmma_desc(sw + 3 * TILE + kk * 32);
            x3_mma(big, hhi, whi, !(fresh && kk == 0));
            x3_mma(small, hlo, whi, 1);
            x3_mma(small, hhi, wlo, 1);
        }
        rnn_wgmma_commit();
        rnn_wgmma_wait<0>();
        if ((chunk + 1) % promote == 0 || chunk + 1 == chunks) {
            #pragma unroll
            for (int i = 0; i < 32; ++i) sum[i] += big[i];     // fp32, round to nearest: the chunk promoted
        }
    }
    asm volatile("cp.async.wait_group 0;");
    // accumulators: warp q's batch rows 16 q + g and + 8; for each 8-feature group j, features 8 j + 2 t and + 1
    const int q = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3, row = m0 + q * 16 + g;
    #pragma unroll
    for (int j = 0; j < NT / 8; ++j) {
        const int n = n0 + 8 * j + 2 * t;
        out[(long)row * N + n] = small[4 * j] * scale + sum[4 * j];
        out[(long)row * N + n + 1] = small[4 * j + 1] * scale + sum[4 * j + 1];
        out[(long)(row + 8) * N + n] = small[4 * j + 2] * scale + sum[4 * j + 2];
        out[(long)(row + 8) * N + n + 1] = small[4 * j + 3] * scale + sum[4 * j + 3];
    }
}

extern "C" __global__ void __launch_bounds__(128) x3_promote(const unsigned short* __restrict__ parts,
                                                              const unsigned short* __restrict__ weight,
                                                              float* __restrict__ out, const int R, const int N,
                                                              const int K, const int promote, const float scale)
{
    x3_promote_body<%(stages)d>(parts, weight, out, R, N, K, promote, scale);
}
"""


def kernel_source() -> str:
    """The probe's CUDA, kernels/wgmma.cuh inlined before it (NVRTC gets no include path)."""
    return helper_source("wgmma.cuh") + SOURCE.replace("%(stages)d", str(STAGES))


def smem_bytes() -> int:
    return STAGES * 4 * 8192 + 1024            # + the slack that aligns the ring to 1024 bytes


def promoted_numpy(parts, stacked, promote: int):
    """What x3_promote computes, in float64 sums: the big product's K in chunks of 64 promote columns, each summed
    apart and added into the total, the small products over K whole, divided by 2^11. parts (2, R, K) and stacked
    (2N, K) as float64 values of the fp16 parts."""
    (h_hi, h_lo), N = parts, stacked.shape[0] // 2
    w_hi, w_lo = stacked[:N], stacked[N:]
    K, width = h_hi.shape[1], 64 * promote
    big = sum(h_hi[:, k:k + width] @ w_hi[:, k:k + width].T for k in range(0, K, width))
    return (h_lo @ w_hi.T + h_hi @ w_lo.T) / LO_SCALE["fp16"] + big


def main() -> None:
    import cupy  # deferred: CuPy is optional (no GPU in CI)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--promote", default="2,4,8", help="K chunks of 64 a promoted accumulator")
    args = ap.parse_args()
    if int(cupy.cuda.Device().compute_capability) != 90:
        raise SystemExit("the promoted kernel is on wgmma: sm_90 (H100, H200) only")
    kernel = load_module(kernel_source(), kernel="x3_promote").get_function("x3_promote")
    kernel.max_dynamic_shared_size_bytes = smem_bytes()
    lt = LtProjection.on_current_device(cupy)
    stream = cupy.cuda.Stream(non_blocking=True)
    rows = []
    for cell, config, R, K, N in SHAPES:
        rng = np.random.default_rng(0)
        h = cupy.asarray(rng.uniform(-1, 1, (R, K)).astype(np.float32))
        w = cupy.asarray((rng.standard_normal((N, K)) / K ** 0.5).astype(np.float32))
        exact = h.astype(cupy.float64) @ w.astype(cupy.float64).T
        parts = split_into(cupy, h, cupy.empty((2, R, K), dtype=cupy.float16), "fp16")
        stacked = stack_split(cupy, w, "fp16")
        out = cupy.empty((R, N), dtype=cupy.float32)
        cupy.cuda.Device().synchronize()

        def measure(label, issue):
            error, us = product_chain(cupy, stream, out, exact, issue, CHAIN)
            rows.append({"cell": cell, "config": config, "variant": label, "error": error, "us": us})
            print(f"{cell:4s} {config:6s} {label:44s} {us:8.2f} us  error {error:.2e}", flush=True)

        found = chunking(K)
        partial = cupy.empty(partial_size(R, N, found), dtype=cupy.float32)

        def batched():                        # the fused backend's calls (ModeDevice._stacked_product), then the fold
            for call in stacked_calls(R, K, N, found):
                if not lt.product(call.shape, parts.data.ptr + 2 * call.a, stacked.data.ptr + 2 * call.w,
                                  partial.data.ptr + 4 * call.out, CUDA_R_16F, CUBLAS_COMPUTE_32F):
                    raise SystemExit("cublasLt offered no algorithm for the fp16 parts' product")
            fold(cupy, partial, out, R, N, found.count, LO_SCALE["fp16"])
        measure(f"cublasLt, batch of {found.count} x {found.size} + fold", batched)
        for promote in (int(p) for p in args.promote.split(",")):
            def promoted(promote=promote):
                kernel((N // 64, 1, R // 64), (128,), (parts, stacked, out, np.int32(R), np.int32(N), np.int32(K),
                                                       np.int32(promote), np.float32(1 / 2048)),
                       shared_mem=smem_bytes())
            measure(f"own wgmma, promoted every {64 * promote}", promoted)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_x3_promote.json").write_text(json.dumps(
            {"device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
