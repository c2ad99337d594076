// A reduced mode's step product (tf32, fp16, bf16) on Hopper's warpgroup MMA, its operands in tiles staged by bulk
// copies (engine/schedules/wgmma_products.py mode_product; issue #34's tensor-core step kernels). Needs tile_gemm.cuh,
// mma_gemm.cuh, wgmma.cuh, mode_mma.cuh and tile_ring.cuh before it.
//
//     out (R, N) = h W^T, h (R, K) and W (N, K) in the mode's format, fp32 sums
//
// What cuBLAS computes for the fused backend's modes, without cuBLAS's general tiling: a block owns 64 batch rows x
// 64 weight rows (one warpgroup), and its two operands stream through a ring of 8 KB tiles (64 rows x 128 bytes: 64
// columns of a 16-bit mode, 32 of tf32), each K chunk 4 wgmma m64n64 (k16, or k8 in tf32) into one fp32 accumulator
// over all of K, as cuBLAS's accumulate. A chunk's slot is filled again once the next chunk's MMA are issued and
// the chunk's own are done (wgmma.wait_group 1), so the tensor cores always have the next chunk queued. Operands
// laid out as the float32x3 product's (x3_wgmma.cu): blocks of 64 rows, each as Kp / (128 / bytes) tiles, zeros
// past R, N and K.
// ModeMma<MODE>: one m64n64 wgmma of the mode (mode_mma.cuh).

// out (R, N), row-major: rows mb * 64 .., features nb * 64 ..; Rp, Np the rows rounded up to 64; chunks: tiles
// along K.
template <int MODE, int STAGES>
__device__ __forceinline__ void mode_wgmma_body(const void* __restrict__ operand, const void* __restrict__ weight,
                                                float* __restrict__ out, const int R, const int N, const int Rp,
                                                const int Np, const int chunks)
{
    extern __shared__ unsigned char mode_raw[];
    const int tid = threadIdx.x, nb = blockIdx.x, mb = blockIdx.y;
    const long block = (long)chunks * RNN_TILE_BYTES;
    const unsigned char* const src[2] = {static_cast<const unsigned char*>(weight) + nb * block,
                                         static_cast<const unsigned char*>(operand) + mb * block};
    float acc[32];
    #pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
    RnnTileRing<STAGES, 2> ring;
    ring.start(mode_raw, src, chunks, tid == 0);
    for (int chunk = 0; chunk < chunks; ++chunk) {
        ring.wait(chunk);
        const unsigned sw = ring.slot(chunk);
        rnn_wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < 4; ++kk)      // 32 bytes of each row a k step: 16 columns of 16 bits, 8 of tf32
            ModeMma<MODE>::mma(acc, rnn_wgmma_desc(sw + RNN_TILE_BYTES + kk * 32), rnn_wgmma_desc(sw + kk * 32),
                               chunk > 0 || kk > 0);
        rnn_wgmma_commit();
        rnn_wgmma_wait<1>();                // chunk - 1's MMA done: its slot is free
        __syncthreads();
        const int next = chunk - 1 + STAGES;
        if (tid == 0 && chunk > 0 && next < chunks) ring.fill(next, src);
    }
    rnn_wgmma_wait<0>();
    rnn_tile_store(out, R, N, mb, nb, [&](const int i) { return acc[i]; });
}

#define MODE_WGMMA(NAME, MODE, STAGES)                                                                              \
    extern "C" __global__ void __launch_bounds__(128) NAME(const void* __restrict__ operand,                       \
                                                            const void* __restrict__ weight, float* __restrict__ out, \
                                                            const int R, const int N, const int Rp, const int Np,    \
                                                            const int chunks)                                       \
    {                                                                                                               \
        mode_wgmma_body<MODE, STAGES>(operand, weight, out, R, N, Rp, Np, chunks);                                  \
    }
MODE_WGMMA(mode_wgmma_tf32_4, RNN_TF32, 4)
MODE_WGMMA(mode_wgmma_tf32_8, RNN_TF32, 8)
MODE_WGMMA(mode_wgmma_float16_4, RNN_FP16, 4)
MODE_WGMMA(mode_wgmma_float16_8, RNN_FP16, 8)
MODE_WGMMA(mode_wgmma_bfloat16_4, RNN_BF16, 4)
MODE_WGMMA(mode_wgmma_bfloat16_8, RNN_BF16, 8)
#undef MODE_WGMMA
