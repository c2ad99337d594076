// The GEMM part of a fused stage of the training step (engine/autodiff/stage_fusion.py), on one block's units.
//
//     dots[b][c] = sum_k X[b, k] * W[c, k]      b < B, c < nc (the block's columns: its units x the GEMM's members)
//
// X is (B, K) row-major with row stride K (a step's rows of a buffer another launch wrote: read through L2 only);
// W is the block's nc rows, of stride K, of a weight laid out for the stage (a row per column of the block, the
// members of a unit side by side) that never changes during the step. dots is in shared memory, COLS floats a row.
// Batches of 1 or 2 rows take the warp GEMV below (a warp a column, lanes over K), larger ones kernels/tile_gemm.cuh's
// register-tiled GEMM over K chunks staged in `scratch` (stage_fusion.shared_floats sizes it).
// B and K are known at run time only (one compiled module serves every shape), so the templates are dispatched here.
// Every thread of the block calls it; it ends with a barrier, after which dots is complete.
#ifndef RNN_FUSED_STAGE_CUH
#define RNN_FUSED_STAGE_CUH

// The block's columns for BR (1 or 2) rows: warp w takes columns w, w + warps, ... (CW of them), its lanes split K four
// at a time and sum with a butterfly of shuffles (a fixed order: bit-identical run to run). Unlike rnn_warp_gemvs, a
// lane issues every load of a pass, X and all its columns' W, before its first product, the ones past K predicated
// off: a pass waits for one L2 round trip, not one per 128 columns of K (K = 512 took four, ~3 us at `lat`).
// The warp reads K from k_lo to k_hi only (multiples of 4): a stacked GEMM's columns of one member are zero outside it
// (engine/autodiff/fused_plan.py GemmPlan.k_ranges; 0 and K otherwise). Column c's row of W is
// (c % rm) * rd + c / rm + r0: member c % rm of unit c / rm, the members rd rows apart (rm = 1, rd = 0: row c + r0).
template <int BR, int CW>
__device__ __forceinline__ void fused_stage_gemv(const float* __restrict__ X, const float* __restrict__ W, int K, int nc,
                                                 float* __restrict__ dots, int cols, int k_lo, int k_hi, int rm,
                                                 int rd, int r0)
{
    constexpr int KSTEPS = 20 / (BR + CW) > 0 ? 20 / (BR + CW) : 1;    // float4s in flight a lane: 80 floats
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float acc[CW][BR];
    const float* rows[CW];
#pragma unroll
    for (int j = 0; j < CW; ++j) {
        const int c = min(warp + j * warps, nc - 1);
        rows[j] = W + (long)((c % rm) * rd + c / rm + r0) * K;
    }
#pragma unroll
    for (int j = 0; j < CW; ++j)
#pragma unroll
        for (int b = 0; b < BR; ++b) acc[j][b] = 0.0f;
    for (int k0 = k_lo + lane * 4; k0 < k_hi; k0 += 128 * KSTEPS) {
        float4 xv[KSTEPS][BR], wv[KSTEPS][CW];
#pragma unroll
        for (int s = 0; s < KSTEPS; ++s) {
            const int k = k0 + s * 128;
            const bool in = k < k_hi;
#pragma unroll
            for (int b = 0; b < BR; ++b)
                xv[s][b] = in ? __ldcg(reinterpret_cast<const float4*>(X + (long)b * K + k)) : zero;
#pragma unroll
            for (int j = 0; j < CW; ++j)
                wv[s][j] = in ? __ldg(reinterpret_cast<const float4*>(rows[j] + k)) : zero;
        }
#pragma unroll
        for (int s = 0; s < KSTEPS; ++s)
#pragma unroll
            for (int j = 0; j < CW; ++j)
#pragma unroll
                for (int b = 0; b < BR; ++b) acc[j][b] = rnn_dot4(xv[s][b], wv[s][j], acc[j][b]);
    }
#pragma unroll
    for (int j = 0; j < CW; ++j) {
        const int c = warp + j * warps;
#pragma unroll
        for (int b = 0; b < BR; ++b) {
            float v = acc[j][b];
#pragma unroll
            for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
            if (lane == 0 && c < nc) dots[b * cols + c] = v;
        }
    }
}

// COLS = the block's columns (units x members, a row of W each): Y (B, COLS) in `dots`. TILED: the tiled form is
// compiled in (stage_fusion.FUSE_MAX_ROWS > 2); without it a launch of more than 2 rows is a bug of the caller
// (stage_fusion.fuses never sends one), and traps rather than leave dots unwritten.
// W with rm, rd, r0: as fused_stage_gemv reads it; the tiled GEMM takes the block's nc rows as one run (rm = 1, rd = 0,
// r0 = 0: the weight laid out interleaved, W at the block's first row).
template <int COLS, int THREADS, int RB, int RC, int KC, int STAGES, bool TILED>
__device__ void fused_stage_gemm(const float* __restrict__ X, const float* __restrict__ W, int K, int B, int nc,
                                 float* __restrict__ dots, float* __restrict__ scratch, int k_lo, int k_hi, int rm,
                                 int rd, int r0)
{
    // K is a multiple of 4 (stage_fusion.fuses): every row starts 16-byte aligned and is read 16 bytes at a time
    if (B <= 2) {
        constexpr int WARPS = THREADS / 32, CW = (COLS + WARPS - 1) / WARPS;          // columns a warp
        if (B == 1) fused_stage_gemv<1, CW>(X, W, K, nc, dots, COLS, k_lo, k_hi, rm, rd, r0);
        else fused_stage_gemv<2, CW>(X, W, K, nc, dots, COLS, k_lo, k_hi, rm, rd, r0);
        __syncthreads();
        return;
    }
    if constexpr (TILED) {
        const RnnGemm job[1] = {{X, W, nullptr, dots, (long)COLS, nullptr, K, nc, COLS}};
        rnn_tile_gemms<RB, RC, 4, STAGES, KC, 1>(job, B, scratch, COLS);
    } else {
        __trap();
    }
}

#endif  // RNN_FUSED_STAGE_CUH
