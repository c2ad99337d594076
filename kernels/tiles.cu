// Step operands written into the wgmma step products' tiles by a launch of their own: the initial states' copies, which
// no cell kernel writes (engine/schedules/wgmma_products.py; the cell kernels' copies do the same for later steps,
// engine/codegen/operand_copies.py). tile_gemm.cuh (the roundings, rnn_split_fp16, rnn_tile_at) is inlined before
// this file. Element (b, k) of src (R, K floats, C-contiguous) goes to rnn_tile_at<bytes>(b, k, K); the padding is
// left as it is (zeros: the buffers are made so).

// src (R, K floats, C-contiguous) -> the same parts in the wgmma product's tiles (rnn_tile_at<2>; the lo part after
// the hi part's R rounded up to 64 rows), as the kernels' copy rnn_copy_split_fp16_tiles writes them; the padding is
// left as it is (zeros: engine/schedules/wgmma_products.py tiled_operand).
extern "C" __global__ void split_tiles_fp16(const float* __restrict__ src, unsigned short* __restrict__ dst,
                                            const int R, const int K, unsigned int* __restrict__ range)
{
    const long n = (long)R * K, lo = (long)((R + 63) / 64 * 64) * ((K + 63) / 64 * 64);
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const long b = i / K, at = rnn_tile_at<2>(b, i - b * K, K);
        unsigned short hi, lo_part;
        if (rnn_split_fp16(src[i], hi, lo_part)) *range = 1u;
        dst[at] = hi;
        dst[lo + at] = lo_part;
    }
}

// A reduced mode's operand: v rounded to tf32 (a float), fp16 or bf16 (16-bit patterns), as the kernels' copies
// rnn_copy_tiles_* write it.
#define ROUND_TILES(NAME, T, BYTES, ROUND)                                                                         \
    extern "C" __global__ void NAME(const float* __restrict__ src, T* __restrict__ dst, const int R, const int K) \
    {                                                                                                             \
        const long n = (long)R * K;                                                                               \
        for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {   \
            const long b = i / K;                                                                                 \
            dst[rnn_tile_at<BYTES>(b, i - b * K, K)] = ROUND(src[i]);                                             \
        }                                                                                                         \
    }
#define RNN_ROUND_TF32(v) __uint_as_float(rnn_tf32_bits(v))
ROUND_TILES(round_tiles_tf32, float, 4, RNN_ROUND_TF32)
ROUND_TILES(round_tiles_float16, unsigned short, 2, rnn_bits16<RNN_FP16>)
ROUND_TILES(round_tiles_bfloat16, unsigned short, 2, rnn_bits16<RNN_BF16>)
#undef RNN_ROUND_TF32
#undef ROUND_TILES
