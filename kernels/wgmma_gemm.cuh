// The cluster mode's step GEMMs on wgmma with the weights held in registers (engine/schedules/cluster.py,
// TileConfig.wgmma; issue #34 item 3). Needs tile_gemm.cuh (modes), mma_gemm.cuh (RnnMmaJob) and wgmma.cuh.
//
// Why: at small batch a block's step GEMM is bound by shared memory's 128 bytes a clock when every warp reads all of
// h and its columns of W there each step (mma.sync from shared memory: 1.82 us a step at B = 16, NC = 128, K = 512
// on an H200). With W in registers as wgmma's A operand and h read once a warpgroup by the tensor cores, the same
// product took 0.62 us (benchmarks/probe_cluster_gemm.py).
//
// The product is the transposed one, Y^T = W X^T: the weight rows (the block's gate columns) are wgmma's M, in tiles
// of 64; the batch is its N (NB = round_up(B, 16) rows of the local X); K runs in k steps of 16. The step GEMMs of
// every stage of the cell are cut into TILES tiles of 64 weight rows (a stage's GEMMs in order, each
// ceil(NC / 64) tiles). Warpgroup w holds tile w % TILES, k steps [p KSP, p KSP + KSP) of it (p = w / TILES, the
// part of K), as A fragments in registers for the whole launch (rnn_wgmma_rs_load, once). PARTS > 1: parts 1.. leave
// their accumulators in `red`, part 0 adds them in order of the part (bit-identical runs) and stores Y.
//
// The local X copies are wgmma's B operand: K-major, chunks of 64 columns, each NB rows of 128 bytes whose 16-byte
// groups are XOR-swizzled by row (rnn_swz128, the 128-byte swizzle of the matrix descriptor), every copy starting
// on a 1024-byte boundary (rnn_align1024). The cell code writes a block's own units through rnn_swz_index, and the
// block pulls the other blocks' units before the GEMM that reads them (rnn_cluster_pull_swz), or where every copy is a
// double buffer, each block pushes its units into the others' with st.async (rnn_cluster_push_swz, below).
#ifndef RNN_WGMMA_GEMM_CUH
#define RNN_WGMMA_GEMM_CUH

// Element (row, col) of a local X copy in wgmma's B layout (above), NB rows a chunk.
template <int NB>
__device__ __forceinline__ int rnn_swz_index(int row, int col)
{
    return (col >> 6) * NB * 64 + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

// The first 1024-byte boundary of shared memory at or after p: where the local X copies start.
__device__ __forceinline__ float* rnn_align1024(float* p)
{
    const unsigned at = (unsigned)__cvta_generic_to_shared(p);
    return p + (((1024u - (at & 1023u)) & 1023u) >> 2);
}

// This warpgroup's A fragments, once a launch: rows m0 + 16 q + g and + 8 of a resident weight (rows of `ldw`
// elements, zero past K up to whole k steps), k steps [s0, s0 + KSP); rows past NC and k steps past K are zeros.
template <int KSP>
__device__ __forceinline__ void rnn_wgmma_rs_load(unsigned (&a)[KSP][4], const unsigned short* ws, int ldw, int K,
                                                  int NC, int m0, int s0)
{
    const int q = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = m0 + 16 * q + g, r1 = r0 + 8;
    auto pair = [&](int r, int k) -> unsigned {
        return r < NC ? *reinterpret_cast<const unsigned*>(ws + (long)r * ldw + k) : 0u;
    };
#pragma unroll
    for (int s = 0; s < KSP; ++s) {
        const int k = 16 * (s0 + s);
        const bool in = k < K;
        a[s][0] = in ? pair(r0, k + 2 * t) : 0u;
        a[s][1] = in ? pair(r1, k + 2 * t) : 0u;
        a[s][2] = in ? pair(r0, k + 2 * t + 8) : 0u;
        a[s][3] = in ? pair(r1, k + 2 * t + 8) : 0u;
    }
}

// Tile `tile` of a stage whose tiles start at `first`: which of its N jobs, and the job's first weight row.
template <int N, typename Job>
__device__ __forceinline__ int rnn_wgmma_rs_job(const Job (&jobs)[N], int tile, int first, int& m0)
{
    int at = first;
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const int n = (jobs[i].NC + 63) >> 6;
        if (tile >= at && tile < at + n) {
            m0 = 64 * (tile - at);
            return i;
        }
        at += n;
    }
    return -1;
}

// Every GEMM of one stage (jobs: X the local copy in the B layout, Ws unused, Y the block's tile), the stage's tiles
// starting at tile `first` of the block's TILES. Y is complete for the block when it returns.
template <int MODE, int NB, int KSP, int PARTS, int TILES, int N>
__device__ __forceinline__ void rnn_wgmma_gemms_rs(const RnnMmaJob<MODE> (&jobs)[N], const unsigned (&a)[KSP][4],
                                                   int first, int B, float* __restrict__ red)
{
    static_assert(MODE == RNN_BF16 || MODE == RNN_FP16, "wgmma from registers: 16-bit operands");
    const int wg = threadIdx.x >> 7, tile = wg % TILES, part = wg / TILES;
    const int q = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int m0 = 0;
    const int job = wg < TILES * PARTS ? rnn_wgmma_rs_job(jobs, tile, first, m0) : -1;
    // This warpgroup's operand, chosen without a branch (job 0's where it has no job: its A registers are zeros,
    // and it stores nothing): ptxas serializes wgmma issued in a divergent path (its advisory C7520); serialized, the
    // cluster LSTM's GEMM phase took 1.83 us a step against 1.57 (benchmarks/NOTES.md, 2026-11-27 07:44).
    unsigned xb = (unsigned)__cvta_generic_to_shared(jobs[0].X);
    int ks = (jobs[0].K + 15) >> 4;
#pragma unroll
    for (int i = 1; i < N; ++i) {
        xb = job == i ? (unsigned)__cvta_generic_to_shared(jobs[i].X) : xb;
        ks = job == i ? (jobs[i].K + 15) >> 4 : ks;
    }
    float d[NB / 2];
#pragma unroll
    for (int e = 0; e < NB / 2; ++e) d[e] = 0.f;
    rnn_fence_async_shared();                // the local copy, written by this cluster's threads, to the async proxy
    rnn_wgmma_fence();
#pragma unroll
    for (int s = 0; s < KSP; ++s) {
        // chunk k / 4 of 64 columns, 32 bytes a k step within it; k steps past K have zero A registers, so they
        // multiply the last k step's h (finite) into nothing
        const int k = min(part * KSP + s, ks - 1);
        RnnWgmmaRs<NB, MODE == RNN_FP16>::mma(d, a[s], rnn_wgmma_desc(xb + (k >> 2) * NB * 128 + (k & 3) * 32), 1);
    }
    rnn_wgmma_commit();
    rnn_wgmma_wait<0>();
    if constexpr (PARTS > 1) {
        if (job >= 0 && part > 0) {
            float* r = red + (((part - 1) * TILES + tile) * 128 + (threadIdx.x & 127)) * (NB / 2);
#pragma unroll
            for (int e = 0; e < NB / 2; ++e) r[e] = d[e];
        }
        __syncthreads();
        if (job >= 0 && part == 0) {
#pragma unroll 1
            for (int p = 1; p < PARTS; ++p) {
                const float* r = red + (((p - 1) * TILES + tile) * 128 + (threadIdx.x & 127)) * (NB / 2);
#pragma unroll
                for (int e = 0; e < NB / 2; ++e) d[e] += r[e];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
        if (job != i || part != 0) continue;
        const RnnMmaJob<MODE>& J = jobs[i];
        // D: rows (weight rows = columns of Y) m0 + 16 q + g, + 8; columns (batch rows) 8 j + 2 t, + 1
        const int c0 = m0 + 16 * q + g, c1 = c0 + 8;
        const float b0 = J.bias && c0 < J.NC ? __ldg(J.bias + c0) : 0.f, b1 = J.bias && c1 < J.NC ? __ldg(J.bias + c1) : 0.f;
#pragma unroll
        for (int j = 0; j < NB / 8; ++j) {
            const int r = 8 * j + 2 * t;
            if (c0 < J.NC) {
                if (r < B) J.Y[(long)r * J.ldy + c0] = d[4 * j] + b0;
                if (r + 1 < B) J.Y[(long)(r + 1) * J.ldy + c0] = d[4 * j + 1] + b0;
            }
            if (c1 < J.NC) {
                if (r < B) J.Y[(long)r * J.ldy + c1] = d[4 * j + 2] + b1;
                if (r + 1 < B) J.Y[(long)(r + 1) * J.ldy + c1] = d[4 * j + 3] + b1;
            }
        }
    }
    __syncthreads();                         // Y is complete for the whole block
}

// This thread's share of a slice exchange in the B layout: f(peer, at) for every other block of the cluster (peer,
// its rank) and every E-element piece of `rows` rows x `cols` columns of a slice, at its byte offset `at` in a local
// copy. The slice is the peer's (MINE false: a pull reads the peer's units) or this block's (MINE true: a push sends
// them); block r owns columns [r cols, r cols + cols), and E elements never cross a 16-byte group of the swizzle.
template <int CS, int NB, int E, bool MINE, typename F>
__device__ __forceinline__ void rnn_cluster_slices(int rows, int cols, F&& f)
{
    unsigned me;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(me));
    const int per_row = cols / E, n = rows * per_row;
    for (int i = threadIdx.x; i < n * (CS - 1); i += blockDim.x) {
        const int k = i / n, e = i - k * n, row = e / per_row;
        const unsigned peer = (unsigned)k + ((unsigned)k >= me);
        f(peer, 2 * rnn_swz_index<NB>(row, (int)(MINE ? me : peer) * cols + (e - row * per_row) * E));
    }
}

// The other blocks' slices of a local copy in the B layout, read from their shared memory into this block's (the
// wgmma path's exchange: each block writes only its own units, the cluster barrier publishes them, and a block pulls
// the rest before the GEMM that reads the copy). Block r of the cluster owns columns [r cols, r cols + cols) of
// `rows` rows; V (2, 4, 8 or 16 bytes: what divides cols' bytes) at a time, a V never crossing a 16-byte group, so
// the swizzle keeps it whole. Ends with this thread's proxy fence: the tensor cores read what it wrote. The caller
// meets at a block barrier before the GEMM.
//
// Why not push (each block storing its slice into the others before the barrier, as rnn_cluster_share does): the
// barrier's release, or a proxy fence, then waits for every remote store to land, ~1.4 us a step at 16 blocks
// (phase profile of the LSTM at H = 512, B = 16, H200); a pull pays the remote loads' round trip, all in flight.
template <int CS, int NB, typename V>
__device__ __forceinline__ void rnn_cluster_pull_swz(unsigned short* local, int rows, int cols)
{
    const unsigned base = (unsigned)__cvta_generic_to_shared(local);
    rnn_cluster_slices<CS, NB, sizeof(V) / 2, false>(rows, cols, [&](unsigned peer, int at) {
        *reinterpret_cast<V*>(reinterpret_cast<char*>(local) + at) = rnn_cluster_get<V>(base + at, peer);
    });
    rnn_fence_async_shared();
}

// ---- the push exchange: where every local copy is a double buffer (engine/schedules/cluster.py exchange) ----
// A block sends its slice of the next version of a local copy into every other block's copy with st.async (PTX ISA
// "st.async", sm_90), each store's bytes completing a transaction on the receiver's mbarrier for that version; the
// receiver waits on that barrier (acquire at cluster scope) before the GEMM that reads the version, and no cluster
// barrier stands on the step's path. A barrier a version, one phase a use of the version: armed (arrive.expect_tx of
// the peers' bytes) at the kernel's start and again by the receiver once it has waited, so stores can land before
// the arrival: the phase completes when both the arrival and every byte are in.
// Why a version is not overwritten while a block still reads it: the next stores into version v of block C come
// with the values of two steps later, and a peer computes those only after C's values of the step between, which C
// writes after its GEMM read version v. The cluster-barrier exchange waited ~1.7 us a step for the barrier and the
// pull at 16 blocks (phase profile of the LSTM at H = 512, B = 16, H200, 2026-11-27).

// A 4-, 8- or 16-byte st.async into shared::cluster address `remote`, completing on the mbarrier at `remote_bar`.
__device__ __forceinline__ void rnn_st_async(unsigned remote, const uint4& v, unsigned remote_bar)
{
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n"
                 ::"r"(remote), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(remote_bar) : "memory");
}
__device__ __forceinline__ void rnn_st_async(unsigned remote, const uint2& v, unsigned remote_bar)
{
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];\n"
                 ::"r"(remote), "r"(v.x), "r"(v.y), "r"(remote_bar) : "memory");
}
__device__ __forceinline__ void rnn_st_async(unsigned remote, const unsigned& v, unsigned remote_bar)
{
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n"
                 ::"r"(remote), "r"(v), "r"(remote_bar) : "memory");
}

// This block's slice (columns [r cols, r cols + cols) of `rows` rows, r its rank) of a local copy in the B layout
// into every other block's copy at the same place, V at a time, completing on their barriers at the same offset as
// `bar` (a shared::cta address). The caller has met at a block barrier since the slice was written.
template <int CS, int NB, typename V>
__device__ __forceinline__ void rnn_cluster_push_swz(const unsigned short* local, unsigned bar, int rows, int cols)
{
    const unsigned base = (unsigned)__cvta_generic_to_shared(local);
    rnn_cluster_slices<CS, NB, sizeof(V) / 2, true>(rows, cols, [&](unsigned peer, int at) {
        const V v = *reinterpret_cast<const V*>(reinterpret_cast<const char*>(local) + at);
        unsigned remote, remote_bar;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(base + at), "r"(peer));
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote_bar) : "r"(bar), "r"(peer));
        rnn_st_async(remote, v, remote_bar);
    });
}

// Waits for the phase of `parity` of this block's barrier `bar`, with acquire at cluster scope (the peers' stores
// are visible after it), then fences toward the async proxy: the tensor cores read what arrived and what this
// thread wrote. The caller meets at a block barrier before the GEMM.
__device__ __forceinline__ void rnn_cluster_receive(unsigned bar, unsigned parity)
{
    unsigned done;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
    rnn_fence_async_shared();
}

// This block's barriers of the push exchange, once a launch before the cluster barrier that precedes any push:
// COUNT barriers from `bars` (shared::cta address, 8 bytes each), one arrival a phase, each armed for `bytes`.
__device__ __forceinline__ void rnn_cluster_receive_init(unsigned bars, int count, unsigned bytes)
{
    if (threadIdx.x == 0) {
        for (int i = 0; i < count; ++i) {
            rnn_bar_init(bars + 8 * i, 1);
            rnn_bar_expect(bars + 8 * i, bytes);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
}

#endif  // RNN_WGMMA_GEMM_CUH
