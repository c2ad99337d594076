// A 16-bit mode's step product for the skinny products of large layers (blogA: h 64 x 2560 by a 2560 x 10240 weight),
// whose weight is streamed every step (benchmarks/probe_mode_stream.py stream_product; issue #34, bf16 / fp16 at
// blogA; benchmarks/NOTES.md 2026-11-28 11:10). Needs tile_gemm.cuh, mma_gemm.cuh, wgmma.cuh, mode_mma.cuh,
// tile_ring.cuh and cluster_sync.cuh before it (the tiles, the barriers and bulk copies, wgmma and its descriptors,
// ModeMma, rnn_tile_store, the cluster barrier).
//
//     out (R, N) = h W^T, h (R, K) and W (N, K) fp16 or bf16 in the wgmma products' tiles, fp32 sums
//
// mode_wgmma.cu's block (64 batch rows x 64 weight rows, one warpgroup, the K chunks of both operands through a ring of
// slots), with two changes for a step that must read more than the L2 holds:
// - h once a cluster: the CS blocks of a cluster (consecutive weight-row blocks, the same batch rows) share each chunk
//   of h. The cluster's first block copies it into every block's slot with one bulk copy (.multicast::cluster), each
//   block's own barrier counting its bytes; before it fills a slot again, every block of the cluster has released the
//   slot on the first block's `empty` barrier (a remote arrive). With 160 blocks each reading h whole (328 KB at blogA)
//   h alone moved 52 MB through L2 a step, as much as the weight (mode_wgmma.cu: 19.4 us against cuBLAS's 16.3).
// - the weight's copies carry an L2 policy: its first `primary` bytes evict_last, the rest evict_first, so a weight
//   past what L2 keeps (52 MB) keeps a part there across steps instead of all of it cycling through DRAM. A kernel that
//   only reads 52 MB took 8.9 us that way against 12.7 with plain loads (benchmarks/probe_l2_resident.py, H200).
//   primary = 0: plain copies.
// Slot layout as mode_wgmma's: the weight's tile, then h's; full[s] counts a block's 16 KB a fill, empty[s] (used on
// the first block only) CS releases a fill. A chunk is released once the MMA of the chunk after it are issued and its
// own are done (wgmma.wait_group 1), and only where the slot is filled again (no remote arrive can then outlive the
// first block); a cluster barrier ends the kernel.
#define RNN_MCAST_BYTES RNN_TILE_BYTES

// The slots (1024-byte aligned, 2 tiles each: the weight's, then h's) and after them two barriers a slot: full (a
// block's 16 KB a fill) and empty (CS releases of a fill, on the first block). Thread 0 initialises them; every
// block of the cluster's are ready when it returns.
template <int CS, int STAGES>
__device__ __forceinline__ unsigned stream_slots(unsigned char* smem, unsigned& full)
{
    const unsigned raw = (unsigned)__cvta_generic_to_shared(smem);
    const unsigned base = raw + ((1024u - (raw & 1023u)) & 1023u);
    full = base + STAGES * 2 * RNN_TILE_BYTES;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s)
            for (int set = 0; set < 2; ++set) rnn_bar_init(full + 8 * (set * STAGES + s), set == 1 ? CS : 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if constexpr (CS > 1) {                      // every block's barriers before any block's copies reach them
        rnn_cluster_sync();
    } else {
        __syncthreads();
    }
    return base;
}

// The L2 policy of the weight's copies: its first `primary` bytes evict_last, the rest evict_first (0: none).
__device__ __forceinline__ unsigned long long stream_policy(const void* weight, unsigned primary, unsigned bytes)
{
    unsigned long long policy = 0;
    if (primary)
        asm volatile("createpolicy.range.L2::evict_last.L2::evict_first.b64 %0, [%1], %2, %3;"
                     : "=l"(policy) : "l"(weight), "r"(primary), "r"(bytes));
    return policy;
}

// This block's release of a slot on the first block's `empty` barrier (a remote arrive).
__device__ __forceinline__ void stream_release(const unsigned empty)
{
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, 0;" : "=r"(remote) : "r"(empty));
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

// One thread: a chunk's weight tile (with the policy where primary) and h's tile into slot `at`, counted on `bar`; in a
// cluster h comes from the first block, which first waits (refill: a chunk past the first STAGES) for the slot's
// release by every block (phase `parity` of `empty`), then multicasts it.
template <int CS>
__device__ __forceinline__ void stream_copies(const unsigned at, const unsigned bar, const unsigned char* w,
                                              const unsigned char* h, const unsigned primary,
                                              const unsigned long long policy, const unsigned rank, const bool refill,
                                              const unsigned empty, const unsigned parity)
{
    rnn_bar_expect(bar, 2 * RNN_TILE_BYTES);
    if (primary) rnn_bulk_copy(at, w, RNN_TILE_BYTES, bar, policy);
    else rnn_bulk_copy(at, w, RNN_TILE_BYTES, bar);
    if constexpr (CS == 1) {
        rnn_bulk_copy(at + RNN_TILE_BYTES, h, RNN_TILE_BYTES, bar);
    } else if (rank == 0) {
        if (refill) {
            unsigned ok;
            do {
                asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                             " selp.u32 %0, 1, 0, p;\n}\n" : "=r"(ok) : "r"(empty), "r"(parity) : "memory");
            } while (!ok);
        }
        const unsigned short mask = (unsigned short)((1u << CS) - 1u);
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
                     "[%0], [%1], %2, [%3], %4;\n"
                     ::"r"(at + RNN_TILE_BYTES), "l"(h), "r"(RNN_MCAST_BYTES), "r"(bar), "h"(mask) : "memory");
    }
}

// The warpgroup's MMA of one chunk in slot `sw` into acc (h's tile is wgmma's A, the weight's B), committed.
template <int MODE>
__device__ __forceinline__ void stream_chunk(float (&acc)[32], const unsigned sw, const int chunk)
{
    rnn_wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < 4; ++kk)
        ModeMma<MODE>::mma(acc, rnn_wgmma_desc(sw + RNN_TILE_BYTES + kk * 32), rnn_wgmma_desc(sw + kk * 32),
                           chunk > 0 || kk > 0);
    rnn_wgmma_commit();
}

template <int MODE, int CS, int STAGES>
__device__ __forceinline__ void mode_stream_body(const unsigned char* __restrict__ operand,
                                                 const unsigned char* __restrict__ weight, float* __restrict__ out,
                                                 const int R, const int N, const int chunks, const unsigned primary,
                                                 const unsigned weight_bytes)
{
    extern __shared__ unsigned char stream_raw[];
    const int tid = threadIdx.x, nb = blockIdx.x, mb = blockIdx.y;
    unsigned rank = 0, full;
    if constexpr (CS > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    const unsigned base = stream_slots<CS, STAGES>(stream_raw, full), empty = full + 8 * STAGES;
    const unsigned char* const w_src = weight + (long)nb * chunks * RNN_TILE_BYTES;
    const unsigned char* const h_src = operand + (long)mb * chunks * RNN_TILE_BYTES;
    const unsigned long long policy = stream_policy(weight, primary, weight_bytes);
    auto fill = [&](const int c) {              // thread 0: chunk c into slot c % STAGES
        const unsigned s = c % STAGES;
        stream_copies<CS>(base + s * 2 * RNN_TILE_BYTES, full + 8 * s, w_src + (long)c * RNN_TILE_BYTES,
                          h_src + (long)c * RNN_TILE_BYTES, primary, policy, rank, c >= STAGES, empty + 8 * s,
                          ((c - STAGES) / STAGES) & 1);
    };
    if (tid == 0)
        for (int c = 0; c < STAGES && c < chunks; ++c) fill(c);
    float acc[32];
    #pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
    for (int chunk = 0; chunk < chunks; ++chunk) {
        rnn_bar_wait(full + 8 * (chunk % STAGES), (chunk / STAGES) & 1);
        stream_chunk<MODE>(acc, base + (chunk % STAGES) * 2 * RNN_TILE_BYTES, chunk);
        rnn_wgmma_wait<1>();                     // chunk - 1's MMA done: its slot is free here
        __syncthreads();
        const int next = chunk - 1 + STAGES;
        if (tid == 0 && chunk > 0 && next < chunks) {
            if constexpr (CS > 1) stream_release(empty + 8 * ((chunk - 1) % STAGES));
            fill(next);
        }
    }
    rnn_wgmma_wait<0>();
    rnn_tile_store(out, R, N, mb, nb, [&](const int i) { return acc[i]; });
    if constexpr (CS > 1) rnn_cluster_sync();   // no block leaves while another may still reach its memory
}

// The entries: NAME, the mode, CS blocks a cluster, STAGES slots. (A variant with a producer warp, which waited for
// the cluster's releases instead of the first block's MMA warpgroup, was no faster: 31-35 us at blogA's LSTM in
// clusters of 2 or 4, 16.2 alone; benchmarks/NOTES.md 2026-11-28 12:16.)
#define MODE_STREAM(NAME, MODE, CS, STAGES)                                                                          \
    extern "C" __global__ void __cluster_dims__(CS, 1, 1) __launch_bounds__(128) NAME(                             \
        const unsigned char* __restrict__ operand, const unsigned char* __restrict__ weight, float* __restrict__ out, \
        const int R, const int N, const int chunks, const unsigned primary, const unsigned weight_bytes)           \
    {                                                                                                               \
        mode_stream_body<MODE, CS, STAGES>(operand, weight, out, R, N, chunks, primary, weight_bytes);              \
    }
MODE_STREAM(mode_stream_bfloat16_1, RNN_BF16, 1, 4)
MODE_STREAM(mode_stream_bfloat16_2, RNN_BF16, 2, 4)
MODE_STREAM(mode_stream_bfloat16_4, RNN_BF16, 4, 4)
MODE_STREAM(mode_stream_float16_1, RNN_FP16, 1, 4)
MODE_STREAM(mode_stream_float16_2, RNN_FP16, 2, 4)
MODE_STREAM(mode_stream_float16_4, RNN_FP16, 4, 4)
#undef MODE_STREAM
