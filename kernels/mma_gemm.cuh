// The recurrent GEMMs of one stage on tensor cores, for the precision modes tf32, fp16 and bf16
// (engine/codegen/precision.py); needs tile_gemm.cuh (modes, rounding, RnnGemmT, cp.async).
//
//     Y[b, c] = sum_k X[b, k] * W[c, k]  (+ bias[c])      b < B, c < NC
//
// The same contract as rnn_tile_gemms: every GEMM of a stage in one call, X (fp32, written by other
// blocks) staged in chunks of KC columns through a STAGES-deep cp.async pipeline, W resident in shared
// memory or staged beside X; fixed-order split-K reduction, so runs are bit-identical. What differs:
//
// - the product is mma.sync (PTX ISA, "Warp-level matrix multiply-accumulate instructions"):
//   m16n8k8 with .tf32 operands, or m16n8k16 with .f16 / .bf16 operands, fp32 accumulators;
// - the unit of work is a warp, not a thread: a warp holds a WM x WN grid of 16 x 8 accumulator tiles
//   (rows of the batch x columns of W), its A fragments loaded once per k step and used WN times;
// - X stays fp32 in shared memory and is rounded as its fragments are loaded (cvt.rna.tf32.f32, or
//   cvt.rn.{f16,bf16}x2.f32 of two neighbours), W is stored already rounded (tf32 values as floats,
//   fp16/bf16 as 16-bit patterns): the same rounding as rnn_operand, so the GEMV path of few rows and
//   this one compute the same function.
//
// Fragment layouts (PTX ISA, mma.m16n8k8 / m16n8k16, .row.col), with g = lane / 4 and t = lane % 4:
//   A (16 x KS, row-major X rows):  tf32: a0 (g, t) a1 (g+8, t) a2 (g, t+4) a3 (g+8, t+4)
//                                   16-bit: pairs a0 (g, 2t..2t+1) a1 (g+8, ..) a2 (g, 2t+8..) a3 (g+8, 2t+8..)
//   B (KS x 8, W rows = columns n): tf32: b0 (k=t, n=g) b1 (k=t+4, n=g); 16-bit: pairs b0 (k=2t.., g) b1 (k=2t+8.., g)
//   C (16 x 8):                     c0, c1 (g, 2t..2t+1)  c2, c3 (g+8, 2t..2t+1)
// Row strides (tile_gemm.cuh rnn_wstride, rnn_xstride below) put the 8 rows of a fragment in 8 bank groups.
#ifndef RNN_MMA_GEMM_CUH
#define RNN_MMA_GEMM_CUH

template <int MODE> struct RnnMma { static constexpr int KS = 16; };     // K of one MMA: fp16, bf16
template <> struct RnnMma<RNN_TF32> { static constexpr int KS = 8; };

// Floats between rows of a staged X chunk of kc columns: tf32 reads single floats (a stride of 4 mod 8
// spreads 8 rows x 4 columns over 32 banks), fp16/bf16 read pairs (8 mod 16: 4 rows x 4 pairs a phase).
template <int MODE>
__host__ __device__ constexpr int rnn_xstride(int kc) { return MODE == RNN_TF32 ? rnn_round_up(kc, 8) + 4 : rnn_round_up(kc, 16) + 8; }

__device__ __forceinline__ unsigned rnn_pack2(float lo, float hi, int mode)
{
    unsigned r;
    if (mode == RNN_FP16) asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    else asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// A fragment of rows [0, 16) and columns [0, KS) of x (fp32, row stride ldx), rounded to the mode.
template <int MODE>
__device__ __forceinline__ void rnn_frag_a(unsigned (&a)[4], const float* x, int ldx, int g, int t)
{
    if constexpr (MODE == RNN_TF32) {
        a[0] = rnn_tf32_bits(x[g * ldx + t]);
        a[1] = rnn_tf32_bits(x[(g + 8) * ldx + t]);
        a[2] = rnn_tf32_bits(x[g * ldx + t + 4]);
        a[3] = rnn_tf32_bits(x[(g + 8) * ldx + t + 4]);
    } else {
        const float2 v0 = *reinterpret_cast<const float2*>(x + g * ldx + 2 * t);
        const float2 v1 = *reinterpret_cast<const float2*>(x + (g + 8) * ldx + 2 * t);
        const float2 v2 = *reinterpret_cast<const float2*>(x + g * ldx + 2 * t + 8);
        const float2 v3 = *reinterpret_cast<const float2*>(x + (g + 8) * ldx + 2 * t + 8);
        a[0] = rnn_pack2(v0.x, v0.y, MODE);
        a[1] = rnn_pack2(v1.x, v1.y, MODE);
        a[2] = rnn_pack2(v2.x, v2.y, MODE);
        a[3] = rnn_pack2(v3.x, v3.y, MODE);
    }
}

// A B fragment of rows [0, 8) of w (W rows = output columns) and columns [0, KS), already in the mode's format.
template <int MODE>
__device__ __forceinline__ void rnn_frag_b(unsigned (&b)[2], const typename RnnWeight<MODE>::type* w, int ldw, int g, int t)
{
    if constexpr (MODE == RNN_TF32) {
        b[0] = __float_as_uint(w[g * ldw + t]);
        b[1] = __float_as_uint(w[g * ldw + t + 4]);
    } else {
        b[0] = *reinterpret_cast<const unsigned*>(w + g * ldw + 2 * t);
        b[1] = *reinterpret_cast<const unsigned*>(w + g * ldw + 2 * t + 8);
    }
}

template <int MODE>
__device__ __forceinline__ void rnn_mma(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2])
{
    if constexpr (MODE == RNN_TF32) {
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else if constexpr (MODE == RNN_FP16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
}

// Stages columns [k0, k0 + kc) of `rows` rows of a global operand (row stride lds) into dst[r * ld + k], and
// zeros into [kc, kcp) (whole MMA steps: zero times anything finite adds nothing). VEC: 16-byte cp.async
// copies through L2 (every K a multiple of 16 bytes), else plain loads.
template <typename T, bool VEC, int KC>
__device__ __forceinline__ void rnn_stage_chunk(T* __restrict__ dst, int ld, const T* __restrict__ src, long lds, int rows,
                                                int k0, int kc, int kcp)
{
    if (VEC) {
        constexpr int E = 16 / sizeof(T), Q = KC / E;       // elements per copy, copies per row
        const int q = threadIdx.x % Q, stride = blockDim.x / Q;
        if ((int)threadIdx.x >= stride * Q || q * E >= kcp) return;
        for (int r = threadIdx.x / Q; r < rows; r += stride) {
            if (q * E < kc) rnn_cp_async16(reinterpret_cast<float*>(dst + r * ld + q * E),
                                           reinterpret_cast<const float*>(src + (long)r * lds + k0 + q * E));
            else *reinterpret_cast<uint4*>(dst + r * ld + q * E) = make_uint4(0u, 0u, 0u, 0u);
        }
    } else {
        for (int i = threadIdx.x; i < rows * kcp; i += blockDim.x) {
            const int r = i / kcp, k = i - r * kcp;
            dst[r * ld + k] = k < kc ? __ldcg(src + (long)r * lds + k0 + k) : T(0);
        }
    }
}

// How a block's warps cover one GEMM: tm x tn warp tiles of WM x WN MMA tiles; K split `split` ways when the
// warp tiles are fewer than the warps, else `passes` rounds of warp tiles.
template <int WM, int WN>
struct RnnWarpTiles {
    int mt, nt, tn, groups, split, passes;
    __device__ RnnWarpTiles(int B, int NC)
    {
        mt = (B + 15) / 16;
        nt = (NC + 7) / 8;
        tn = (nt + WN - 1) / WN;
        groups = (mt + WM - 1) / WM * tn;
        const int warps = blockDim.x >> 5;
        split = groups >= warps ? 1 : warps / groups;
        passes = split > 1 ? 1 : (groups + warps - 1) / warps;
    }
};

// The fragments of k step kb of a warp's tiles (rows m_first.., columns n_first..), and their products.
template <int MODE, int WM, int WN>
__device__ __forceinline__ void rnn_frags(unsigned (&a)[WM][4], unsigned (&b)[WN][2], const float* __restrict__ x, int ldx,
                                          const typename RnnWeight<MODE>::type* __restrict__ w, int ldw, int m_first,
                                          int n_first, int mt, int nt, int kb, int g, int t)
{
#pragma unroll
    for (int i = 0; i < WM; ++i)
        if (m_first + i < mt) rnn_frag_a<MODE>(a[i], x + (m_first + i) * 16 * ldx + kb, ldx, g, t);
#pragma unroll
    for (int j = 0; j < WN; ++j)
        if (n_first + j < nt) rnn_frag_b<MODE>(b[j], w + (long)(n_first + j) * 8 * ldw + kb, ldw, g, t);
}
template <int MODE, int WM, int WN>
__device__ __forceinline__ void rnn_mmas(float (&acc)[WM][WN][4], const unsigned (&a)[WM][4], const unsigned (&b)[WN][2],
                                         int m_first, int n_first, int mt, int nt)
{
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int j = 0; j < WN; ++j)
            if (m_first + i < mt && n_first + j < nt) rnn_mma<MODE>(acc[i][j], a[i], b[j]);
}

// One staged chunk into a warp's accumulators: k steps s_begin, s_begin + s_step, ... < s_end. The fragments
// of the next step are loaded before the products of this one (two register sets), so shared-memory latency
// hides behind the tensor cores even with two warps per scheduler.
template <int MODE, int WM, int WN>
__device__ __forceinline__ void rnn_mma_chunk_tc(float (&acc)[WM][WN][4], const float* __restrict__ x, int ldx,
                                                 const typename RnnWeight<MODE>::type* __restrict__ w, int ldw,
                                                 int m_first, int n_first, int mt, int nt, int s_begin, int s_end,
                                                 int s_step, int g, int t)
{
    constexpr int KS = RnnMma<MODE>::KS;
    if (s_begin >= s_end) return;
    unsigned a0[WM][4], b0[WN][2], a1[WM][4], b1[WN][2];
    rnn_frags<MODE, WM, WN>(a0, b0, x, ldx, w, ldw, m_first, n_first, mt, nt, s_begin * KS, g, t);
    int s = s_begin;
    for (; s + s_step < s_end; s += 2 * s_step) {
        rnn_frags<MODE, WM, WN>(a1, b1, x, ldx, w, ldw, m_first, n_first, mt, nt, (s + s_step) * KS, g, t);
        rnn_mmas<MODE, WM, WN>(acc, a0, b0, m_first, n_first, mt, nt);
        if (s + 2 * s_step < s_end)
            rnn_frags<MODE, WM, WN>(a0, b0, x, ldx, w, ldw, m_first, n_first, mt, nt, (s + 2 * s_step) * KS, g, t);
        rnn_mmas<MODE, WM, WN>(acc, a1, b1, m_first, n_first, mt, nt);
    }
    if (s < s_end) rnn_mmas<MODE, WM, WN>(acc, a0, b0, m_first, n_first, mt, nt);   // an odd number of steps
}

// Writes a warp's tiles of Y (+ bias); with split K, first sums the parts through `red` in a fixed order.
template <int WM, int WN, typename WT>
__device__ __forceinline__ void rnn_store_mma(const RnnGemmT<WT>& J, const RnnWarpTiles<WM, WN>& tl, float (&acc)[WM][WN][4],
                                              int B, int slot, int part, bool active, float* __restrict__ red)
{
    constexpr int V = WM * WN * 4;                     // accumulators per lane
    const int lane = threadIdx.x & 31;
    auto place = [&](int s, int e, int ln, int& row, int& col) {
        const int i = e / (WN * 4), j = (e / 4) % WN, v = e % 4;
        row = ((s / tl.tn) * WM + i) * 16 + (ln >> 2) + (v >= 2 ? 8 : 0);
        col = ((s % tl.tn) * WN + j) * 8 + 2 * (ln & 3) + (v & 1);
    };
    if (tl.split == 1) {
        if (active) {
#pragma unroll
            for (int e = 0; e < V; ++e) {
                int row, col;
                place(slot, e, lane, row, col);
                if (row < B && col < J.NC)
                    J.Y[(long)row * J.ldy + col] = acc[e / (WN * 4)][(e / 4) % WN][e % 4] + (J.bias ? __ldg(J.bias + col) : 0.0f);
            }
        }
        return;
    }
    if (active) {
#pragma unroll
        for (int e = 0; e < V; ++e) red[((part * tl.groups + slot) * V + e) * 32 + lane] = acc[e / (WN * 4)][(e / 4) % WN][e % 4];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < tl.groups * V * 32; idx += blockDim.x) {
        const int s = idx / (V * 32), e = (idx / 32) % V, ln = idx % 32;
        int row, col;
        place(s, e, ln, row, col);
        if (row >= B || col >= J.NC) continue;
        float v = red[(s * V + e) * 32 + ln];
        for (int p = 1; p < tl.split; ++p) v += red[((p * tl.groups + s) * V + e) * 32 + ln];
        J.Y[(long)row * J.ldy + col] = v + (J.bias ? __ldg(J.bias + col) : 0.0f);
    }
    __syncthreads();                                   // red may be written again by the next GEMM
}

// Stages the chunk under the cursor `at` into `slot`: X rows (fp32), and W rows when W is not resident; zeros up to
// whole MMA steps; moves the cursor.
template <int WM, int WN, int KC, typename WT>
__device__ __forceinline__ int rnn_chunk_count_mma(const RnnGemmT<WT>& J, int B)
{
    return RnnWarpTiles<WM, WN>(B, J.NC).passes * ((J.K + KC - 1) / KC);
}

template <int MODE, int WM, int WN, int VEC, int KC, int N>
__device__ __forceinline__ void rnn_stage_next_mma(const RnnGemmT<typename RnnWeight<MODE>::type> (&jobs)[N],
                                                   RnnCursor& at, float* __restrict__ slot, int x_floats, int B)
{
    using WT = typename RnnWeight<MODE>::type;
    constexpr int KS = RnnMma<MODE>::KS;
    const RnnGemmT<WT> J = rnn_select(jobs, at.job);
    const int k0 = at.chunk * KC, kc = min(KC, J.K - k0), kcp = rnn_round_up(kc, KS);
    rnn_stage_chunk<float, VEC == 4, KC>(slot, rnn_xstride<MODE>(KC), J.X, J.K, B, k0, kc, kcp);
    if (!J.Ws)
        rnn_stage_chunk<WT, VEC == 4, KC>(reinterpret_cast<WT*>(slot + x_floats), rnn_wstride<MODE>(KC), J.W, J.K, J.NC,
                                          k0, kc, kcp);
    if (++at.chunk * KC >= J.K) at.chunk = 0;
    if (--at.left == 0 && ++at.job < N) at.left = rnn_chunk_count_mma<WM, WN, KC>(rnn_select(jobs, at.job), B);
}

// Every GEMM of one stage on tensor cores: the pipeline of rnn_tile_gemms with warps for threads.
// Shared memory (floats, from smem): STAGES slots of an X chunk (round_up(B, 16) rows of rnn_xstride(KC)
// floats) and, when some weight is streamed, a W chunk (ncs rows of rnn_wstride(KC) elements, rounded up to
// 16 bytes); then the split-K partial sums (blockDim * WM * WN * 4 floats).
template <int MODE, int WM, int WN, int VEC, int STAGES, int KC, int N>
__device__ void rnn_mma_gemms(const RnnGemmT<typename RnnWeight<MODE>::type> (&jobs)[N], int B, float* __restrict__ smem, int ncs)
{
    using WT = typename RnnWeight<MODE>::type;
    constexpr int KS = RnnMma<MODE>::KS, ldx = rnn_xstride<MODE>(KC), ldws = rnn_wstride<MODE>(KC);
    const int x_floats = rnn_round_up(B, 16) * ldx;
    const int slot_floats = x_floats + (int)((ncs * ldws * sizeof(WT) + 15) / 16 * 4);
    float* red = smem + STAGES * slot_floats;
    const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5, g4 = (threadIdx.x & 31) >> 2, t4 = threadIdx.x & 3;
    int total = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) total += rnn_chunk_count_mma<WM, WN, KC>(jobs[j], B);
    RnnCursor at{0, 0, rnn_chunk_count_mma<WM, WN, KC>(jobs[0], B)};

    __syncthreads();                                   // nobody still reads what the slots held before
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < total) rnn_stage_next_mma<MODE, WM, WN, VEC, KC>(jobs, at, smem + (s % STAGES) * slot_floats, x_floats, B);
        rnn_cp_async_commit();                         // an empty group when there is nothing left: counts stay uniform
    }
    int g = 0;
#pragma unroll
    for (int i = 0; i < N; ++i) {                      // unrolled: jobs[i] and its tiling stay in registers
        const RnnGemmT<WT>& J = jobs[i];
        const RnnWarpTiles<WM, WN> tl(B, J.NC);
        const int chunks = (J.K + KC - 1) / KC;
        const bool resident = J.Ws != nullptr;
        const int ldw = resident ? rnn_wstride<MODE>(J.K) : ldws;
        for (int pass = 0; pass < tl.passes; ++pass) {
            const int slot = tl.split > 1 ? warp % tl.groups : pass * warps + warp;
            const int part = tl.split > 1 ? warp / tl.groups : 0;
            const bool active = slot < tl.groups && part < tl.split;
            const int m_first = (slot / tl.tn) * WM, n_first = (slot % tl.tn) * WN;
            float acc[WM][WN][4] = {};                 // this pass's tiles, from zero
            for (int chunk = 0; chunk < chunks; ++chunk, ++g) {
                rnn_cp_async_wait<STAGES - 2>();       // chunk g has landed (this thread's copies)
                __syncthreads();                       // ... everyone's; and chunk g - 1 is no longer read
                if (g + STAGES - 1 < total)            // into the slot chunk g - 1 used
                    rnn_stage_next_mma<MODE, WM, WN, VEC, KC>(jobs, at, smem + ((g + STAGES - 1) % STAGES) * slot_floats,
                                                              x_floats, B);
                rnn_cp_async_commit();
                const int k0 = chunk * KC, steps = rnn_round_up(min(KC, J.K - k0), KS) / KS;
                const float* x = smem + (g % STAGES) * slot_floats;
                const WT* w = resident ? J.Ws + k0 : reinterpret_cast<const WT*>(x + x_floats);
                if (active)
                    rnn_mma_chunk_tc<MODE, WM, WN>(acc, x, ldx, w, ldw, m_first, n_first, tl.mt, tl.nt, part, steps,
                                                   tl.split, g4, t4);
            }
            rnn_store_mma<WM, WN>(J, tl, acc, B, slot, part, active, red);
        }
    }
    rnn_cp_async_wait<0>();                            // only empty groups remain
    __syncthreads();                                   // Y is complete for the whole block; the slots are free
}

#endif  // RNN_MMA_GEMM_CUH
