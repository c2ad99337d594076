// A 16-bit mode's step product for the skinny products of large layers (blogA: h 64 x 2560 by a 2560 x 10240 weight),
// whose weight is streamed every step (engine/schedules/wgmma_products.py mode_product takes mode_wide_*_2_2_4 for a
// weight past the L2; benchmarks/probe_mode_stream.py times every entry through wgmma_products.wide_product; issue
// #34, bf16 / fp16 at blogA; benchmarks/NOTES.md 2026-11-28 11:10, 12:16 and 12:30). Needs tile_gemm.cuh,
// mma_gemm.cuh, wgmma.cuh, mode_mma.cuh, tile_ring.cuh and cluster_sync.cuh before it (the tiles, the barriers and bulk copies, wgmma and its
// descriptors, ModeMma, rnn_tile_store, distributed shared memory and the cluster barrier).
//
//     out (R, N) = h W^T, h (R, K) and W (N, K) fp16 or bf16 in the wgmma products' tiles, fp32 sums
//
// mode_wgmma.cu's block covers 64 weight rows, so each of blogA's 160 blocks reads h whole (328 KB): h moved as many
// bytes through L2 a step as the 52 MB weight. Here a block covers WT weight tiles (64 WT rows) against one chunk of h,
// so h's traffic is 1 / WT of the weight's, and SPLIT blocks of a cluster share one output tile, each over its own
// share of K, to keep every SM pulling the weight. At the end each block leaves its partial sums in its own shared
// memory and block r of the cluster adds the SPLIT partials of the tiles j with j % SPLIT == r over distributed shared
// memory (rnn_cluster_get) and stores them.
//
// Roles: warps 0-3 the MMA warpgroup, warp 4's first lane the copies (a producer warp, 160 threads). The weight's
// copies carry mode_stream.cu's L2 policy (its first `primary` bytes evict_last, the rest evict_first; 0: plain).
// Slot s holds the WT weight tiles then h's; full[s] counts a fill's bytes, done[s] the warpgroup's release of it
// (the MMA of the chunk after it issued and its own done).

template <int MODE, int WT, int SPLIT, int STAGES>
__device__ __forceinline__ void mode_wide_body(const unsigned char* __restrict__ operand,
                                               const unsigned char* __restrict__ weight, float* __restrict__ out,
                                               const int R, const int N, const int chunks, const unsigned primary,
                                               const unsigned weight_bytes)
{
    extern __shared__ unsigned char wide_raw[];
    constexpr unsigned SLOT = (WT + 1) * RNN_TILE_BYTES;
    const int tid = threadIdx.x, mb = blockIdx.y;
    unsigned rank = 0;
    if constexpr (SPLIT > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    const int tile = blockIdx.x / SPLIT;
    const int first = (int)rank * chunks / SPLIT, count = ((int)rank + 1) * chunks / SPLIT - first;
    const unsigned raw = (unsigned)__cvta_generic_to_shared(wide_raw);
    const unsigned base = raw + ((1024u - (raw & 1023u)) & 1023u);
    const unsigned full = base + STAGES * SLOT, done = full + 8 * STAGES;
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            rnn_bar_init(full + 8 * s, 1);
            rnn_bar_init(done + 8 * s, 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    float acc[WT][32];
    if (tid == 128) {                            // the producer
        unsigned long long policy = 0;
        if (primary)
            asm volatile("createpolicy.range.L2::evict_last.L2::evict_first.b64 %0, [%1], %2, %3;"
                         : "=l"(policy) : "l"(weight), "r"(primary), "r"(weight_bytes));
        const unsigned char* const h_src = operand + ((long)mb * chunks + first) * RNN_TILE_BYTES;
        const unsigned char* const w_src = weight + ((long)tile * WT * chunks + first) * RNN_TILE_BYTES;
        for (int c = 0; c < count; ++c) {
            const unsigned s = c % STAGES, at = base + s * SLOT;
            if (c >= STAGES) rnn_bar_wait(done + 8 * s, ((c - STAGES) / STAGES) & 1);
            rnn_bar_expect(full + 8 * s, SLOT);
            #pragma unroll
            for (int j = 0; j < WT; ++j) {
                const unsigned char* const w = w_src + ((long)j * chunks + c) * RNN_TILE_BYTES;
                if (primary) rnn_bulk_copy(at + j * RNN_TILE_BYTES, w, RNN_TILE_BYTES, full + 8 * s, policy);
                else rnn_bulk_copy(at + j * RNN_TILE_BYTES, w, RNN_TILE_BYTES, full + 8 * s);
            }
            rnn_bulk_copy(at + WT * RNN_TILE_BYTES, h_src + (long)c * RNN_TILE_BYTES, RNN_TILE_BYTES, full + 8 * s);
        }
    } else if (tid < 128) {                      // the MMA warpgroup
        #pragma unroll
        for (int j = 0; j < WT; ++j)
            #pragma unroll
            for (int i = 0; i < 32; ++i) acc[j][i] = 0.0f;
        for (int c = 0; c < count; ++c) {
            const unsigned at = base + (c % STAGES) * SLOT;
            rnn_bar_wait(full + 8 * (c % STAGES), (c / STAGES) & 1);
            rnn_wgmma_fence();
            #pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                #pragma unroll
                for (int j = 0; j < WT; ++j)
                    ModeMma<MODE>::mma(acc[j], rnn_wgmma_desc(at + WT * RNN_TILE_BYTES + kk * 32),
                                       rnn_wgmma_desc(at + j * RNN_TILE_BYTES + kk * 32), c > 0 || kk > 0);
            rnn_wgmma_commit();
            rnn_wgmma_wait<1>();
            asm volatile("bar.sync 1, 128;" ::: "memory");     // every warp's MMA of chunk c - 1 done
            if (tid == 0 && c > 0) rnn_bar_arrive(done + 8 * ((c - 1) % STAGES));
        }
        rnn_wgmma_wait<0>();
        if constexpr (SPLIT == 1) {
            #pragma unroll
            for (int j = 0; j < WT; ++j)
                rnn_tile_store(out, R, N, mb, tile * WT + j, [&](const int i) { return acc[j][i]; });
        } else {                                 // the partials into this block's slots (every copy has landed)
            float* const red = reinterpret_cast<float*>(wide_raw + (base - raw));
            #pragma unroll
            for (int j = 0; j < WT; ++j)
                #pragma unroll
                for (int i = 0; i < 32; ++i) red[(j * 32 + i) * 128 + tid] = acc[j][i];
        }
    }
    if constexpr (SPLIT > 1) {
        rnn_cluster_sync();                     // every block's partials written
        if (tid < 128) {
            #pragma unroll
            for (int j = 0; j < WT; ++j) {
                if (j % SPLIT != (int)rank) continue;
                float sum[32];
                #pragma unroll
                for (int i = 0; i < 32; ++i) {
                    const unsigned at = base + 4u * ((j * 32 + i) * 128 + tid);
                    float s = 0.0f;
                    #pragma unroll
                    for (int r = 0; r < SPLIT; ++r) s += __uint_as_float(rnn_cluster_get<unsigned>(at, r));
                    sum[i] = s;
                }
                rnn_tile_store(out, R, N, mb, tile * WT + j, [&](const int i) { return sum[i]; });
            }
        }
        rnn_cluster_sync();                     // no block leaves while another reads its memory
    }
}

// The entries: NAME, the mode, WT weight tiles a block, SPLIT blocks a cluster over K, STAGES slots.
#define MODE_WIDE(NAME, MODE, WT, SPLIT, STAGES)                                                                    \
    extern "C" __global__ void __cluster_dims__(SPLIT, 1, 1) __launch_bounds__(160) NAME(                          \
        const unsigned char* __restrict__ operand, const unsigned char* __restrict__ weight, float* __restrict__ out, \
        const int R, const int N, const int chunks, const unsigned primary, const unsigned weight_bytes)           \
    {                                                                                                               \
        mode_wide_body<MODE, WT, SPLIT, STAGES>(operand, weight, out, R, N, chunks, primary, weight_bytes);         \
    }
#define MODE_WIDE_BOTH(WT, SPLIT, STAGES)                                                                           \
    MODE_WIDE(mode_wide_bfloat16_##WT##_##SPLIT##_##STAGES, RNN_BF16, WT, SPLIT, STAGES)                            \
    MODE_WIDE(mode_wide_float16_##WT##_##SPLIT##_##STAGES, RNN_FP16, WT, SPLIT, STAGES)
MODE_WIDE_BOTH(2, 1, 4)
MODE_WIDE_BOTH(2, 1, 8)
MODE_WIDE_BOTH(2, 2, 4)
MODE_WIDE_BOTH(2, 2, 6)
MODE_WIDE_BOTH(4, 1, 4)
MODE_WIDE_BOTH(4, 2, 2)
MODE_WIDE_BOTH(4, 2, 4)
MODE_WIDE_BOTH(4, 3, 3)
MODE_WIDE_BOTH(4, 4, 2)
MODE_WIDE_BOTH(4, 4, 4)
#undef MODE_WIDE_BOTH
#undef MODE_WIDE
