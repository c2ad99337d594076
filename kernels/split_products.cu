// float32x3 in the fused backend (engine/schedules/split_products.py): an operand split into its two 11-bit parts
// (TF32 values in fp32, or fp16 values with lo times 2^11), stacked, and the fold that sums the parts' products. tile_gemm.cuh (rnn_tf32_bits: cvt.rna, the kernels' own
// rounding, which engine/rounding.py emulates) is inlined before this file.
//
// A step's product multiplies the operand's parts stacked as rows, [hi; lo] (2R x K), by W_hi (N x K) in C chunks of K
// (a chunk's products summed in one tensor-core accumulator) into P1 (C, 2R, N), and hi by W_lo (N x K) into P2
// (R, N) after it; row-major. For row r < R and column n < N of chunk c:
//   P1_c[r][n] = hi W_hi,   P1_c[R + r][n] = lo W_hi,   P2[r][n] = hi W_lo.

// src (n4 groups of 4 floats, C-contiguous) -> dst[0 .. 4 n4) = hi = tf32(v), dst[4 n4 .. 8 n4) = lo = tf32(v - hi):
// the operand's copy as the kernels write it (engine/codegen/operand_copies.py), for the values no kernel wrote (the
// states of step 0, the projections' inputs). v - hi is exact in fp32; Inf and NaN give a NaN lo.
extern "C" __global__ void split_contiguous_tf32(const float4* __restrict__ src, float4* __restrict__ dst, const long n4)
{
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x) {
        const float4 v = src[i];
        const float4 hi = make_float4(__uint_as_float(rnn_tf32_bits(v.x)), __uint_as_float(rnn_tf32_bits(v.y)),
                                      __uint_as_float(rnn_tf32_bits(v.z)), __uint_as_float(rnn_tf32_bits(v.w)));
        dst[i] = hi;
        dst[n4 + i] = make_float4(__uint_as_float(rnn_tf32_bits(v.x - hi.x)), __uint_as_float(rnn_tf32_bits(v.y - hi.y)),
                                  __uint_as_float(rnn_tf32_bits(v.z - hi.z)), __uint_as_float(rnn_tf32_bits(v.w - hi.w)));
    }
}

// src (n floats, C-contiguous) -> dst[0 .. n) = hi = fp16(tf32(v)), dst[n .. 2n) = lo = fp16(tf32(v - hi) * 2^11), lo
// from hi as stored: float32x3's parts held as fp16 (x3_parts="fp16"; engine/rounding.py split_fp16, the kernels' copy
// rnn_copy_split_fp16). A value past fp16's range (|v| > 65504) sets *range.
extern "C" __global__ void split_contiguous_fp16(const float* __restrict__ src, unsigned short* __restrict__ dst,
                                                 const long n, unsigned int* __restrict__ range)
{
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        unsigned short hi, lo;
        if (rnn_split_fp16(src[i], hi, lo)) *range = 1u;
        dst[i] = hi;
        dst[n + i] = lo;
    }
}

// out (R, N) = (hi W_lo + the sum over chunks of lo W_hi) * scale + the sum over chunks of hi W_hi: the small products
// first, in fp32, as the schedules' split MMAs add them (engine/codegen/precision.py); scale: 1, or 2^-11 for fp16
// parts (their lo parts carry 2^11; a power of two, so the product is exact). One thread an element of out, its C
// chunks in a loop.
extern "C" __global__ void fold_x3(const float* __restrict__ P, float* __restrict__ out, const int R, const int N,
                                   const int C, const float scale)
{
    const long total = (long)R * N;
    const long chunk = 2L * R * N;          // one chunk's P1_c
    for (long idx = (long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (long)gridDim.x * blockDim.x) {
        const float* p = P + idx;           // P1_0[r][n]: row r of N columns, idx = r N + n
        float small = P[C * chunk + idx], big = 0.0f;
        for (int c = 0; c < C; ++c, p += chunk) {
            small += p[total];              // P1_c[R + r][n]
            big += p[0];
        }
        out[idx] = small * scale + big;
    }
}
