// The recurrent GEMMs of one stage on tensor cores, for the precision modes tf32, fp16, bf16 and float32x3
// (engine/codegen/precision.py); needs tile_gemm.cuh (modes, rounding, RnnGemmT, cp.async).
//
//     Y[b, c] = sum_k X[b, k] * W[c, k]  (+ bias[c])      b < B, c < NC
//
// The same contract as rnn_tile_gemms: every GEMM of a stage in one call, X (written by other blocks)
// staged in chunks of KC columns through a STAGES-deep cp.async pipeline, W resident in shared memory or
// staged beside X; fixed-order split-K reduction, so runs are bit-identical. What differs:
//
// - the product is mma.sync (PTX ISA, "Warp-level matrix multiply-accumulate instructions"):
//   m16n8k8 with .tf32 operands, or m16n8k16 with .f16 / .bf16 operands, fp32 accumulators;
// - the unit of work is a warp, not a thread: a warp holds a WM x WN grid of 16 x 8 accumulator tiles
//   (rows of the batch x columns of W), its A fragments loaded once per k step and used WN times;
// - fragments load with ldmatrix (one instruction for a 16 x KS A tile, or the B tiles of two column
//   groups): every fragment register is a 32-bit pair of 16-bit values, or one tf32 value, in the
//   layout ldmatrix gives 8 x 8 b16 matrices;
// - X is read in the mode's format: fp16 / bf16 GEMMs read the 16-bit copy of their operand that the
//   cell code writes beside the fp32 value (engine/codegen/wavefront.py: rounded once, half the bytes
//   through L2 and shared memory); tf32 reads fp32 X and rounds its fragments (cvt.rna.tf32.f32). W is
//   stored already rounded (tf32 values as floats, fp16/bf16 as 16-bit patterns). The rounding is
//   rnn_operand's, so the GEMV path of few rows and this one compute the same function.
// - float32x3 (3xTF32, as CUTLASS's OpMultiplyAddFastF32): X and W both fp32, W stored unrounded. Each fragment
//   register v is split as it is loaded into hi = tf32(v) and lo = tf32(v - hi) (the subtraction is exact), so a
//   fragment holds twice the registers (RnnFrag), and one k step is three m16n8k8 TF32 MMAs into a fresh fp32
//   accumulator, the small ones first: a_hi b_lo, a_lo b_hi, then a_hi b_hi (a_lo b_lo, below 2^-22 of the
//   product, is dropped), added to the running sum by FADD (rnn_mma says why). Three times the tensor-core
//   work of tf32 for an error at fp32's level.
//
// Fragment layouts (PTX ISA, mma.m16n8k8 / m16n8k16, .row.col), with g = lane / 4 and t = lane % 4:
//   A (16 x KS, row-major X rows):  tf32: a0 (g, t) a1 (g+8, t) a2 (g, t+4) a3 (g+8, t+4)
//                                   16-bit: pairs a0 (g, 2t..2t+1) a1 (g+8, ..) a2 (g, 2t+8..) a3 (g+8, 2t+8..)
//   B (KS x 8, W rows = columns n): tf32: b0 (k=t, n=g) b1 (k=t+4, n=g); 16-bit: pairs b0 (k=2t.., g) b1 (k=2t+8.., g)
//   C (16 x 8):                     c0, c1 (g, 2t..2t+1)  c2, c3 (g+8, 2t..2t+1)
// ldmatrix.x4 (PTX ISA, "ldmatrix"): lanes 8i..8i+7 give the row addresses of matrix i, and lane l receives,
// of matrix i, row l / 4 and the 4 bytes at 4 * (l % 4): for both element sizes, 16 bytes of a row = KS / 2
// columns. So A is matrices (rows 0-7, bytes 0-15), (rows 8-15, 0-15), (rows 0-7, 16-31), (rows 8-15, 16-31)
// = a0..a3, and the B of column groups j, j + 1 is (j rows, 0-15), (j, 16-31), (j + 1, 0-15), (j + 1, 16-31).
// Row strides (tile_gemm.cuh rnn_wstride, rnn_xstride below) are 16 bytes past a multiple of 32, so the 8 rows
// of one matrix sit in 8 different bank groups.
#ifndef RNN_MMA_GEMM_CUH
#define RNN_MMA_GEMM_CUH

template <int MODE> struct RnnMma { static constexpr int KS = 16; };     // K of one MMA: fp16, bf16
template <> struct RnnMma<RNN_TF32> { static constexpr int KS = 8; };
template <> struct RnnMma<RNN_TF32X3> { static constexpr int KS = 8; };

// Registers of one A and one B fragment: float32x3 keeps the lo parts after the hi parts (a[4..7], b[2..3]).
template <int MODE> struct RnnFrag { static constexpr int A = 4, B = 2; };
template <> struct RnnFrag<RNN_TF32X3> { static constexpr int A = 8, B = 4; };

// float32x3's split of the fp32 value in register r: r becomes hi = tf32(v), lo gets tf32(v - hi).
__device__ __forceinline__ void rnn_tf32_split(unsigned& r, unsigned& lo)
{
    const float v = __uint_as_float(r);
    r = rnn_tf32_bits(v);
    lo = rnn_tf32_bits(v - __uint_as_float(r));
}

// The element of X as the tensor cores read it: fp32 for tf32, the 16-bit copy for fp16 / bf16.
template <int MODE> struct RnnX { using type = float; };
template <> struct RnnX<RNN_FP16> { using type = unsigned short; };
template <> struct RnnX<RNN_BF16> { using type = unsigned short; };
template <int MODE> using RnnMmaJob = RnnGemmT<typename RnnWeight<MODE>::type, typename RnnX<MODE>::type>;

// Elements of X between rows of a staged chunk of kc columns (the same rule as rnn_wstride).
template <int MODE>
__host__ __device__ constexpr int rnn_xstride(int kc) { return rnn_tf32_mma(MODE) ? rnn_round_up(kc, 8) + 4 : rnn_round_up(kc, 16) + 8; }

__device__ __forceinline__ void rnn_ldmatrix4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void rnn_ldmatrix2(unsigned& r0, unsigned& r1, unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}

// The A fragment of one 16 x KS tile: `at` is this lane's row address (row lane % 16, 16 * (lane / 16) bytes in).
template <int MODE>
__device__ __forceinline__ void rnn_frag_a(unsigned (&a)[RnnFrag<MODE>::A], unsigned at)
{
    rnn_ldmatrix4(a[0], a[1], a[2], a[3], at);
    if constexpr (MODE == RNN_TF32) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = rnn_tf32_bits(__uint_as_float(a[i]));
    } else if constexpr (MODE == RNN_TF32X3) {
#pragma unroll
        for (int i = 0; i < 4; ++i) rnn_tf32_split(a[i], a[4 + i]);
    }
}

// B fragments as ldmatrix gave them: float32x3 splits each register (b[0..1] hi, b[2..3] lo).
template <int MODE>
__device__ __forceinline__ void rnn_frag_b_split(unsigned (&b)[RnnFrag<MODE>::B])
{
    if constexpr (MODE == RNN_TF32X3) {
        rnn_tf32_split(b[0], b[2]);
        rnn_tf32_split(b[1], b[3]);
    }
}

__device__ __forceinline__ void rnn_mma_tf32(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                             unsigned b0, unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int MODE>
__device__ __forceinline__ void rnn_mma(float (&c)[4], const unsigned (&a)[RnnFrag<MODE>::A],
                                        const unsigned (&b)[RnnFrag<MODE>::B])
{
    if constexpr (MODE == RNN_TF32) {
        rnn_mma_tf32(c, a[0], a[1], a[2], a[3], b[0], b[1]);
    } else if constexpr (MODE == RNN_TF32X3) {
        // The three products of this k step into a fresh accumulator (the small ones first, then the big one, as
        // CUTLASS orders them), added to c by FADD. The tensor cores add into their accumulator with truncation
        // (Fasi et al. 2021, "Numerical behavior of NVIDIA tensor cores"): one accumulator over all of K drifts
        // toward zero, 8-20x strict fp32's error at K = 1024-2048; an fp32 add per k step rounds to nearest.
        float t[4] = {0.f, 0.f, 0.f, 0.f};
        rnn_mma_tf32(t, a[0], a[1], a[2], a[3], b[2], b[3]);          // a_hi b_lo
        rnn_mma_tf32(t, a[4], a[5], a[6], a[7], b[0], b[1]);          // a_lo b_hi
        rnn_mma_tf32(t, a[0], a[1], a[2], a[3], b[0], b[1]);          // a_hi b_hi
#pragma unroll
        for (int i = 0; i < 4; ++i) c[i] += t[i];
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

// How a block's warps (its MMA warps: all of them, or all but the bulk pipeline's producer warp) cover one GEMM:
// tm x tn warp tiles of WM x WN MMA tiles; K split `split` ways when the warp tiles are fewer than the warps, else
// `passes` rounds of warp tiles.
template <int WM, int WN>
struct RnnWarpTiles {
    int mt, nt, tn, groups, split, passes;
    __device__ RnnWarpTiles(int B, int NC) : RnnWarpTiles(B, NC, blockDim.x >> 5) {}
    __device__ RnnWarpTiles(int B, int NC, int warps)
    {
        mt = (B + 15) / 16;
        nt = (NC + 7) / 8;
        tn = (nt + WN - 1) / WN;
        groups = (mt + WM - 1) / WM * tn;
        split = groups >= warps ? 1 : warps / groups;
        passes = split > 1 ? 1 : (groups + warps - 1) / warps;
    }
};

// Where this lane's ldmatrix row of an operand in shared memory lies: `row` is the byte address of its row at
// column 0; the 16-byte group of k step s is 2 s + hi, stored at group (2 s + hi) ^ sw: sw = 0 for rows of a
// padded stride, row % 8 for the swizzled chunks of the bulk pipeline (eight rows of one 16-byte group in eight
// bank groups). For A, the lane's row is lane % 16 of a tile and hi = lane / 16; for a pair of B column groups,
// row 8 (lane / 16) + lane % 8 and hi = lane / 8 % 2 (the x2 form reads lanes 0-15 only: the first group).
struct RnnLaneAt {
    unsigned row;
    int hi, sw;
    __device__ __forceinline__ unsigned at(int s) const { return row + ((((s << 1) + hi) ^ sw) << 4); }
};
__device__ __forceinline__ RnnLaneAt rnn_lane_a(unsigned base, int ld, int lane, bool swizzled)
{
    return {base + (lane & 15) * ld, lane >> 4, swizzled ? lane & 7 : 0};
}
__device__ __forceinline__ RnnLaneAt rnn_lane_b(unsigned base, int ld, int lane, bool swizzled)
{
    return {base + ((lane >> 4) * 8 + (lane & 7)) * ld, (lane >> 3) & 1, swizzled ? lane & 7 : 0};
}

// The fragments of k step s of a warp's tiles (rows m_first.., columns n_first..), and their products; ldxb, ldwb:
// bytes between rows of X and of W.
template <int MODE, int WM, int WN>
__device__ __forceinline__ void rnn_frags(unsigned (&a)[WM][RnnFrag<MODE>::A], unsigned (&b)[WN][RnnFrag<MODE>::B],
                                          const RnnLaneAt& x, int ldxb,
                                          const RnnLaneAt& w, int ldwb, int s, int m_first, int n_first, int mt, int nt)
{
    const unsigned xa = x.at(s), wa = w.at(s);
#pragma unroll
    for (int i = 0; i < WM; ++i)
        if (m_first + i < mt) rnn_frag_a<MODE>(a[i], xa + (m_first + i) * 16 * ldxb);
#pragma unroll
    for (int j = 0; j < WN; j += 2) {
        const unsigned at = wa + (n_first + j) * 8 * ldwb;
        if (j + 1 < WN && n_first + j + 1 < nt) rnn_ldmatrix4(b[j][0], b[j][1], b[j + 1][0], b[j + 1][1], at);
        else if (n_first + j < nt) rnn_ldmatrix2(b[j][0], b[j][1], at);
    }
    if constexpr (MODE == RNN_TF32X3) {
#pragma unroll
        for (int j = 0; j < WN; ++j)
            if (n_first + j < nt) rnn_frag_b_split<MODE>(b[j]);
    }
}
template <int MODE, int WM, int WN>
__device__ __forceinline__ void rnn_mmas(float (&acc)[WM][WN][4], const unsigned (&a)[WM][RnnFrag<MODE>::A],
                                         const unsigned (&b)[WN][RnnFrag<MODE>::B], int m_first, int n_first, int mt, int nt)
{
#pragma unroll
    for (int i = 0; i < WM; ++i)
#pragma unroll
        for (int j = 0; j < WN; ++j)
            if (m_first + i < mt && n_first + j < nt) rnn_mma<MODE>(acc[i][j], a[i], b[j]);
}

// One staged chunk into a warp's accumulators: k steps s_begin, s_begin + s_step, ... < s_end. The fragments of
// the next step are loaded before the products of this one (two register sets), so shared-memory latency hides
// behind the tensor cores even with two warps per scheduler.
template <int MODE, int WM, int WN>
__device__ __forceinline__ void rnn_mma_chunk_tc(float (&acc)[WM][WN][4], const RnnLaneAt& x, int ldxb, const RnnLaneAt& w,
                                                 int ldwb, int m_first, int n_first, int mt, int nt, int s_begin, int s_end,
                                                 int s_step)
{
    if (s_begin >= s_end) return;
    constexpr int FA = RnnFrag<MODE>::A, FB = RnnFrag<MODE>::B;
    unsigned a0[WM][FA], b0[WN][FB], a1[WM][FA], b1[WN][FB];
    rnn_frags<MODE, WM, WN>(a0, b0, x, ldxb, w, ldwb, s_begin, m_first, n_first, mt, nt);
    int s = s_begin;
    for (; s + s_step < s_end; s += 2 * s_step) {
        rnn_frags<MODE, WM, WN>(a1, b1, x, ldxb, w, ldwb, s + s_step, m_first, n_first, mt, nt);
        rnn_mmas<MODE, WM, WN>(acc, a0, b0, m_first, n_first, mt, nt);
        if (s + 2 * s_step < s_end) rnn_frags<MODE, WM, WN>(a0, b0, x, ldxb, w, ldwb, s + 2 * s_step, m_first, n_first, mt, nt);
        rnn_mmas<MODE, WM, WN>(acc, a1, b1, m_first, n_first, mt, nt);
    }
    if (s < s_end) rnn_mmas<MODE, WM, WN>(acc, a0, b0, m_first, n_first, mt, nt);   // an odd number of steps
}

// Writes a warp's tiles of Y (+ bias); with split K, first sums the parts through `red` in a fixed order.
template <int WM, int WN, typename Job>
__device__ __forceinline__ void rnn_store_mma(const Job& J, const RnnWarpTiles<WM, WN>& tl, float (&acc)[WM][WN][4],
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

// Chunks of one GEMM in a stage's stream: its K chunks, once per pass over its warp tiles (of `warps` MMA warps).
template <int WM, int WN, int KC, typename Job>
__device__ __forceinline__ int rnn_chunk_count_mma(const Job& J, int B, int warps)
{
    return RnnWarpTiles<WM, WN>(B, J.NC, warps).passes * ((J.K + KC - 1) / KC);
}

// Stages the chunk under the cursor `at` into `slot`: X rows (in the mode's X format), and W rows when W is not
// resident; zeros up to whole MMA steps; moves the cursor. x_floats: floats of the slot's X part.
template <int MODE, int WM, int WN, int VEC, int KC, int N>
__device__ __forceinline__ void rnn_stage_next_mma(const RnnMmaJob<MODE> (&jobs)[N], RnnCursor& at, float* __restrict__ slot,
                                                   int x_floats, int B)
{
    using WT = typename RnnWeight<MODE>::type;
    using XT = typename RnnX<MODE>::type;
    constexpr int KS = RnnMma<MODE>::KS;
    const RnnMmaJob<MODE> J = rnn_select(jobs, at.job);
    const int k0 = at.chunk * KC, kc = min(KC, J.K - k0), kcp = rnn_round_up(kc, KS);
    rnn_stage_chunk<XT, VEC == 4, KC>(reinterpret_cast<XT*>(slot), rnn_xstride<MODE>(KC), J.X, J.K, B, k0, kc, kcp);
    if (!J.Ws)
        rnn_stage_chunk<WT, VEC == 4, KC>(reinterpret_cast<WT*>(slot + x_floats), rnn_wstride<MODE>(KC), J.W, J.K, J.NC,
                                          k0, kc, kcp);
    if (++at.chunk * KC >= J.K) at.chunk = 0;
    if (--at.left == 0 && ++at.job < N)
        at.left = rnn_chunk_count_mma<WM, WN, KC>(rnn_select(jobs, at.job), B, blockDim.x >> 5);
}

// Hopper's bulk copies and transaction barriers (PTX ISA, "cp.async.bulk", "mbarrier"): a thread copies a
// contiguous global range into shared memory, and an mbarrier of the block completes its phase when the bytes it
// was told to expect have landed. RNN_BULK: compiled for sm_90 or newer.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RNN_BULK 1
#else
#define RNN_BULK 0
#endif
__device__ __forceinline__ void rnn_bar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void rnn_bar_expect(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void rnn_bar_arrive(unsigned bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of the given parity has completed (use n of a barrier: parity n % 2).
__device__ __forceinline__ void rnn_bar_wait(unsigned bar, unsigned parity)
{
    unsigned done;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
__device__ __forceinline__ void rnn_bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
// The same with an L2 cache policy (createpolicy): streamed weights, read again every step.
__device__ __forceinline__ void rnn_bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar,
                                              unsigned long long policy)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(policy) : "memory");
}
// A policy that keeps `fraction` of the lines it touches in L2 before others (evict_last), the rest evict_first:
// weights streamed every step that together outgrow the L2 keep that share on chip instead of all of them
// cycling through DRAM.
__device__ __forceinline__ unsigned long long rnn_keep_policy(float fraction)
{
    unsigned long long policy;
    asm volatile("createpolicy.fractional.L2::evict_last.L2::evict_first.b64 %0, %1;\n" : "=l"(policy) : "f"(fraction));
    return policy;
}

// The bulk pipeline's barriers, once a launch (kernel entry, before the first stage): full[s] counts the producer's
// expect_tx arrival and the bytes of slot s, empty[s] one arrival an MMA warp (PW: the producer warps, not counted).
// A barrier is initialised once and every
// fill of a slot waits for the release of the previous fill, across calls too (a fresh empty barrier counts as
// released: waiting on the parity of its phase "-1" returns at once). Fill u of slot s (counted over the launch)
// lands in phase u of full[s] and is released in phase u of empty[s]; each call starts its slots at s = 0, so it
// only needs the parity of the fills each slot has had so far: bit s of the int at byte 124. The first 128
// bytes of the staging area: full[s] at 8 s, empty[s] at 8 (STAGES + s), the parity bits at byte 124.
template <int STAGES, int PW = 0>
__device__ __forceinline__ void rnn_bulk_init(float* smem)
{
    static_assert(STAGES <= 7, "the barriers and the parity bits share 128 bytes");
#if RNN_BULK
    if (threadIdx.x == 0) {
        const unsigned bars = (unsigned)__cvta_generic_to_shared(smem);
        for (int s = 0; s < STAGES; ++s) {
            rnn_bar_init(bars + 8 * s, 1);
            rnn_bar_init(bars + 8 * (STAGES + s), (blockDim.x >> 5) - PW);
        }
        reinterpret_cast<int*>(smem)[31] = 0;          // no fills yet
    }
    __syncthreads();
#endif
}

// The bulk pipeline's layout of a 16-bit operand in global memory: row blocks of B rows (one time step of a
// sequence buffer, or the whole (B, K) buffer), each as K / KC chunks of B rows x KC columns, so that one chunk is
// one contiguous copy; inside a chunk, row b's 16-byte group c sits at group c ^ (b % 8) (RnnLaneAt). The cell code
// writes the copies of X through this index; the host lays out x, the initial states and streamed weights alike
// (engine/schedules/base.py chunked).
template <int KC>
__device__ __forceinline__ long rnn_chunked(long block, int b, int k, int B, int K)
{
    const int w = k % KC;
    return ((block * (K / KC) + k / KC) * B + b) * (long)KC + (((w >> 3) ^ (b & 7)) << 3) + (w & 7);
}

// The producer (thread 0, or the producer warp's first lane) stages the chunk under the cursor into the slot at
// shared address `at`: X rows B x KC of the chunked 16-bit copy, and W rows ncs x KC of the chunked weight when W is
// not resident, one bulk copy each; the full barrier `bar` expects their bytes. Moves the cursor (`warps`: the MMA
// warps, whose passes the chunk stream repeats).
template <int MODE, int WM, int WN, int KC, int N>
__device__ __forceinline__ void rnn_bulk_stage(const RnnMmaJob<MODE> (&jobs)[N], RnnCursor& cur, unsigned at, int x_bytes,
                                               int B, int ncs, unsigned bar, unsigned long long keep, int warps)
{
    using WT = typename RnnWeight<MODE>::type;
    using XT = typename RnnX<MODE>::type;
    const RnnMmaJob<MODE> J = rnn_select(jobs, cur.job);
    const unsigned xb = B * KC * sizeof(XT), wb = J.Ws ? 0u : ncs * KC * sizeof(WT);
    rnn_bar_expect(bar, xb + wb);
    rnn_bulk_copy(at, J.X + (long)cur.chunk * B * KC, xb, bar);
    if (wb) rnn_bulk_copy(at + x_bytes, J.W + (long)cur.chunk * ncs * KC, wb, bar, keep);
    if (++cur.chunk * KC >= J.K) cur.chunk = 0;
    if (--cur.left == 0 && ++cur.job < N) cur.left = rnn_chunk_count_mma<WM, WN, KC>(rnn_select(jobs, cur.job), B, warps);
}

// Every GEMM of one stage on tensor cores: the pipeline of rnn_tile_gemms with warps for threads.
//
// BULK (fp16 / bf16 on sm_90, every K a multiple of KC, operands in the chunked layout above): Hopper's pipeline.
// A producer stages chunk g + STAGES - 1 with one bulk copy of X (and one of W) while the MMA warps multiply chunk g;
// a warp waits on the slot's full barrier (its bytes have landed) and releases the slot on its empty barrier (one
// arrival an MMA warp), which the producer waits on before refilling it. No block-wide barrier per chunk: a warp
// runs ahead of the slowest by up to STAGES - 1 chunks. PW = 0: the producer is thread 0, between its own MMAs; PW = 1:
// the block's last warp only feeds the ring (its first lane issues; the warp keeps to the block's barriers), so the
// refills wait on nobody's MMAs (the one-launch layer's step shrank by a tenth to a quarter with a feed of its own:
// benchmarks/NOTES.md 2026-11-28 14:51). Otherwise every thread issues 16-byte cp.async copies of rows of a padded
// stride (or plain loads) and the block meets at a barrier per chunk.
//
// Shared memory (floats, from smem): 32 floats of barriers and parity bits (BULK, rnn_bulk_init); STAGES slots
// of an X chunk (round_up(B, 16) rows of rnn_xstride(KC) elements, KC when BULK) and, when some weight is streamed,
// a W chunk (ncs rows of rnn_wstride(KC) elements, KC when BULK, rounded up to 16 bytes); then the split-K partial
// sums (blockDim * WM * WN * 4 floats).
template <int MODE, int WM, int WN, int VEC, int STAGES, int KC, bool BULK_ASKED, int PW = 0, int N = 1>
__device__ void rnn_mma_gemms(const RnnMmaJob<MODE> (&jobs)[N], int B, float* __restrict__ smem, int ncs, float w_keep = 1.0f)
{
    using WT = typename RnnWeight<MODE>::type;
    using XT = typename RnnX<MODE>::type;
    constexpr bool BULK = BULK_ASKED && RNN_BULK;
    static_assert(!BULK || (!rnn_tf32_mma(MODE) && KC % 64 == 0), "the bulk pipeline copies 16-bit X in chunks of 64 columns");
    static_assert(PW == 0 || (PW == 1 && BULK_ASKED), "a producer warp feeds the bulk pipeline only");
    constexpr int ldx = BULK ? KC : rnn_xstride<MODE>(KC), ldws = BULK ? KC : rnn_wstride<MODE>(KC);
    const int x_floats = rnn_round_up(B, 16) * ldx * (int)sizeof(XT) / 4;
    const int slot_floats = x_floats + (int)((ncs * ldws * sizeof(WT) + 15) / 16 * 4);
    const unsigned bars = (unsigned)__cvta_generic_to_shared(smem);          // full[s]: bars + 8 s; empty[s]: + 8 STAGES
    int* parity = reinterpret_cast<int*>(smem) + 31;                      // BULK: bit s = fills of slot s so far, mod 2
    float* slots = smem + 32;
    float* red = slots + STAGES * slot_floats;
    // warps: the MMA warps (the producer warp, PW, is the block's last; the host asks for PW = 1 only with BULK, for
    // sm_90, where the source is compiled for the device it runs on)
    const int warp = threadIdx.x >> 5, warps = (blockDim.x >> 5) - (BULK ? PW : 0), lane = threadIdx.x & 31;
    const unsigned slots_at = (unsigned)__cvta_generic_to_shared(slots);
    int total = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) total += rnn_chunk_count_mma<WM, WN, KC>(jobs[j], B, warps);
    RnnCursor at{0, 0, rnn_chunk_count_mma<WM, WN, KC>(jobs[0], B, warps)};
    unsigned long long keep = 0;                       // the producer's L2 policy for streamed weights (BULK)

    __syncthreads();                                   // nobody still reads what the slots held before
    // BULK: chunk g of this call is fill g / STAGES of slot g % STAGES in this call; the phase of that fill in the
    // slot's barriers has parity (bit s of `parity` + g / STAGES) % 2 (rnn_bulk_init).
    const int bits = BULK ? *parity : 0;
    auto phase = [bits](int g) { return (unsigned)(((bits >> (g % STAGES)) + g / STAGES) & 1); };
    if constexpr (BULK && PW == 1) {
        if (warp == warps) {
            // The producer warp: every chunk of the call in order, each once its slot's previous fill is released.
            // Before a GEMM's split-K sums meet (rnn_store_mma's two block barriers) it stages up to STAGES - 1
            // chunks past that GEMM, whose slots the MMA warps release before they reach the barriers, then takes
            // its share of the sums; so the barriers never wait on a release that comes after them.
            if (lane == 0) {
                keep = rnn_keep_policy(w_keep);
                asm volatile("fence.proxy.async;\n" ::: "memory");   // X written by every block (generic), bulk reads
            }
            int issued = 0, end = 0;
            float none[WM][WN][4] = {};
#pragma unroll
            for (int i = 0; i < N; ++i) {
                const RnnMmaJob<MODE>& J = jobs[i];
                const RnnWarpTiles<WM, WN> tl(B, J.NC, warps);
                end += tl.passes * ((J.K + KC - 1) / KC);
                const int upto = tl.split > 1 ? min(total, end + STAGES - 1) : end;
                if (lane == 0) {
                    for (; issued < upto; ++issued) {
                        const int sn = issued % STAGES;
                        rnn_bar_wait(bars + 8 * (STAGES + sn), phase(issued) ^ 1);
                        rnn_bulk_stage<MODE, WM, WN, KC>(jobs, at, slots_at + sn * slot_floats * 4, x_floats * 4, B, ncs,
                                                         bars + 8 * sn, keep, warps);
                    }
                }
                __syncwarp();                          // (lane 0 alone counts `issued`: after a GEMM of split K it
                                                       // may be past the next GEMM's end already)
                if (tl.split > 1) rnn_store_mma<WM, WN>(J, tl, none, B, 0, 0, false, red);
            }
        }
    } else if constexpr (BULK) {
        if (threadIdx.x == 0) {
            keep = rnn_keep_policy(w_keep);
            asm volatile("fence.proxy.async;\n" ::: "memory");   // X written by every block (generic), then bulk reads
            for (int g = 0; g < STAGES - 1 && g < total; ++g) {
                rnn_bar_wait(bars + 8 * (STAGES + g), phase(g) ^ 1);   // the slot's previous fill is released
                rnn_bulk_stage<MODE, WM, WN, KC>(jobs, at, slots_at + g * slot_floats * 4, x_floats * 4, B, ncs, bars + 8 * g,
                                                 keep, warps);
            }
        }
    } else {
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < total) rnn_stage_next_mma<MODE, WM, WN, VEC, KC>(jobs, at, slots + (s % STAGES) * slot_floats, x_floats, B);
            rnn_cp_async_commit();                     // an empty group when there is nothing left: counts stay uniform
        }
    }
    int g = 0;
#pragma unroll
    for (int i = 0; i < N; ++i) {                      // unrolled: jobs[i] and its tiling stay in registers
        if (BULK && PW == 1 && warp == warps) break;   // the producer warp fed the ring above
        const RnnMmaJob<MODE>& J = jobs[i];
        const RnnWarpTiles<WM, WN> tl(B, J.NC, warps);
        const int chunks = (J.K + KC - 1) / KC;
        const bool resident = J.Ws != nullptr;
        const int ldxb = ldx * (int)sizeof(XT), ldwb = (resident ? rnn_wstride<MODE>(J.K) : ldws) * (int)sizeof(WT);
        // This lane's ldmatrix rows at slot 0, chunk 0 (resident W: column 0 of the resident rows, padded).
        const RnnLaneAt xl = rnn_lane_a(slots_at, ldxb, lane, BULK);
        const RnnLaneAt wl = resident ? rnn_lane_b((unsigned)__cvta_generic_to_shared(J.Ws), ldwb, lane, false)
                                      : rnn_lane_b(slots_at + x_floats * 4, ldwb, lane, BULK);
        for (int pass = 0; pass < tl.passes; ++pass) {
            const int slot = tl.split > 1 ? warp % tl.groups : pass * warps + warp;
            const int part = tl.split > 1 ? warp / tl.groups : 0;
            const bool active = slot < tl.groups && part < tl.split;
            const int m_first = (slot / tl.tn) * WM, n_first = (slot % tl.tn) * WN;
            float acc[WM][WN][4] = {};                 // this pass's tiles, from zero
            for (int chunk = 0; chunk < chunks; ++chunk, ++g) {
                const int s = g % STAGES, next = g + STAGES - 1;
                if constexpr (BULK) {
                    if (PW == 0 && threadIdx.x == 0 && next < total) {   // refill the slot of chunk g - 1 once every
                        const int sn = next % STAGES;                    // warp is done
                        rnn_bar_wait(bars + 8 * (STAGES + sn), phase(next) ^ 1);
                        rnn_bulk_stage<MODE, WM, WN, KC>(jobs, at, slots_at + sn * slot_floats * 4, x_floats * 4, B, ncs,
                                                         bars + 8 * sn, keep, warps);
                    }
                    rnn_bar_wait(bars + 8 * s, phase(g));     // chunk g has landed
                } else {
                    rnn_cp_async_wait<STAGES - 2>();   // chunk g has landed (this thread's copies)
                    __syncthreads();                   // ... everyone's; and chunk g - 1 is no longer read
                    if (next < total)                  // into the slot chunk g - 1 used
                        rnn_stage_next_mma<MODE, WM, WN, VEC, KC>(jobs, at, slots + (next % STAGES) * slot_floats,
                                                                  x_floats, B);
                    rnn_cp_async_commit();
                }
                const int k0 = chunk * KC;
                const int steps = rnn_round_up(min(KC, J.K - k0), RnnMma<MODE>::KS) / RnnMma<MODE>::KS;
                const unsigned slot_at = s * slot_floats * 4;
                RnnLaneAt xs = xl, ws = wl;
                xs.row += slot_at;
                ws.row += resident ? k0 * (int)sizeof(WT) : slot_at;
                if (active)
                    rnn_mma_chunk_tc<MODE, WM, WN>(acc, xs, ldxb, ws, ldwb, m_first, n_first, tl.mt, tl.nt, part, steps,
                                                   tl.split);
                if constexpr (BULK) {
                    __syncwarp();
                    if (lane == 0) rnn_bar_arrive(bars + 8 * (STAGES + s));   // this warp is done with slot s
                }
            }
            rnn_store_mma<WM, WN>(J, tl, acc, B, slot, part, active, red);
        }
    }
    if constexpr (!BULK) rnn_cp_async_wait<0>();       // only empty groups remain
    __syncthreads();                                   // Y is complete for the whole block; the slots are free
    if (BULK && threadIdx.x == 0) {                    // the fills of this call, per slot, mod 2; read after the next
        int flips = 0;                                 // call's first barrier
        for (int s = 0; s < STAGES && s < total; ++s) flips |= (((total - s + STAGES - 1) / STAGES) & 1) << s;
        *parity = bits ^ flips;
    }
}

// Every GEMM of one stage with X already in this block's shared memory and W resident (the persistent schedule's
// cluster mode, engine/schedules/cluster.py): J.X is the block's local copy of the 16-bit operand, round_up(B, 16)
// rows of rnn_xstride(K) elements (rows past B and columns past K zero), J.Ws the resident rows. No staging: each
// warp runs its tiles' k steps (split K as rnn_mma_gemms splits it) straight from shared memory, and the partial
// sums meet in `red` in the same fixed order, so runs are bit-identical.
template <int MODE, int WM, int WN, int N>
__device__ __forceinline__ void rnn_mma_gemms_local(const RnnMmaJob<MODE> (&jobs)[N], int B, float* __restrict__ red)
{
    using WT = typename RnnWeight<MODE>::type;
    using XT = typename RnnX<MODE>::type;
    const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const RnnMmaJob<MODE>& J = jobs[i];
        const RnnWarpTiles<WM, WN> tl(B, J.NC);
        const int ldxb = rnn_xstride<MODE>(J.K) * (int)sizeof(XT), ldwb = rnn_wstride<MODE>(J.K) * (int)sizeof(WT);
        const RnnLaneAt xl = rnn_lane_a((unsigned)__cvta_generic_to_shared(J.X), ldxb, lane, false);
        const RnnLaneAt wl = rnn_lane_b((unsigned)__cvta_generic_to_shared(J.Ws), ldwb, lane, false);
        const int steps = rnn_round_up(J.K, RnnMma<MODE>::KS) / RnnMma<MODE>::KS;
        for (int pass = 0; pass < tl.passes; ++pass) {
            const int slot = tl.split > 1 ? warp % tl.groups : pass * warps + warp;
            const int part = tl.split > 1 ? warp / tl.groups : 0;
            const bool active = slot < tl.groups && part < tl.split;
            float acc[WM][WN][4] = {};
            if (active)
                rnn_mma_chunk_tc<MODE, WM, WN>(acc, xl, ldxb, wl, ldwb, (slot / tl.tn) * WM, (slot % tl.tn) * WN, tl.mt,
                                               tl.nt, part, steps, tl.split);
            rnn_store_mma<WM, WN>(J, tl, acc, B, slot, part, active, red);
        }
    }
    __syncthreads();                                   // Y is complete for the whole block
}

#endif  // RNN_MMA_GEMM_CUH
