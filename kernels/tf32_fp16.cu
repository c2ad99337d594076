// tf32's step operand held as fp16 (engine/schedules/tf32_fp16.py): src (n floats, C-contiguous) -> dst (n fp16) =
// fp16(tf32(v) * 2^10), the copy the cell's kernels write (engine/codegen/operand_copies.py rnn_copy_tf32_fp16), for
// the values no kernel wrote (the states of step 0). A value past the copy's range sets *range. tile_gemm.cuh
// (rnn_tf32_fp16) is inlined before this file.
extern "C" __global__ void round_tf32_fp16(const float* __restrict__ src, unsigned short* __restrict__ dst, const long n,
                                           unsigned int* __restrict__ range)
{
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        unsigned short h;
        if (rnn_tf32_fp16(src[i], h)) *range = 1u;
        dst[i] = h;
    }
}
