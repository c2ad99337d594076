"""The cluster mode's step GEMM at small batch, three ways (issue #34 item 3: the small-batch step).

In cluster mode (engine/schedules/cluster.py) a block keeps its weight slice W (NC gate columns x K) and the
layer's h (B x K, bf16) in its own shared memory, and every step computes Y (B x NC, fp32) = h W^T. The phase profile
of the LSTM at I = H = 512, B = 16 (16 blocks of 32 units, NC = 128, K = 512) put 1.2-1.8 us of its 4.4 us step
in these MMAs. A model that fits those figures: the warps are bound by shared memory's 128 bytes a clock, because
every warp reads all of h (16 KiB) and its own columns of W (128 KiB in all) each step:

- `ss_mma` (the engine's kernel now): mma.sync with h as A and W as B, both from shared memory through ldmatrix;
  a warp 16 columns; 8 warps read 8 x 16 + 128 = 256 KiB a step (~1.1 us at 128 B/clk);
- `rs_mma`: W held in registers for the whole run, as the A operand of mma.sync (the transposed product
  Y^T = W h^T: a warp's 16 weight rows x 16 batch rows), h read from shared memory by ldmatrix: 8 x 16 = 128 KiB
  a step (~0.6 us), two accumulators a tile (even and odd k steps) to halve the chain of dependent MMAs;
- `rs_wgmma`: W in registers as the A operand of wgmma (m64n16k16, a warpgroup 64 weight rows), h the B operand
  read by the tensor cores from a 128-byte-swizzled tile through a matrix descriptor (kernels/wgmma.cuh): h read
  once a warpgroup, 2 x 16 = 32 KiB a step, so the tensor cores' rate, not shared memory, bounds it (~0.3 us).

Each kernel runs STEPS steps a launch (Y into shared memory and a block barrier each step, as the cell code reads
it); one block a cluster's worth (16 blocks). Checked against NumPy (the bf16 operands' product in float64) first;
medians of CUDA-event timed launches after warm-up.

    python benchmarks/probe_cluster_gemm.py [--steps 200] [--json out.json]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probe_schedules import checked, finish, step_probe_args, time_ms  # noqa: E402  (benchmarks/)
from probe_wgmma import _module  # noqa: E402

WGMMA_HEADER = Path(__file__).resolve().parents[1] / "kernels" / "wgmma.cuh"
BR = 16                        # rows of h a tile (the batch, padded to 16)

SOURCE = r"""
__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ unsigned char* aligned_smem(unsigned char* raw)
{
    return raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);
}
__device__ __forceinline__ unsigned ld32(const unsigned short* p) { return *reinterpret_cast<const unsigned*>(p); }
__device__ __forceinline__ void ldsm4(unsigned (&r)[4], unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void mma16816(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

constexpr int NC = __NC__, K = __K__, KS = K / 16, XS = K + 8;       // XS: padded row of h and W (elements)

// h (B x K) into padded rows of XS elements, rows past B zero.
__device__ __forceinline__ void load_h_padded(unsigned short* xs, const unsigned short* __restrict__ x, int B)
{
    for (int i = threadIdx.x; i < __BR__ * XS; i += blockDim.x) {
        const int r = i / XS, c = i % XS;
        xs[i] = r < B && c < K ? x[r * K + c] : (unsigned short)0;
    }
}

// A fragments of all of K for the 16 weight rows from `wr` (this lane's row g; row g + 8 is 8 K further), in
// mma.sync m16n8k16's A layout, which wgmma's register-source A shares.
__device__ __forceinline__ void load_a(unsigned (&a)[KS][4], const unsigned short* __restrict__ wr, int t)
{
#pragma unroll
    for (int s = 0; s < KS; ++s) {
        a[s][0] = ld32(wr + 16 * s + 2 * t);
        a[s][1] = ld32(wr + 8 * K + 16 * s + 2 * t);
        a[s][2] = ld32(wr + 16 * s + 2 * t + 8);
        a[s][3] = ld32(wr + 8 * K + 16 * s + 2 * t + 8);
    }
}

// Y (B x NC, shared memory) into this block's columns of y (B x N).
__device__ __forceinline__ void store_y(float* __restrict__ y, const float* ys, int B, int N)
{
    for (int i = threadIdx.x; i < B * NC; i += blockDim.x)
        y[(i / NC) * N + blockIdx.x * NC + i % NC] = ys[i];
}

extern "C" __global__ void ss_mma(const unsigned short* __restrict__ x, const unsigned short* __restrict__ w,
                                  float* __restrict__ y, int B, int N, int steps)
{
    extern __shared__ unsigned char raw[];
    unsigned short* xs = reinterpret_cast<unsigned short*>(aligned_smem(raw));
    unsigned short* ws = xs + __BR__ * XS;
    float* ys = reinterpret_cast<float*>(ws + NC * XS);
    load_h_padded(xs, x, B);
    for (int i = threadIdx.x; i < NC * XS; i += blockDim.x) {
        const int r = i / XS, c = i % XS;
        ws[i] = c < K ? w[((long)blockIdx.x * NC + r) * K + c] : (unsigned short)0;
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const unsigned xa = smem_u32(xs) + (lane % 16) * XS * 2 + (lane / 16) * 16;
    const unsigned wa = smem_u32(ws) + (16 * warp + (lane / 16) * 8 + lane % 8) * XS * 2 + ((lane / 8) % 2) * 16;
    for (int step = 0; step < steps; ++step) {
        float acc[2][4] = {};
#pragma unroll 8
        for (int s = 0; s < KS; ++s) {
            unsigned a[4], b[4];
            ldsm4(a, xa + 32 * s);
            ldsm4(b, wa + 32 * s);
            mma16816(acc[0], a[0], a[1], a[2], a[3], b[0], b[1]);
            mma16816(acc[1], a[0], a[1], a[2], a[3], b[2], b[3]);
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {            // C: rows (batch) g, g + 8; columns 16 warp + 8 j + 2 t ..
            const int col = 16 * warp + 8 * j + 2 * t;
            ys[g * NC + col] = acc[j][0];
            ys[g * NC + col + 1] = acc[j][1];
            ys[(g + 8) * NC + col] = acc[j][2];
            ys[(g + 8) * NC + col + 1] = acc[j][3];
        }
        __syncthreads();
    }
    store_y(y, ys, B, N);
}

extern "C" __global__ void rs_mma(const unsigned short* __restrict__ x, const unsigned short* __restrict__ w,
                                  float* __restrict__ y, int B, int N, int steps)
{
    extern __shared__ unsigned char raw[];
    unsigned short* xs = reinterpret_cast<unsigned short*>(aligned_smem(raw));
    float* ys = reinterpret_cast<float*>(xs + __BR__ * XS);
    load_h_padded(xs, x, B);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    // A = this warp's 16 weight rows (gate columns 16 warp ..), all of K, in mma.sync's A layout
    unsigned a[KS][4];
    load_a(a, w + ((long)blockIdx.x * NC + 16 * warp + g) * K, t);
    __syncthreads();
    // B = h^T: ldmatrix.x4 of h rows lane % 16, k bytes (lane / 16) * 16: matrices (rows 0-7, k 0-7), (8-15, 0-7),
    // (0-7, 8-15), (8-15, 8-15) = b0, b1 of batch rows 0-7 in r[0], r[2] and of rows 8-15 in r[1], r[3]
    const unsigned xa = smem_u32(xs) + (lane % 16) * XS * 2 + (lane / 16) * 16;
    for (int step = 0; step < steps; ++step) {
        float acc[2][2][4] = {};                 // [even / odd k step][batch rows 0-7 / 8-15]
#pragma unroll
        for (int s = 0; s < KS; ++s) {
            unsigned b[4];
            ldsm4(b, xa + 32 * s);
            mma16816(acc[s & 1][0], a[s][0], a[s][1], a[s][2], a[s][3], b[0], b[2]);
            mma16816(acc[s & 1][1], a[s][0], a[s][1], a[s][2], a[s][3], b[1], b[3]);
        }
#pragma unroll
        for (int n = 0; n < 2; ++n) {            // C: rows (gate columns) 16 warp + g, + 8; columns (batch) 8 n + 2 t ..
            const int col = 16 * warp + g, row = 8 * n + 2 * t;
            ys[row * NC + col] = acc[0][n][0] + acc[1][n][0];
            ys[(row + 1) * NC + col] = acc[0][n][1] + acc[1][n][1];
            ys[row * NC + col + 8] = acc[0][n][2] + acc[1][n][2];
            ys[(row + 1) * NC + col + 8] = acc[0][n][3] + acc[1][n][3];
        }
        __syncthreads();
    }
    store_y(y, ys, B, N);
}

extern "C" __global__ void rs_wgmma(const unsigned short* __restrict__ x, const unsigned short* __restrict__ w,
                                    float* __restrict__ y, int B, int N, int steps)
{
    extern __shared__ unsigned char raw[];
    unsigned char* xt = aligned_smem(raw);                  // K / 64 tiles of 16 rows x 128 swizzled bytes
    float* ys = reinterpret_cast<float*>(xt + (K / 64) * __BR__ * 128);
    for (int i = threadIdx.x; i < __BR__ * (K / 8); i += blockDim.x) {
        const int r = i / (K / 8), q = i % (K / 8);
        const uint4 v = r < B ? *reinterpret_cast<const uint4*>(x + r * K + 8 * q) : make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(xt + (q / 8) * __BR__ * 128 + rnn_swz128(r, q % 8)) = v;
    }
    rnn_fence_async_shared();
    const int wg = threadIdx.x / 128, q = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    unsigned a[KS][4];
    load_a(a, w + ((long)blockIdx.x * NC + 64 * wg + 16 * q + g) * K, t);
    __syncthreads();
    const unsigned xb = smem_u32(xt);
    for (int step = 0; step < steps; ++step) {
        float d[8];
        rnn_wgmma_fence();
#pragma unroll
        for (int s = 0; s < KS; ++s)
            RnnWgmmaRs<16, false>::mma(d, a[s], rnn_wgmma_desc(xb + (s / 4) * __BR__ * 128 + (s % 4) * 32), s > 0);
        rnn_wgmma_commit();
        rnn_wgmma_wait<0>();
        rnn_wgmma_store_t16(ys, NC, 64 * wg, d);
        __syncthreads();
    }
    store_y(y, ys, B, N);
}
"""

# name: (B, NC, K): the LSTM at I = H = 512 in 16 blocks of 32 units, and an sLSTM head of 128 units (H = 512, 4 heads)
# in 8 blocks of 16 units
CASES = {"lstm-H512": (16, 128, 512), "slstm-H512-head": (16, 64, 128)}
BLOCKS = 16


def source(nc: int, k: int) -> str:
    return WGMMA_HEADER.read_text() + SOURCE.replace("__NC__", str(nc)).replace("__K__", str(k)) \
        .replace("__BR__", str(BR))


def run_case(cupy, module, name: str, B: int, nc: int, k: int, steps: int, reps: int) -> dict:
    from engine.rounding import round_operand, weight_bits
    rng = np.random.default_rng(1)
    N = BLOCKS * nc
    h, w = rng.standard_normal((B, k)).astype(np.float32), (rng.standard_normal((N, k)) / np.sqrt(k)).astype(np.float32)
    want = round_operand(h, "bfloat16") @ round_operand(w, "bfloat16").T
    x_bits, w_bits = cupy.asarray(weight_bits(h, "bfloat16")), cupy.asarray(weight_bits(w, "bfloat16"))
    row = {"case": name, "B": B, "NC": nc, "K": k, "blocks": BLOCKS, "steps": steps}
    xs_bytes = BR * (k + 8) * 2
    kernels = {"ss_mma": (32 * nc // 16, 1024 + xs_bytes + nc * (k + 8) * 2 + B * nc * 4),
               "rs_mma": (32 * nc // 16, 1024 + xs_bytes + B * nc * 4),
               "rs_wgmma": (128 * nc // 64, 1024 + BR * k * 2 + B * nc * 4)}
    for kernel, (threads, smem) in kernels.items():
        function = module.get_function(kernel)
        function.max_dynamic_shared_size_bytes = smem
        y = cupy.full((B, N), np.nan, dtype=cupy.float32)                     # poisoned
        args = (x_bits, w_bits, y, np.int32(B), np.int32(N))
        launch = lambda n: function((BLOCKS,), (threads,), args + (np.int32(n),), shared_mem=smem)  # noqa: E731
        launch(1)
        got = cupy.asnumpy(y).astype(np.float64)
        error = float(np.abs(got - want).max() / np.abs(want).max())
        ms = time_ms(lambda: launch(steps), warmup=3, repeats=reps)
        row[kernel] = {"threads": threads, "max_rel_error": error, "us_per_step": ms * 1e3 / steps}
    return row


def main() -> int:
    args = step_probe_args(__doc__)
    import cupy

    from engine.codegen.nvrtc import compile_cubin
    rows, failed = [], False
    for name, (B, nc, k) in CASES.items():
        module = _module(cupy, compile_cubin(source(nc, k), "90a"))
        row = run_case(cupy, module, name, B, nc, k, args.steps, args.reps)
        rows.append(row)
        for kernel in ("ss_mma", "rs_mma", "rs_wgmma"):
            r = row[kernel]
            failed |= not checked(f"{name:16s} {kernel:9s} B={B} NC={nc} K={k} {r['threads']} threads", r)
    return finish(rows, args.json, failed)


if __name__ == "__main__":
    raise SystemExit(main())
