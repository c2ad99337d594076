// One thread block's columns of a step GEMM in the persistent training forward (engine/autodiff/persistent.py):
//
//     Y[b, c] = sum_k X[b, k] * W[c, k]        b < B, c < nc (the block's columns, a few: 8 to 64)
//
// X is (B, K) row-major in global memory, written by other blocks before the last grid barrier: read through L2 only
// (__ldcg), each element by one lane of the block, no staging. W is the block's rows, resident in shared memory (row
// stride ldw, zero rows up to a multiple of CG). Y is B rows of stride ldy (shared memory).
//
// A warp takes a task of RW rows x CG columns (tasks round-robin over the warps); its lanes split K four columns at a
// time (a float4 of X per row, of W per column, 128 columns of K a pass) and keep RW x CG partial sums each. The sums
// are then reduced across the lanes by halves (a transposing butterfly: at each of the 5 steps a lane keeps half of
// its values and adds the other lanes' half of them), so that lane l ends with values 2l and 2l + 1 of the task:
// 62 shuffles for 64 values, not 5 a value. The order of every sum is fixed, so results repeat bit for bit.
// The generic tiled GEMM (rnn_tile_gemms) staged X chunk by chunk with a barrier each and split K between thread
// groups: for a block of 8 columns it issued ~17x the instructions of its multiply-adds (benchmarks/NOTES.md,
// 2026-11-25 03:39).
#ifndef RNN_PERSISTENT_GEMM_CUH
#define RNN_PERSISTENT_GEMM_CUH

// One step of the butterfly: of N values a lane keeps the upper half where its bit `o` is set, else the lower half,
// and adds the partner lane's (lane ^ o) values of the half it keeps: N / 2 values left, indices known when compiled.
template <int N>
__device__ __forceinline__ void rnn_halve(float (&v)[64], int lane, int o)
{
    const bool upper = (lane & o) != 0;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
        const float send = upper ? v[i] : v[i + N / 2];
        const float keep = upper ? v[i + N / 2] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
}

template <int RW, int CG, int K>
__device__ __forceinline__ void rnn_rows_gemm(const float* __restrict__ X, int B, const float* __restrict__ Ws, int ldw,
                                              int nc, float* __restrict__ Y, int ldy)
{
    static_assert(RW * CG == 64, "the butterfly below reduces 64 values a lane");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int row_tasks = (B + RW - 1) / RW, col_tasks = (nc + CG - 1) / CG;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int task = warp; task < row_tasks * col_tasks; task += warps) {
        const int r0 = (task % row_tasks) * RW, c0 = (task / row_tasks) * CG;
        float v[RW * CG];
#pragma unroll
        for (int i = 0; i < RW * CG; ++i) v[i] = 0.0f;
#pragma unroll 2
        for (int k = lane * 4; k < K; k += 128) {
            float4 x[RW], w[CG];
#pragma unroll
            for (int r = 0; r < RW; ++r)
                x[r] = r0 + r < B ? __ldcg(reinterpret_cast<const float4*>(X + (long)(r0 + r) * K + k)) : zero;
#pragma unroll
            for (int c = 0; c < CG; ++c) w[c] = *reinterpret_cast<const float4*>(Ws + (long)(c0 + c) * ldw + k);
#pragma unroll
            for (int r = 0; r < RW; ++r)
#pragma unroll
                for (int c = 0; c < CG; ++c) {
                    float a = v[r * CG + c];
                    a = fmaf(x[r].x, w[c].x, a);
                    a = fmaf(x[r].y, w[c].y, a);
                    a = fmaf(x[r].z, w[c].z, a);
                    v[r * CG + c] = fmaf(x[r].w, w[c].w, a);
                }
        }
        // the transposing butterfly: 64 values -> 32 -> ... -> 2 a lane, lane l holding values 2l and 2l + 1
        rnn_halve<64>(v, lane, 16);
        rnn_halve<32>(v, lane, 8);
        rnn_halve<16>(v, lane, 4);
        rnn_halve<8>(v, lane, 2);
        rnn_halve<4>(v, lane, 1);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int i = 2 * lane + j, r = r0 + i / CG, c = c0 + i % CG;
            if (r < B && c < nc) Y[r * ldy + c] = v[j];
        }
    }
}

// ---- a block that owns whole heads (persistent.py's head-local launches) -------------------------------------------
// Where every step GEMM's weight is block-diagonal by heads, a block that owns a head's units (and a few batch rows)
// needs only that head's columns of X, and no other block's values: the launch has no grid barrier at all. The head's
// columns of K are S runs of KH (the forward's operand h: one run; the backward's dy holds each member's adjoint side
// by side: one run a member), `seg` floats apart in X's rows:
//
//     Y_s[b, c] = sum_{k < KH} X[b, s * seg + k] * W_s[c, k]      b < B (RW-row tasks), c < nc, s < S
//
// each run's partial sums into its own Y_s (Y + s * ys), so that the warps share the runs too (the caller adds the S
// parts in order). X is global, written by this block before the last block barrier: read through L2 (__ldcg), row
// stride ldx, 16-byte aligned (KH, seg and ldx multiples of 4). W_s: nc rows of stride ldw of the mode's weight type
// in shared memory (rnn_load_head_rows), wseg elements apart. Every operand enters its product rounded to MODE
// (rnn_operand4; the weights were rounded when loaded), products summed in fp32 in a fixed order, reduced across the
// lanes by the transposing butterfly above.
template <int MODE, int RW, int CG, int KH, int S>
__device__ __forceinline__ void rnn_head_gemm(const float* __restrict__ X, long ldx, long seg, int B,
                                              const typename RnnWeight<MODE>::type* __restrict__ Ws, int ldw,
                                              long wseg, int nc, float* __restrict__ Y, int ldy, int ys)
{
    static_assert(RW * CG == 64, "the butterfly reduces 64 values a lane");
    static_assert(KH % 4 == 0, "float4 loads of X");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int row_tasks = (B + RW - 1) / RW, col_tasks = (nc + CG - 1) / CG;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int task = warp; task < row_tasks * col_tasks * S; task += warps) {
        const int s = task / (row_tasks * col_tasks), rc = task - s * row_tasks * col_tasks;
        const int r0 = (rc % row_tasks) * RW, c0 = (rc / row_tasks) * CG;
        const float* xs = X + s * seg;
        const typename RnnWeight<MODE>::type* ws = Ws + s * wseg;
        float v[RW * CG];
#pragma unroll
        for (int i = 0; i < RW * CG; ++i) v[i] = 0.0f;
#pragma unroll 2
        for (int k = lane * 4; k < KH; k += 128) {
            float4 x[RW], w[CG];
#pragma unroll
            for (int r = 0; r < RW; ++r)
                x[r] = r0 + r < B ? rnn_operand4<MODE>(__ldcg(reinterpret_cast<const float4*>(xs + (long)(r0 + r) * ldx
                                                                                               + k)))
                                  : zero;
#pragma unroll
            for (int c = 0; c < CG; ++c)
                w[c] = c0 + c < nc ? rnn_weight4<MODE, false>(ws + (long)(c0 + c) * ldw + k) : zero;
#pragma unroll
            for (int r = 0; r < RW; ++r)
#pragma unroll
                for (int c = 0; c < CG; ++c) v[r * CG + c] = rnn_dot4(x[r], w[c], v[r * CG + c]);
        }
        rnn_halve<64>(v, lane, 16);
        rnn_halve<32>(v, lane, 8);
        rnn_halve<16>(v, lane, 4);
        rnn_halve<8>(v, lane, 2);
        rnn_halve<4>(v, lane, 1);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int i = 2 * lane + j, r = r0 + i / CG, c = c0 + i % CG;
            if (r < B && c < nc) Y[s * ys + r * ldy + c] = v[j];
        }
    }
}

// The head's rows of a weight for rnn_head_gemm: rows 0..nc-1 of w (row stride ldw, fp32), the S runs of KH columns
// `seg` apart of each, rounded to MODE (rnn_operand) and stored in its weight type at ws[s * wseg + c * ldr + k], zeros
// past KH (to ldr). Once a launch, before the step loop.
template <int MODE>
__device__ void rnn_load_head_rows(typename RnnWeight<MODE>::type* __restrict__ ws, const float* __restrict__ w,
                                   long ldw, long seg, int KH, int S, int nc, int ldr, long wseg)
{
    for (long i = threadIdx.x; i < (long)S * nc * ldr; i += blockDim.x) {
        const int s = (int)(i / ((long)nc * ldr)), rest = (int)(i - (long)s * nc * ldr), c = rest / ldr,
                  k = rest - c * ldr;
        const float v = k < KH ? rnn_operand<MODE>(__ldg(w + (long)c * ldw + s * seg + k)) : 0.0f;
        if constexpr (MODE == RNN_FP16 || MODE == RNN_BF16) ws[s * wseg + (long)c * ldr + k] = rnn_bits16<MODE>(v);
        else ws[s * wseg + (long)c * ldr + k] = v;
    }
}

// rnn_head_gemm's product on tensor cores, for the 16-bit modes (needs mma_gemm.cuh): mma.sync m16n8k16 with the
// block's weight rows as A (16 rows a tile, ldmatrix from the resident rows, whose stride rnn_wstride keeps 16 bytes
// past a multiple of 32: conflict-free) and the batch rows as B's 8 columns, those past B zero. Same contract, same
// Y_s parts; KH a multiple of 16. A warp takes a contiguous range of (run, 16-row tile) tasks, runs outermost; it
// loads a run's X fragments for all of K at once (one L2 round trip a run, rounded to the mode as they are packed),
// then KH / 16 MMAs a task. The FFMA form
// spent ~2 instructions a multiply-add (the conversion of each bf16 weight): at H = 768 a block's 74 K a step were
// the step's largest part (benchmarks/NOTES.md, 2026-11-27 11:45). Sums are the tensor cores' (fp32 accumulators),
// as in every other 16-bit path of the engine.
template <int MODE, int KH, int S>
__device__ __forceinline__ void rnn_head_mma(const float* __restrict__ X, long ldx, long seg, int B,
                                             const unsigned short* __restrict__ Ws, int ldw, long wseg, int nc,
                                             float* __restrict__ Y, int ldy, int ys)
{
    static_assert(MODE == RNN_FP16 || MODE == RNN_BF16, "16-bit modes only");
    static_assert(KH % 16 == 0, "whole k steps of 16");
    constexpr int KS = KH / 16;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int tiles = (nc + 15) / 16, per = (tiles * S + warps - 1) / warps;
    unsigned b[KS][2];                      // batch row g's X of run `loaded`, k = 16 i + 2q, +1 and 16 i + 2q + 8, +9
    int loaded = -1;
    // a warp's tasks are one run of them, runs outermost: its X fragments load once a run, not once a task
    for (int task = warp * per; task < min((warp + 1) * per, tiles * S); ++task) {
        const int s = task / tiles, m0 = (task - s * tiles) * 16;
        if (s != loaded) {
            const float* xr = X + s * seg + (long)g * ldx + 2 * q;
#pragma unroll
            for (int i = 0; i < KS; ++i) {
                float2 lo = make_float2(0.0f, 0.0f), hi = lo;
                if (g < B) {
                    lo = __ldcg(reinterpret_cast<const float2*>(xr + 16 * i));
                    hi = __ldcg(reinterpret_cast<const float2*>(xr + 16 * i + 8));
                }
                b[i][0] = rnn_bits16<MODE>(lo.x) | ((unsigned)rnn_bits16<MODE>(lo.y) << 16);
                b[i][1] = rnn_bits16<MODE>(hi.x) | ((unsigned)rnn_bits16<MODE>(hi.y) << 16);
            }
            loaded = s;
        }
        const int row = min(m0 + (lane & 15), nc - 1);     // rows past nc compute on row nc - 1, never stored
        const unsigned at = (unsigned)__cvta_generic_to_shared(Ws + s * wseg + (long)row * ldw + 8 * (lane >> 4));
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < KS; ++i) {
            unsigned a[4];
            rnn_ldmatrix4(a[0], a[1], a[2], a[3], at + 32 * i);
            const unsigned bb[2] = {b[i][0], b[i][1]};
            rnn_mma<MODE>(c, a, bb);
        }
        // c0, c1: row m0 + g, batch rows 2q, 2q + 1; c2, c3: row m0 + g + 8, the same batch rows
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int r = 2 * q + (j & 1), col = m0 + g + 8 * (j >> 1);
            if (r < B && col < nc) Y[s * ys + r * ldy + col] = c[j];
        }
    }
}

#endif  // RNN_PERSISTENT_GEMM_CUH
