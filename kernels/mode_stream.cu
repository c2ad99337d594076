// A 16-bit mode's step product for the skinny products of large layers (blogA: h 64 x 2560 by a 2560 x 10240 weight),
// whose weight is streamed every step (engine/schedules/wgmma_products.py stream_product; issue #34, bf16 / fp16 at
// blogA; benchmarks/NOTES.md 2026-11-28 11:10). Needs tile_gemm.cuh, mma_gemm.cuh, wgmma.cuh and tile_ring.cuh before
// it (the tiles, the barriers and bulk copies, wgmma and its descriptors, rnn_tile_store).
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

template <int MODE, int CS, int STAGES>
__device__ __forceinline__ void mode_stream_body(const unsigned char* __restrict__ operand,
                                                 const unsigned char* __restrict__ weight, float* __restrict__ out,
                                                 const int R, const int N, const int chunks, const unsigned primary,
                                                 const unsigned weight_bytes)
{
    extern __shared__ unsigned char stream_raw[];
    const int tid = threadIdx.x, nb = blockIdx.x, mb = blockIdx.y;
    unsigned rank = 0;
    if constexpr (CS > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    const unsigned raw = (unsigned)__cvta_generic_to_shared(stream_raw);
    const unsigned base = raw + ((1024u - (raw & 1023u)) & 1023u);
    const unsigned full = base + STAGES * 2 * RNN_TILE_BYTES, empty = full + 8 * STAGES;
    const unsigned char* const w_src = weight + (long)nb * chunks * RNN_TILE_BYTES;
    const unsigned char* const h_src = operand + (long)mb * chunks * RNN_TILE_BYTES;
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            rnn_bar_init(full + 8 * s, 1);
            rnn_bar_init(empty + 8 * s, CS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if constexpr (CS > 1) {                      // every block's barriers before any block's copies reach them
        asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
    } else {
        __syncthreads();
    }
    unsigned long long policy = 0;
    if (primary)
        asm volatile("createpolicy.range.L2::evict_last.L2::evict_first.b64 %0, [%1], %2, %3;"
                     : "=l"(policy) : "l"(weight), "r"(primary), "r"(weight_bytes));
    // thread 0: chunk c's copies into slot c % STAGES (after the slot's previous chunk is released everywhere)
    auto fill = [&](const int c) {
        const unsigned s = c % STAGES, at = base + s * 2 * RNN_TILE_BYTES, bar = full + 8 * s;
        rnn_bar_expect(bar, 2 * RNN_TILE_BYTES);
        if (primary) rnn_bulk_copy(at, w_src + (long)c * RNN_TILE_BYTES, RNN_TILE_BYTES, bar, policy);
        else rnn_bulk_copy(at, w_src + (long)c * RNN_TILE_BYTES, RNN_TILE_BYTES, bar);
        if constexpr (CS == 1) {
            rnn_bulk_copy(at + RNN_TILE_BYTES, h_src + (long)c * RNN_TILE_BYTES, RNN_TILE_BYTES, bar);
        } else if (rank == 0) {
            if (c >= STAGES) {                   // chunk c - STAGES released by every block of the cluster
                const unsigned e = empty + 8 * s, parity = ((c - STAGES) / STAGES) & 1;
                unsigned done;
                do {
                    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                                 " selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(e), "r"(parity) : "memory");
                } while (!done);
            }
            const unsigned short mask = (unsigned short)((1u << CS) - 1u);
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
                         "[%0], [%1], %2, [%3], %4;\n"
                         ::"r"(at + RNN_TILE_BYTES), "l"(h_src + (long)c * RNN_TILE_BYTES), "r"(RNN_MCAST_BYTES),
                         "r"(bar), "h"(mask) : "memory");
        }
    };
    if (tid == 0)
        for (int c = 0; c < STAGES && c < chunks; ++c) fill(c);
    float acc[32];
    #pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
    for (int chunk = 0; chunk < chunks; ++chunk) {
        rnn_bar_wait(full + 8 * (chunk % STAGES), (chunk / STAGES) & 1);
        const unsigned sw = base + (chunk % STAGES) * 2 * RNN_TILE_BYTES;
        rnn_wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            ModeMma<MODE>::mma(acc, rnn_wgmma_desc(sw + RNN_TILE_BYTES + kk * 32), rnn_wgmma_desc(sw + kk * 32),
                               chunk > 0 || kk > 0);
        rnn_wgmma_commit();
        rnn_wgmma_wait<1>();                     // chunk - 1's MMA done: its slot is free here
        __syncthreads();
        const int next = chunk - 1 + STAGES;
        if (tid == 0 && chunk > 0 && next < chunks) {
            if constexpr (CS > 1) {              // released on the first block's barrier, then refilled
                unsigned remote;
                asm volatile("mapa.shared::cluster.u32 %0, %1, 0;" : "=r"(remote) : "r"(empty + 8 * ((chunk - 1) % STAGES)));
                asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
            }
            fill(next);
        }
    }
    rnn_wgmma_wait<0>();
    rnn_tile_store(out, R, N, mb, nb, [&](const int i) { return acc[i]; });
    if constexpr (CS > 1)                        // no block leaves while another may still reach its memory
        asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// The same product with a producer warp (warp 4 of 160 threads): the copies and the cluster's releases wait there, so
// the first block's warpgroup never waits on the other blocks before its next MMA (above, its thread 0 does, between
// two chunks). The consumer warpgroup releases a chunk on its own block's `done` barrier once the MMA of the chunk
// after it are issued and its own are done; the producer waits for that before refilling the slot, and in a cluster
// passes the release on to the first block's `empty` barrier, whose producer waits for all CS before the multicast.
template <int MODE, int CS, int STAGES>
__device__ __forceinline__ void mode_stream_ws_body(const unsigned char* __restrict__ operand,
                                                    const unsigned char* __restrict__ weight, float* __restrict__ out,
                                                    const int R, const int N, const int chunks, const unsigned primary,
                                                    const unsigned weight_bytes)
{
    extern __shared__ unsigned char stream_raw[];
    const int tid = threadIdx.x, nb = blockIdx.x, mb = blockIdx.y;
    unsigned rank = 0;
    if constexpr (CS > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    const unsigned raw = (unsigned)__cvta_generic_to_shared(stream_raw);
    const unsigned base = raw + ((1024u - (raw & 1023u)) & 1023u);
    const unsigned full = base + STAGES * 2 * RNN_TILE_BYTES, empty = full + 8 * STAGES, done = empty + 8 * STAGES;
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            rnn_bar_init(full + 8 * s, 1);
            rnn_bar_init(empty + 8 * s, CS);
            rnn_bar_init(done + 8 * s, 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if constexpr (CS > 1) {
        asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
    } else {
        __syncthreads();
    }
    if (tid >= 128) {                            // the producer warp: its first lane issues everything
        if (tid == 128) {
            const unsigned char* const w_src = weight + (long)nb * chunks * RNN_TILE_BYTES;
            const unsigned char* const h_src = operand + (long)mb * chunks * RNN_TILE_BYTES;
            unsigned long long policy = 0;
            if (primary)
                asm volatile("createpolicy.range.L2::evict_last.L2::evict_first.b64 %0, [%1], %2, %3;"
                             : "=l"(policy) : "l"(weight), "r"(primary), "r"(weight_bytes));
            for (int c = 0; c < chunks; ++c) {
                const unsigned s = c % STAGES, at = base + s * 2 * RNN_TILE_BYTES, bar = full + 8 * s;
                const unsigned parity = ((c - STAGES) / STAGES) & 1;
                if (c >= STAGES) {
                    rnn_bar_wait(done + 8 * s, parity);          // this block's MMA of chunk c - STAGES are done
                    if constexpr (CS > 1) {
                        unsigned remote;
                        asm volatile("mapa.shared::cluster.u32 %0, %1, 0;" : "=r"(remote) : "r"(empty + 8 * s));
                        asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote)
                                     : "memory");
                    }
                }
                rnn_bar_expect(bar, 2 * RNN_TILE_BYTES);
                if (primary) rnn_bulk_copy(at, w_src + (long)c * RNN_TILE_BYTES, RNN_TILE_BYTES, bar, policy);
                else rnn_bulk_copy(at, w_src + (long)c * RNN_TILE_BYTES, RNN_TILE_BYTES, bar);
                if constexpr (CS == 1) {
                    rnn_bulk_copy(at + RNN_TILE_BYTES, h_src + (long)c * RNN_TILE_BYTES, RNN_TILE_BYTES, bar);
                } else if (rank == 0) {
                    if (c >= STAGES) {                           // ... and every block's of the cluster
                        unsigned ok;
                        do {
                            asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 "
                                         "p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                                         : "=r"(ok) : "r"(empty + 8 * s), "r"(parity) : "memory");
                        } while (!ok);
                    }
                    const unsigned short mask = (unsigned short)((1u << CS) - 1u);
                    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
                                 "[%0], [%1], %2, [%3], %4;\n"
                                 ::"r"(at + RNN_TILE_BYTES), "l"(h_src + (long)c * RNN_TILE_BYTES),
                                 "r"(RNN_MCAST_BYTES), "r"(bar), "h"(mask) : "memory");
                }
            }
        }
    } else {                                     // the consumer warpgroup
        float acc[32];
        #pragma unroll
        for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
        for (int chunk = 0; chunk < chunks; ++chunk) {
            rnn_bar_wait(full + 8 * (chunk % STAGES), (chunk / STAGES) & 1);
            const unsigned sw = base + (chunk % STAGES) * 2 * RNN_TILE_BYTES;
            rnn_wgmma_fence();
            #pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                ModeMma<MODE>::mma(acc, rnn_wgmma_desc(sw + RNN_TILE_BYTES + kk * 32), rnn_wgmma_desc(sw + kk * 32),
                                   chunk > 0 || kk > 0);
            rnn_wgmma_commit();
            rnn_wgmma_wait<1>();
            asm volatile("bar.sync 1, 128;" ::: "memory");     // every warp's MMA of chunk - 1 done
            if (tid == 0 && chunk > 0) rnn_bar_arrive(done + 8 * ((chunk - 1) % STAGES));
        }
        rnn_wgmma_wait<0>();
        rnn_tile_store(out, R, N, mb, nb, [&](const int i) { return acc[i]; });
    }
    if constexpr (CS > 1)
        asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

#define MODE_STREAM_WS(NAME, MODE, CS, STAGES)                                                                      \
    extern "C" __global__ void __cluster_dims__(CS, 1, 1) __launch_bounds__(160) NAME(                             \
        const unsigned char* __restrict__ operand, const unsigned char* __restrict__ weight, float* __restrict__ out, \
        const int R, const int N, const int chunks, const unsigned primary, const unsigned weight_bytes)           \
    {                                                                                                               \
        mode_stream_ws_body<MODE, CS, STAGES>(operand, weight, out, R, N, chunks, primary, weight_bytes);           \
    }
MODE_STREAM_WS(mode_stream_ws_bfloat16_1, RNN_BF16, 1, 4)
MODE_STREAM_WS(mode_stream_ws_bfloat16_2, RNN_BF16, 2, 4)
MODE_STREAM_WS(mode_stream_ws_bfloat16_4, RNN_BF16, 4, 4)
MODE_STREAM_WS(mode_stream_ws_float16_1, RNN_FP16, 1, 4)
MODE_STREAM_WS(mode_stream_ws_float16_2, RNN_FP16, 2, 4)
MODE_STREAM_WS(mode_stream_ws_float16_4, RNN_FP16, 4, 4)
#undef MODE_STREAM_WS

#define MODE_STREAM(NAME, MODE, CS, STAGES)                                                                         \
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
