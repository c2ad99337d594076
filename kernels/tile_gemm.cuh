// One thread block's slice of a recurrent GEMM, for the wavefront schedules (engine/schedules).
//
//     Y[b, c] = sum_k X[b, k] * W[c, k]  (+ bias[c])      b < B, c < NC
//
// X is a (B, K) row-major operand in global memory that other blocks of the same launch may have
// written (h_{t-1}, a previous layer's output): it is read through L2 with __ldcg, never through
// the non-coherent read-only path. W is the block's NC rows of a packed weight (N, K), read-only
// for the whole run: either resident in shared memory, transposed as Ws[k * ncp + c] with ncp the
// padded NC (zeros past NC), or in global memory, staged chunk by chunk. Y is global.
//
// Threads: output groups of RB rows x RC columns, held in registers. When a block has more
// threads than groups, the K range is split among them and the partial sums are reduced through
// shared memory (the small-batch case: B = 1 has 1 row and 4..64 columns per block). When it has
// fewer, each thread takes several groups in turn. RB and RC are compile-time, so the inner loop
// is fully unrolled and the accumulators stay in registers.
//
// Shared memory (floats): xs KC * bp, ws KC * ncp (only when W is not resident), red blockDim * RB * RC.
#ifndef RNN_TILE_GEMM_CUH
#define RNN_TILE_GEMM_CUH

__device__ __forceinline__ int rnn_round_up(int value, int multiple) { return (value + multiple - 1) / multiple * multiple; }

// Copies the block's NC rows of W (N, K), starting at row c0, into shared memory as Ws[k * ncp + c].
__device__ void rnn_load_resident(float* __restrict__ ws, const float* __restrict__ w, long ldw, int K, int NC, int ncp)
{
    for (int i = threadIdx.x; i < K * ncp; i += blockDim.x) {
        const int c = i / K;             // consecutive threads read consecutive k of one row: coalesced
        const int k = i - c * K;
        ws[k * ncp + c] = c < NC ? __ldg(w + (long)c * ldw + k) : 0.0f;
    }
}

template <int RB, int RC>
__device__ void rnn_tile_gemm(const float* __restrict__ X, long ldx, int B, int K,
                              const float* __restrict__ Wg, long ldw, const float* __restrict__ Ws, int NC,
                              float* __restrict__ Y, long ldy, const float* __restrict__ bias,
                              float* __restrict__ smem, int KC)
{
    const int bp = rnn_round_up(B, RB);
    const int ncp = rnn_round_up(NC, RC);
    float* xs = smem;                                  // (KC, bp): X chunk, transposed
    float* ws = xs + KC * bp;                          // (KC, ncp): W chunk when not resident
    float* red = ws + (Ws ? 0 : KC * ncp);             // (blockDim, RB * RC): split-K partial sums
    const int nbg = bp / RB, ncg = ncp / RC;
    const int groups = nbg * ncg;
    const int split = groups >= (int)blockDim.x ? 1 : (int)blockDim.x / groups;
    const int passes = split > 1 ? 1 : (groups + blockDim.x - 1) / blockDim.x;
    for (int pass = 0; pass < passes; ++pass) {
        const int slot = split > 1 ? (int)threadIdx.x % groups : pass * (int)blockDim.x + (int)threadIdx.x;
        const int part = split > 1 ? (int)threadIdx.x / groups : 0;
        const bool active = slot < groups && part < split;
        const int cg = slot % ncg, bg = slot / ncg;
        float acc[RB][RC];
#pragma unroll
        for (int r = 0; r < RB; ++r)
#pragma unroll
            for (int c = 0; c < RC; ++c) acc[r][c] = 0.0f;
        for (int k0 = 0; k0 < K; k0 += KC) {
            const int kc = min(KC, K - k0);
            __syncthreads();                           // the previous chunk is no longer read
            for (int i = threadIdx.x; i < bp * kc; i += blockDim.x) {
                const int b = i / kc, k = i - b * kc;
                xs[k * bp + b] = b < B ? __ldcg(X + (long)b * ldx + k0 + k) : 0.0f;
            }
            if (!Ws) {
                for (int i = threadIdx.x; i < ncp * kc; i += blockDim.x) {
                    const int c = i / kc, k = i - c * kc;
                    ws[k * ncp + c] = c < NC ? __ldg(Wg + (long)c * ldw + k0 + k) : 0.0f;
                }
            }
            __syncthreads();
            const float* w = Ws ? Ws + (long)k0 * ncp : ws;
            if (active) {
                for (int k = part; k < kc; k += split) {
                    float xv[RB], wv[RC];
#pragma unroll
                    for (int r = 0; r < RB; ++r) xv[r] = xs[k * bp + bg * RB + r];
#pragma unroll
                    for (int c = 0; c < RC; ++c) wv[c] = w[k * ncp + cg * RC + c];
#pragma unroll
                    for (int r = 0; r < RB; ++r)
#pragma unroll
                        for (int c = 0; c < RC; ++c) acc[r][c] = fmaf(xv[r], wv[c], acc[r][c]);
                }
            }
        }
        if (split > 1) {
            // Partial sums of the K parts, reduced in a fixed order: the result is bit-identical run to run.
            if (active) {
#pragma unroll
                for (int r = 0; r < RB; ++r)
#pragma unroll
                    for (int c = 0; c < RC; ++c) red[(part * groups + slot) * RB * RC + r * RC + c] = acc[r][c];
            }
            __syncthreads();
            if (active && part == 0) {
                for (int p = 1; p < split; ++p) {
#pragma unroll
                    for (int r = 0; r < RB; ++r)
#pragma unroll
                        for (int c = 0; c < RC; ++c) acc[r][c] += red[(p * groups + slot) * RB * RC + r * RC + c];
                }
            }
        }
        if (active && part == 0) {
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                const int b = bg * RB + r;
#pragma unroll
                for (int c = 0; c < RC; ++c) {
                    const int col = cg * RC + c;
                    if (b < B && col < NC) Y[(long)b * ldy + col] = acc[r][c] + (bias ? __ldg(bias + col) : 0.0f);
                }
            }
        }
    }
    __syncthreads();                                   // Y is complete for the whole block
}

#endif  // RNN_TILE_GEMM_CUH
