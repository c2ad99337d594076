"""Cluster mode's step GEMM in tf32, with the weights split between registers and shared memory (issue #34: FlashRNN's
"fp32" row; benchmarks/NOTES.md, 2026-11-27 10:12, has the napkin math).

In bf16 a cluster block of the LSTM at I = H = 512, B = 16 (16 blocks, NC = 128 gate columns, K = 512) holds its
weights in registers, 64 a thread (kernels/wgmma_gemm.cuh). In tf32 the same slice is 256 KiB: twice what 64
registers a thread of 512 threads hold, and more than shared memory's 227 KiB. This probe splits it:
- warpgroup w takes tile w % 2 (64 weight rows) and half w / 2 of K (256 columns, 32 k steps of 8);
- the first REG_KS k steps come from registers: wgmma's register-source A, `m64n16k8.f32.tf32.tf32`, 4 registers
  a k step;
- the rest come from shared memory: A through a matrix descriptor, 128-byte swizzle.

Two variants. REG_KS = 12 is 48 registers and 160 KiB of shared memory: ptxas fits it in 128 registers a thread (the
most 512 threads have) without spills. REG_KS = 16 is 64 registers and 128 KiB: ptxas spills 164 bytes a thread
(nvcc 13.0, sm_90a, 2026-11-27). A real kernel also needs h's second version (32 KiB more) and the cell math's
registers, so either variant is at the edge of what fits; the times say whether the edge is worth reaching.

h (16 x 512 tf32, 32 KiB) is wgmma's B operand from shared memory in the same swizzled layout. The two halves of K
are summed through shared memory, and Y (16 x 128 fp32) is stored there every step, as the cell code reads it.

Checked against NumPy first: the tf32 operands' product in float64, with fp32 sums at ~1e-6. Then medians of
CUDA-event timed launches of STEPS steps, in us a step. Compare them with benchmarks/probe_cluster_gemm.py's bf16
kernel (all weights in registers) run in the same call. The tensor cores' floor is 1 M products a block: at 512 a
clock in tf32, ~1.1 us; at 1,024 a clock in bf16, ~0.55 us.

    python benchmarks/probe_tf32_cluster_gemm.py [--steps 200] [--json out.json]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probe_schedules import checked, finish, step_probe_args, time_ms  # noqa: E402  (benchmarks/)
from probe_wgmma import _module  # noqa: E402

WGMMA_HEADER = Path(__file__).resolve().parents[1] / "kernels" / "wgmma.cuh"
B_ROWS, NC, K, BLOCKS = 16, 128, 512, 16
THREADS = 512
REG_KS = (12, 16)               # k steps of 8 a warpgroup holds in registers (of its 32), the variants timed

SOURCE = r"""
__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ unsigned char* aligned_smem(unsigned char* raw)
{
    return raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
}

constexpr int NC = __NC__, K = __K__, BR = __BR__, REG_KS = __REG_KS__;
constexpr int KS = K / 8, PART_KS = KS / 2, SMEM_KS = PART_KS - REG_KS;  // k steps of 8: all, a half, its smem share
constexpr int CHUNK = 32;                                               // tf32 columns a 128-byte row
constexpr int SMEM_CHUNKS = 2 * SMEM_KS / 4;                            // weight chunks in shared memory

// wgmma with A from registers, tf32: m64n16k8, four A registers a thread (rows 16 q + g and + 8, k t and t + 4 of
// the warpgroup's 64 x 8 tile, warp q: mma.sync m16n8k8's tf32 A layout), B from a descriptor.
__device__ __forceinline__ void wgmma_rs_tf32(float (&d)[8], const unsigned (&a)[4], unsigned long long b, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7}, "
                 "{%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

// Rows [0, rows) x columns [k0, k0 + 32) of a row-major fp32 matrix (row stride ld) into a 128-byte-swizzled tile,
// 16 bytes a thread at a time (zeros past `valid` rows).
__device__ __forceinline__ void stage(unsigned char* tile, const float* __restrict__ src, int rows, int valid, int ld,
                                      int k0)
{
    for (int i = threadIdx.x; i < rows * 8; i += blockDim.x) {
        const int r = i >> 3, g = i & 7;
        *reinterpret_cast<uint4*>(tile + rnn_swz128(r, g)) =
            r < valid ? *reinterpret_cast<const uint4*>(src + (long)r * ld + k0 + 4 * g) : make_uint4(0, 0, 0, 0);
    }
}

// The shared-memory chunk of the weights holding k step ks (of a warpgroup's half `part`, past its registers' ones).
__device__ __forceinline__ int weight_slot(int part, int ks) { return part * (SMEM_KS / 4) + (ks - part * PART_KS - REG_KS) / 4; }

extern "C" __global__ void __launch_bounds__(512, 1) split_tf32(const float* __restrict__ h, const float* __restrict__ w, float* __restrict__ y,
                                      int B, int N, int steps)
{
    extern __shared__ unsigned char raw[];
    unsigned char* w_tiles = aligned_smem(raw);                      // SMEM_CHUNKS chunks of NC rows x 128 bytes
    unsigned char* h_tiles = w_tiles + SMEM_CHUNKS * NC * 128;       // K / 32 chunks of BR rows x 128 bytes
    float* red = reinterpret_cast<float*>(h_tiles + (K / CHUNK) * BR * 128);   // half 1's sums: 2 tiles x 128 x 8
    float* ys = red + 2 * 128 * 8;                                   // Y: BR rows x NC
    const float* mine = w + (long)blockIdx.x * NC * K;
    for (int part = 0; part < 2; ++part)                             // the halves' shared-memory k steps
        for (int c = 0; c < SMEM_KS / 4; ++c)
            stage(w_tiles + (part * (SMEM_KS / 4) + c) * NC * 128, mine, NC, NC, K,
                  (part * PART_KS + REG_KS + 4 * c) * 8);
    for (int c = 0; c < K / CHUNK; ++c) stage(h_tiles + c * BR * 128, h, BR, B, K, c * CHUNK);
    const int wg = threadIdx.x / 128, tile = wg % 2, part = wg / 2;
    const int q = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    unsigned a[REG_KS][4];                                            // the registers' k steps, for the whole launch
    {
        const float* r0 = mine + (long)(64 * tile + 16 * q + g) * K, *r1 = r0 + 8L * K;
#pragma unroll
        for (int s = 0; s < REG_KS; ++s) {
            const int k = (part * PART_KS + s) * 8;
            a[s][0] = __float_as_uint(r0[k + t]);
            a[s][1] = __float_as_uint(r1[k + t]);
            a[s][2] = __float_as_uint(r0[k + t + 4]);
            a[s][3] = __float_as_uint(r1[k + t + 4]);
        }
    }
    rnn_fence_async_shared();
    __syncthreads();
    for (int step = 0; step < steps; ++step) {
        float d[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) d[e] = 0.f;
        rnn_wgmma_fence();
#pragma unroll
        for (int s = 0; s < PART_KS; ++s) {
            const int ks = part * PART_KS + s;                        // this k step of all K
            const unsigned long long b = rnn_wgmma_desc(smem_u32(h_tiles + (ks / 4) * BR * 128) + (ks % 4) * 32);
            if (s < REG_KS) {                                         // (s is a constant: unrolled, no branch)
                wgmma_rs_tf32(d, a[s < REG_KS ? s : 0], b, 1);
            } else {
                const unsigned long long wa = rnn_wgmma_desc(smem_u32(w_tiles + weight_slot(part, ks) * NC * 128
                                                                       + tile * 64 * 128) + (ks % 4) * 32);
                RnnWgmma<16, true>::mma(d, wa, b, 1);
            }
        }
        rnn_wgmma_commit();
        rnn_wgmma_wait<0>();
        if (part == 1) {
#pragma unroll
            for (int e = 0; e < 8; ++e) red[(tile * 8 + e) * 128 + threadIdx.x % 128] = d[e];
        }
        __syncthreads();
        if (part == 0) {
#pragma unroll
            for (int e = 0; e < 8; ++e) d[e] += red[(tile * 8 + e) * 128 + threadIdx.x % 128];
            rnn_wgmma_store_t16(ys, NC, 64 * tile, d);
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < B * NC; i += blockDim.x)
        y[(i / NC) * N + blockIdx.x * NC + i % NC] = ys[i];
}
"""


def source(reg_ks: int) -> str:
    return WGMMA_HEADER.read_text() + (SOURCE.replace("__NC__", str(NC)).replace("__K__", str(K))
                                       .replace("__BR__", str(B_ROWS)).replace("__REG_KS__", str(reg_ks)))


def shared_bytes(reg_ks: int) -> int:
    smem_ks = K // 8 // 2 - reg_ks
    return 1024 + (2 * smem_ks // 4) * NC * 128 + (K // 32) * B_ROWS * 128 + 2 * 128 * 8 * 4 + B_ROWS * NC * 4


def run(cupy, module, reg_ks: int, B: int, steps: int, reps: int) -> dict:
    from engine.rounding import round_operand
    rng = np.random.default_rng(1)
    N = BLOCKS * NC
    h = round_operand(rng.standard_normal((B, K)), "tf32").astype(np.float32)
    w = round_operand(rng.standard_normal((N, K)) / np.sqrt(K), "tf32").astype(np.float32)
    want = h.astype(np.float64) @ w.astype(np.float64).T
    function = module.get_function("split_tf32")
    smem = shared_bytes(reg_ks)
    function.max_dynamic_shared_size_bytes = smem
    y = cupy.full((B, N), np.nan, dtype=cupy.float32)                           # poisoned
    args = (cupy.asarray(h), cupy.asarray(w), y, np.int32(B), np.int32(N))
    launch = lambda n: function((BLOCKS,), (THREADS,), args + (np.int32(n),), shared_mem=smem)  # noqa: E731
    launch(1)
    got = cupy.asnumpy(y).astype(np.float64)
    error = float(np.abs(got - want).max() / np.abs(want).max())
    ms = time_ms(lambda: launch(steps), warmup=3, repeats=reps)
    return {"B": B, "NC": NC, "K": K, "blocks": BLOCKS, "threads": THREADS, "registers_k_steps": reg_ks,
            "shared_bytes": smem, "steps": steps, "max_rel_error": error, "us_per_step": ms * 1e3 / steps}


def main() -> int:
    args = step_probe_args(__doc__)
    import cupy

    from engine.codegen.nvrtc import compile_cubin
    rows, failed = [], False
    for reg_ks in REG_KS:
        module = _module(cupy, compile_cubin(source(reg_ks), "90a"))
        row = run(cupy, module, reg_ks, B_ROWS, args.steps, args.reps)
        rows.append(row)
        failed |= not checked(f"tf32, {reg_ks} of 32 k steps in registers: B={row['B']} NC={NC} K={K} {THREADS} "
                              f"threads, {row['shared_bytes'] / 1024:.0f} KiB shared", row)
    return finish(rows, args.json, failed)


if __name__ == "__main__":
    raise SystemExit(main())
