"""A step's skinny product on the engine's own kernel, written to stream the weight at the read's rate (issue #34:
blogA's bf16 product on cublasLt takes ~1.5x the time a kernel that only reads its 52 MB weight does;
benchmarks/probe_stream_floor.py, H200, 2026-11-28).

    out (B, N) fp32 = X (B, K) bf16 @ W (N, K)^T bf16

One block owns 64 rows of W (features) and every batch row; four warps, warp w the 16 features 16w..16w+15 against
all B batch rows (mma.sync m16n8k16, bf16 in, fp32 sums; W as A, X as B). K goes through a STAGES-deep cp.async
ring of 64-column chunks of W and X (16-byte copies, a 128-byte row swizzled so ldmatrix reads 8 rows without bank
conflicts), so 16-24 KB a block are in flight. No split of K: one block sums each output. B <= 64, multiples of 16.

A third kernel keeps the ring and puts the products on wgmma (one warpgroup a block, B = 64 only, sm_90a; 28.3 us
against cublasLt's 20.0 at blogA's LSTM on an H200, 2026-11-28); its last rows cut K over 2, 4 or 8 blocks a
feature tile, each into a plane of its own, and sum the planes after (more bytes in flight an SM; not yet run).

Checked against float64 on the same bf16 values, then timed in the chain of probe_step_algos.StepChain (the product,
then a tanh and a rounding kernel that make the next operand), beside cublasLt's product in the same chain.

    python3 benchmarks/probe_stream_gemm.py --out /tmp/probe
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_chain import StepChain  # noqa: E402

CASES = [("lstm blogA", 2560, 64, 200, 4), ("gru blogA", 2560, 64, 200, 3), ("lstm B=16 H=512", 512, 16, 1024, 4)]
RING_SOURCE = r"""
#define NT 64          // W rows a block
#define KC 64          // K columns a chunk

// One chunk of the ring: NT rows of W, then B rows of X, 64 columns each, at shared address sw: 16-byte copies into
// 128-byte rows whose pieces are swizzled (piece c of row r at c ^ (r % 8)), so ldmatrix's 8 rows hit 8 bank groups.
template <int B>
__device__ __forceinline__ void ring_load(const unsigned sw, const unsigned short* __restrict__ x,
                                          const unsigned short* __restrict__ w, const int n0, const int K,
                                          const long k0, const int tid)
{
    #pragma unroll
    for (int i = tid; i < NT * 8; i += 128) {                 // W: NT rows x 8 pieces of 16 bytes
        const int r = i >> 3, c = i & 7;
        const unsigned dst = sw + r * 128 + ((c ^ (r & 7)) << 4);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(w + (long)(n0 + r) * K + k0 + c * 8));
    }
    #pragma unroll
    for (int i = tid; i < B * 8; i += 128) {                  // X: B rows x 8 pieces, after W's NT rows
        const int r = i >> 3, c = i & 7;
        const unsigned dst = sw + (NT + r) * 128 + ((c ^ (r & 7)) << 4);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(x + (long)r * K + k0 + c * 8));
    }
}

// The ring of STAGES chunks at shared address base: start() issues the first STAGES - 1; advance(chunk) waits for
// chunk's copies (and, for readers in the async proxy, wgmma, fences them over), meets the block at a barrier (so
// the slot of chunk - 1 is free), issues chunk + STAGES - 1's, and returns chunk's stage: W's NT rows, then X's B.
template <int B, int STAGES>
struct Ring {
    static constexpr int STAGE = (NT + B) * KC * 2;
    unsigned base;
    const unsigned short* __restrict__ x;
    const unsigned short* __restrict__ w;
    int n0, K, chunks, tid;

    __device__ __forceinline__ void start() const
    {
        #pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < chunks) ring_load<B>(base + s * STAGE, x, w, n0, K, (long)s * KC, tid);
            asm volatile("cp.async.commit_group;");
        }
    }

    template <bool ASYNC_READERS = false>
    __device__ __forceinline__ unsigned advance(const int chunk) const
    {
        asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 2));
        if constexpr (ASYNC_READERS) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        const int next = chunk + STAGES - 1;
        if (next < chunks) ring_load<B>(base + (next % STAGES) * STAGE, x, w, n0, K, (long)next * KC, tid);
        asm volatile("cp.async.commit_group;");
        return base + (chunk % STAGES) * STAGE;
    }
};
"""
SOURCE = RING_SOURCE + r"""
template <int B, int STAGES>
__global__ void __launch_bounds__(128) stream_gemm(const unsigned short* __restrict__ x,
                                                   const unsigned short* __restrict__ w,
                                                   float* __restrict__ out, const int N, const int K)
{
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int W_BYTES = NT * KC * 2;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int n0 = blockIdx.x * NT;
    const int chunks = K / KC;
    const Ring<B, STAGES> ring{(unsigned)__cvta_generic_to_shared(smem), x, w, n0, K, chunks, tid};

    float acc[B / 8][4];
    #pragma unroll
    for (int j = 0; j < B / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    ring.start();
    for (int chunk = 0; chunk < chunks; ++chunk) {
        const unsigned sw = ring.advance(chunk), sx = sw + W_BYTES;
        #pragma unroll
        for (int ks = 0; ks < KC / 16; ++ks) {
            unsigned a[4];
            {   // A: rows 16 warp + (lane % 16), 16-byte piece 2 ks + lane / 16
                const int r = warp * 16 + (lane & 15), c = ks * 2 + (lane >> 4);
                const unsigned addr = sw + r * 128 + ((c ^ (r & 7)) << 4);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(addr));
            }
            #pragma unroll
            for (int j = 0; j < B / 8; j += 2) {
                unsigned b[4];
                // lanes 0-7: batch rows 8j.., piece 2ks; 8-15: piece 2ks+1; 16-23: rows 8j+8.., 2ks; 24-31: 2ks+1
                const int r = 8 * j + (lane & 7) + ((lane >> 4) << 3), c = ks * 2 + ((lane >> 3) & 1);
                const unsigned addr = sx + r * 128 + ((c ^ (r & 7)) << 4);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]) : "r"(addr));
                #pragma unroll
                for (int h = 0; h < 2; ++h)
                    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                                 : "+f"(acc[j + h][0]), "+f"(acc[j + h][1]), "+f"(acc[j + h][2]), "+f"(acc[j + h][3])
                                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[2 * h]), "r"(b[2 * h + 1]));
            }
        }
    }
    asm volatile("cp.async.wait_group 0;");
    // c0, c1: feature g, batch 2t, 2t+1; c2, c3: feature g + 8
    const int g = lane >> 2, t = lane & 3, n = n0 + warp * 16 + g;
    #pragma unroll
    for (int j = 0; j < B / 8; ++j) {
        const int b = 8 * j + 2 * t;
        out[(long)b * N + n] = acc[j][0];
        out[(long)(b + 1) * N + n] = acc[j][1];
        out[(long)b * N + n + 8] = acc[j][2];
        out[(long)(b + 1) * N + n + 8] = acc[j][3];
    }
}

// The same ring, K split over the warps: warp w takes k step w of every chunk for all 64 features and all B batch
// rows, so each byte of W and X in shared memory is read by one warp (the kernel above reads X four times). The
// warps' partial sums meet in shared memory at the end, added in warp order (runs are bit-identical).
template <int B, int STAGES>
__global__ void __launch_bounds__(128) stream_gemm_ks(const unsigned short* __restrict__ x,
                                                      const unsigned short* __restrict__ w,
                                                      float* __restrict__ out, const int N, const int K)
{
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int W_BYTES = NT * KC * 2;
    static_assert(STAGES * Ring<B, STAGES>::STAGE >= 4 * NT * B * 4, "the partial sums reuse the ring");
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int n0 = blockIdx.x * NT;
    const int chunks = K / KC;
    const Ring<B, STAGES> ring{(unsigned)__cvta_generic_to_shared(smem), x, w, n0, K, chunks, tid};

    float acc[NT / 16][B / 8][4];
    #pragma unroll
    for (int m = 0; m < NT / 16; ++m)
        #pragma unroll
        for (int j = 0; j < B / 8; ++j) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;

    ring.start();
    for (int chunk = 0; chunk < chunks; ++chunk) {
        const unsigned sw = ring.advance(chunk), sx = sw + W_BYTES;
        const int ks = warp;                                   // KC / 16 == 4 k steps, one a warp
        unsigned a[NT / 16][4];
        #pragma unroll
        for (int m = 0; m < NT / 16; ++m) {
            const int r = m * 16 + (lane & 15), c = ks * 2 + (lane >> 4);
            const unsigned addr = sw + r * 128 + ((c ^ (r & 7)) << 4);
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(a[m][0]), "=r"(a[m][1]), "=r"(a[m][2]), "=r"(a[m][3]) : "r"(addr));
        }
        #pragma unroll
        for (int j = 0; j < B / 8; j += 2) {
            unsigned b[4];
            const int r = 8 * j + (lane & 7) + ((lane >> 4) << 3), c = ks * 2 + ((lane >> 3) & 1);
            const unsigned addr = sx + r * 128 + ((c ^ (r & 7)) << 4);
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]) : "r"(addr));
            #pragma unroll
            for (int m = 0; m < NT / 16; ++m)
                #pragma unroll
                for (int h = 0; h < 2; ++h)
                    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                                 : "+f"(acc[m][j + h][0]), "+f"(acc[m][j + h][1]), "+f"(acc[m][j + h][2]),
                                   "+f"(acc[m][j + h][3])
                                 : "r"(a[m][0]), "r"(a[m][1]), "r"(a[m][2]), "r"(a[m][3]), "r"(b[2 * h]),
                                   "r"(b[2 * h + 1]));
        }
    }
    asm volatile("cp.async.wait_group 0;");
    __syncthreads();                                           // the ring is free: the partial sums go there
    float* part = reinterpret_cast<float*>(smem) + warp * NT * B;     // [b][feature]
    const int g = lane >> 2, t = lane & 3;
    #pragma unroll
    for (int m = 0; m < NT / 16; ++m)
        #pragma unroll
        for (int j = 0; j < B / 8; ++j) {
            const int b = 8 * j + 2 * t, f = m * 16 + g;
            part[b * NT + f] = acc[m][j][0];
            part[(b + 1) * NT + f] = acc[m][j][1];
            part[b * NT + f + 8] = acc[m][j][2];
            part[(b + 1) * NT + f + 8] = acc[m][j][3];
        }
    __syncthreads();
    const float* sums = reinterpret_cast<const float*>(smem);
    for (int i = tid; i < NT * B; i += 128) {
        const float v = ((sums[i] + sums[NT * B + i]) + sums[2 * NT * B + i]) + sums[3 * NT * B + i];
        out[(long)(i / NT) * N + n0 + i % NT] = v;
    }
}
template __global__ void stream_gemm_ks<64, 4>(const unsigned short*, const unsigned short*, float*, int, int);
template __global__ void stream_gemm_ks<64, 6>(const unsigned short*, const unsigned short*, float*, int, int);
template __global__ void stream_gemm_ks<16, 10>(const unsigned short*, const unsigned short*, float*, int, int);
template __global__ void stream_gemm<64, 4>(const unsigned short*, const unsigned short*, float*, int, int);
template __global__ void stream_gemm<64, 6>(const unsigned short*, const unsigned short*, float*, int, int);
template __global__ void stream_gemm<16, 6>(const unsigned short*, const unsigned short*, float*, int, int);
template __global__ void stream_gemm<16, 10>(const unsigned short*, const unsigned short*, float*, int, int);
"""


WGMMA_SOURCE = r"""
// The ring of stream_gemm with the products on wgmma (kernels/wgmma.cuh and RING_SOURCE inlined before this): one
// warpgroup a block, A = the 64 batch rows of X's chunk, B = the block's 64 rows of W, d (64 x 64 fp32, 32 a thread)
// = X W^T. cp.async writes through the generic proxy, so each thread fences to the async proxy after its copies land
// and the block meets at a barrier before the MMAs read them (Ring::advance<true>).
__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// gridDim.y > 1: K in that many slices, block (x, y) the columns of slice y into plane y of out ((slices, 64, N)),
// for a sum after: more blocks, so more bytes in flight an SM (one slice: 160 blocks, ~1.2 a SM at blogA's LSTM,
// where ncu saw 5 warps an SM and DRAM at 42 %).
template <int STAGES>
__device__ __forceinline__ void stream_wgmma_body(const unsigned short* __restrict__ x,
                                                  const unsigned short* __restrict__ w, float* __restrict__ out,
                                                  const int N, const int K)
{
    extern __shared__ unsigned char raw[];
    unsigned char* aligned = raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);   // wgmma's tiles: 1024-byte aligned
    const int chunks = K / KC / gridDim.y, k0 = blockIdx.y * chunks * KC;
    x += k0;
    w += k0;
    out += (long)blockIdx.y * 64 * N;
    const int tid = threadIdx.x, n0 = blockIdx.x * NT;
    const Ring<64, STAGES> ring{smem_u32(aligned), x, w, n0, K, chunks, tid};     // 16 KB stages: aligned too
    float d[32];
    #pragma unroll
    for (int i = 0; i < 32; ++i) d[i] = 0.0f;
    ring.start();
    for (int chunk = 0; chunk < chunks; ++chunk) {
        // chunk's copies are in and fenced over to wgmma, and chunk - 1's MMAs are done (wait<0> below)
        const unsigned sw = ring.advance<true>(chunk), sx = sw + NT * 128;
        rnn_wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            RnnWgmma<64, false>::mma(d, rnn_wgmma_desc(sx + kk * 32), rnn_wgmma_desc(sw + kk * 32), 1);
        rnn_wgmma_commit();
        rnn_wgmma_wait<0>();
    }
    asm volatile("cp.async.wait_group 0;");
    // d: warp q's batch rows 16 q + g and + 8; for each 8-feature group j, features 8 j + 2 t and + 1
    const int q = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3, row = q * 16 + g;
    #pragma unroll
    for (int j = 0; j < NT / 8; ++j) {
        const int n = n0 + 8 * j + 2 * t;
        out[(long)row * N + n] = d[4 * j];
        out[(long)row * N + n + 1] = d[4 * j + 1];
        out[(long)(row + 8) * N + n] = d[4 * j + 2];
        out[(long)(row + 8) * N + n + 1] = d[4 * j + 3];
    }
}
#define WG_ENTRY(S) extern "C" __global__ void __launch_bounds__(128) stream_wgmma_##S(                             \
    const unsigned short* __restrict__ x, const unsigned short* __restrict__ w, float* __restrict__ out, int N,     \
    int K) { stream_wgmma_body<S>(x, w, out, N, K); }
WG_ENTRY(4)
WG_ENTRY(6)
WG_ENTRY(8)

// out (n floats) = the sum of `planes` planes of n floats each, plane 0 first
extern "C" __global__ void sum_planes(const float4* __restrict__ planes, float4* __restrict__ out, const long n4,
                                      const int count)
{
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x) {
        float4 v = planes[i];
        for (int p = 1; p < count; ++p) {
            const float4 u = planes[(long)p * n4 + i];
            v.x += u.x; v.y += u.y; v.z += u.z; v.w += u.w;
        }
        out[i] = v;
    }
}
"""


def main() -> None:
    import cupy

    from engine.schedules.cublaslt import LtProjection
    from engine.schedules.project import LT_OPERANDS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--reps", type=int, default=11)
    args = ap.parse_args()
    from engine.codegen.cuda import helper_source
    from engine.codegen.nvrtc import load_module

    wgmma = load_module(helper_source("wgmma.cuh") + RING_SOURCE + WGMMA_SOURCE, kernel="stream_wgmma") \
        if int(cupy.cuda.Device().compute_capability) == 90 else None
    names = [f"stream_gemm<{b}, {s}>" for b, s in ((64, 4), (64, 6), (16, 6), (16, 10))]
    names += [f"stream_gemm_ks<{b}, {s}>" for b, s in ((64, 4), (64, 6), (16, 10))]
    module = cupy.RawModule(code=SOURCE, options=("--std=c++17",), name_expressions=names)
    lt = LtProjection.on_current_device(cupy)
    rows = []
    for case, H, B, T, G in CASES:
        N, K = G * H, H
        chain = StepChain(cupy, "bfloat16", H, B, N, T, args.reps)
        bound = lt.bind(chain.w, chain.out, *LT_OPERANDS["bfloat16"])
        variants = {"cublasLt": bound}
        shapes = [("stream_gemm", s) for s in ((4, 6) if B == 64 else (6, 10))]
        shapes += [("stream_gemm_ks", s) for s in ((4, 6) if B == 64 else (10,))]
        for entry, stages in shapes:
            kernel = module.get_function(f"{entry}<{B}, {stages}>")
            smem = stages * (64 * 64 * 2 + B * 64 * 2)
            kernel.max_dynamic_shared_size_bytes = smem

            def product(operand_ptr, _stream_ptr, kernel=kernel, smem=smem):
                kernel((N // 64,), (128,), (np.uint64(operand_ptr), chain.w, chain.out, np.int32(N), np.int32(K)),
                       shared_mem=smem)
            variants[f"{entry}, {stages} stages"] = product
        for stages in ((4, 6, 8) if B == 64 and wgmma is not None else ()):
            kernel = wgmma.get_function(f"stream_wgmma_{stages}")
            smem = stages * 2 * 64 * 128 + 1024            # + the slack that aligns the ring to 1024 bytes
            kernel.max_dynamic_shared_size_bytes = smem

            def product(operand_ptr, _stream_ptr, kernel=kernel, smem=smem):
                kernel((N // 64,), (128,), (np.uint64(operand_ptr), chain.w, chain.out, np.int32(N), np.int32(K)),
                       shared_mem=smem)
            variants[f"stream_wgmma, {stages} stages"] = product
        if B == 64 and wgmma is not None:
            total = cupy.empty((8 * B, N), dtype=cupy.float32)        # up to 8 planes of (B, N)
            summing = wgmma.get_function("sum_planes")
            for slices in (2, 4, 8):
                if (K // 64) % slices:
                    continue
                kernel = wgmma.get_function("stream_wgmma_6")
                smem = 6 * 2 * 64 * 128 + 1024

                def product(operand_ptr, _stream_ptr, kernel=kernel, smem=smem, slices=slices):
                    kernel((N // 64, slices), (128,), (np.uint64(operand_ptr), chain.w, total, np.int32(N),
                                                       np.int32(K)), shared_mem=smem)
                    n4 = B * N // 4
                    summing((min(1024, -(-n4 // 256)),), (256,), (total, chain.out, np.int64(n4), np.int32(slices)))
                variants[f"stream_wgmma, 6 stages, K in {slices} + sum"] = product
        for label, product in variants.items():
            err = chain.error(product)
            ms = chain.time(chain.capture(product))
            rows.append({"case": case, "H": H, "B": B, "T": T, "N": N, "variant": label, "ms": ms,
                         "us_per_step": 1e3 * ms / T, "rel_err": err,
                         "weight_TB_per_s": chain.w.nbytes / (ms / T * 1e-3) / 1e12})
            print(f"{case:16s} {label:24s} {1e3 * ms / T:7.2f} us a step (chain)  err {err:.1e}", flush=True)
            if err > 1e-2:
                raise SystemExit(f"{case} {label}: error {err:.1e} against float64")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_stream_gemm.json").write_text(json.dumps(
            {"device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
