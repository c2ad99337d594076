// A ring of shared-memory slots that bulk copies fill with 8 KB tiles (64 rows x 128 bytes, already in wgmma's
// 128-byte swizzle in global memory: kernels/tile_gemm.cuh rnn_tile_at, engine/schedules/wgmma_products.py), for the
// wgmma step products (kernels/x3_wgmma.cu, kernels/mode_wgmma.cu). Needs mma_gemm.cuh's barriers and bulk copies.
//
// A slot holds one K chunk of TILES tiles (one of each operand); its mbarrier counts thread 0's expected bytes and
// completes when they have landed. Chunk c sits in slot c % STAGES, its fill the (c / STAGES)-th of that slot, so
// waiting for it waits on the parity (c / STAGES) % 2. `src[m]` is operand m's first tile of the block's rows; its
// tiles along K follow each other (8 KB apart). The ring starts 1024-byte aligned (the swizzle's unit); the barriers
// sit after the slots.
#ifndef RNN_TILE_RING_CUH
#define RNN_TILE_RING_CUH

#define RNN_TILE_BYTES 8192

template <int STAGES, int TILES>
struct RnnTileRing {
    unsigned base, bars;
    int step = 1;                // tiles from one chunk of an operand to the next this ring takes

    // The leader (thread 0 by default) initialises the barriers; every thread of the block meets before the first
    // fill (each ring of a block is initialised by all its threads together).
    __device__ __forceinline__ void init(unsigned char* smem, const bool leader)
    {
        const unsigned raw = (unsigned)__cvta_generic_to_shared(smem);
        base = raw + ((1024u - (raw & 1023u)) & 1023u);
        bars = base + STAGES * TILES * RNN_TILE_BYTES;
        if (leader) {
            for (int s = 0; s < STAGES; ++s) rnn_bar_init(bars + 8 * s, 1);
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncthreads();
    }
    __device__ __forceinline__ void init(unsigned char* smem) { init(smem, threadIdx.x == 0); }
    // init, then the leader fills the first slots with chunks 0 .. (at most `chunks` of them).
    __device__ __forceinline__ void start(unsigned char* smem, const unsigned char* const (&src)[TILES], const int chunks,
                                          const bool leader)
    {
        init(smem, leader);
        if (leader)
            for (int c = 0; c < STAGES && c < chunks; ++c) fill(c, src);
    }
    __device__ __forceinline__ unsigned slot(const int chunk) const
    {
        return base + (chunk % STAGES) * TILES * RNN_TILE_BYTES;
    }
    // The leader only: chunk's tiles into its slot (the slot's previous chunk must be done with).
    __device__ __forceinline__ void fill(const int chunk, const unsigned char* const (&src)[TILES]) const
    {
        const unsigned bar = bars + 8 * (chunk % STAGES), at = slot(chunk);
        rnn_bar_expect(bar, TILES * RNN_TILE_BYTES);
        #pragma unroll
        for (int m = 0; m < TILES; ++m)
            rnn_bulk_copy(at + m * RNN_TILE_BYTES, src[m] + (long)chunk * step * RNN_TILE_BYTES, RNN_TILE_BYTES, bar);
    }
    __device__ __forceinline__ void wait(const int chunk) const
    {
        rnn_bar_wait(bars + 8 * (chunk % STAGES), (chunk / STAGES) & 1);
    }
};

// Stores a warpgroup's m64n64 fp32 result into out (R, N), row-major: its rows mb * 64 .., columns nb * 64 .., those
// inside R x N; value(i) is accumulator element i (wgmma.cuh's layout: warp q's rows 16 q + g and + 8, for each
// 8-column group j the columns 8 j + 2 t and + 1 at elements 4 j .. 4 j + 3). The first warpgroup's threads call it.
template <typename Value>
__device__ __forceinline__ void rnn_tile_store(float* __restrict__ out, const int R, const int N, const int mb,
                                               const int nb, const Value& value)
{
    const int tid = threadIdx.x, q = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = mb * 64 + q * 16 + g + 8 * half;
        if (row >= R) continue;
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int n = nb * 64 + 8 * j + 2 * t;
            const int i = 4 * j + 2 * half;
            if (n < N) out[(long)row * N + n] = value(i);
            if (n + 1 < N) out[(long)row * N + n + 1] = value(i + 1);
        }
    }
}

// The dynamic shared memory a ring takes: its slots, the barriers, and the slack that aligns it.
#define RNN_TILE_RING_BYTES(STAGES, TILES) ((STAGES) * (TILES) * RNN_TILE_BYTES + 8 * (STAGES) + 1024)

#endif  // RNN_TILE_RING_CUH
