// One thread block's slice of a recurrent GEMM, for the wavefront schedules (engine/schedules).
//
//     Y[b, c] = sum_k X[b, k] * W[c, k]  (+ bias[c])      b < B, c < NC
//
// X is a (B, K) row-major operand in global memory that other blocks of the same launch may have
// written (h_{t-1}, a previous layer's output): it is read through L2 only (cp.async.cg, __ldcg),
// never through the non-coherent read-only path. W is the block's NC rows of a packed weight
// (N, K), read-only for the whole run: either resident in shared memory (rnn_load_resident, rows of
// stride rnn_row_stride(K), zero past K and past NC) or in global memory. Y is global.
//
// Two shapes of the same product, picked by the generator at compile time:
//
// rnn_warp_gemvs<BR, CW, VEC, MODE, NJ, KSTEPS> for a few batch rows (B <= 4), all NJ GEMMs of a stage
//   in one call: a warp owns CW columns of each; its lanes split K four columns at a time, hold X in
//   registers (read straight from L2, shared by the warp's columns) and sum their partial dot
//   products with a butterfly of shuffles (a fixed order: bit-identical run to run). No staging, no
//   block-wide barrier inside. Every lane issues its X loads of all the GEMMs, KSTEPS x 128 columns
//   of K at a time, before its first product: the step waits for one L2 round trip, not one per
//   128 columns per GEMM (a step of `lat` is a chain of such latencies).
//
// rnn_tile_gemms<RB, RC, VEC, STAGES, KC, N> for many rows, all N GEMMs of a stage in one call: a
//   thread holds an RB x RC tile of accumulators, rows bg + r * nbg and columns cg + c * ncg
//   (strided, so that consecutive threads read consecutive rows of W and the float4 reads of shared
//   memory are conflict-free); X, and W when it is not resident, are staged in chunks of KC
//   columns through a STAGES-deep cp.async pipeline that runs across the GEMMs, so that later
//   chunks travel while earlier ones are multiplied. When the block has more threads than tiles, K
//   is split among them (interleaved by fours) and the partial sums are reduced through shared
//   memory in a fixed order, 16 values of every tile at a time (rnn_store_tile).
//
// Shared memory rows, resident or staged, are padded to a multiple of 4 floats plus 4 more: row r
// starts 16 bytes after row r - 1 modulo 128, so 8 threads reading 8 rows with float4 hit 8
// different bank groups.
//
// VEC = 4 when every K and row stride is a multiple of 4 (16-byte copies and loads), else 1.
//
// Precision modes (engine/codegen/precision.py): MODE is RNN_FP32 (FFMA, the default), RNN_TF32,
// RNN_FP16, RNN_BF16 or RNN_TF32X3. In RNN_TF32/FP16/BF16 every operand is rounded to the mode's format as it
// enters a product (rnn_operand), so the warp GEMV computes exactly what the tensor-core MMA of mma_gemm.cuh
// computes for many rows; fp16/bf16 weights are stored as 16-bit patterns (unsigned short). RNN_TF32X3
// (3xTF32, fp32 accuracy on TF32 tensor cores) keeps fp32 weights unrounded and splits the operands into two
// TF32 parts inside the MMA path only (mma_gemm.cuh rnn_tf32_split); its warp GEMV of few rows multiplies the
// unrounded fp32 values with FFMA, strict fp32 (rnn_operand is the identity): slightly more accurate than the
// split, and the few-rows path has no tensor-core time to save.
#ifndef RNN_TILE_GEMM_CUH
#define RNN_TILE_GEMM_CUH

#define RNN_FP32 0
#define RNN_TF32 1
#define RNN_FP16 2
#define RNN_BF16 3
#define RNN_TF32X3 4

// Whether the mode's tensor-core operands are fp32 values in TF32 MMAs (rounded once, or split in two).
__host__ __device__ constexpr bool rnn_tf32_mma(int mode) { return mode == RNN_TF32 || mode == RNN_TF32X3; }

__host__ __device__ constexpr int rnn_round_up(int value, int multiple) { return (value + multiple - 1) / multiple * multiple; }

// Floats between consecutive rows of a shared-memory operand of k columns.
__host__ __device__ constexpr int rnn_row_stride(int k) { return rnn_round_up(k, 4) + 4; }

// Asks L2 to fetch the 128-byte lines of count floats from p: a hint, no effect on any result (the cell math of a
// layer-by-layer launch reads its cuBLAS projections from DRAM after the GEMMs; this starts that read before them).
__device__ __forceinline__ void rnn_prefetch_l2(const float* p, int count)
{
    for (int i = 0; i < count; i += 32) asm volatile("prefetch.global.L2 [%0];" :: "l"(p + i));
    if (count > 0) asm volatile("prefetch.global.L2 [%0];" :: "l"(p + count - 1));    // a line the segment ends in
}

// The type of a packed weight element, and the elements between rows of a resident (or staged) weight of
// k columns: fp32 as above; tf32 a multiple of 8 plus 4 and fp16/bf16 a multiple of 16 plus 8, so that the
// eight rows an MMA fragment reads at once start in eight different bank groups, and K is zero-padded to
// whole MMA steps.
template <int MODE> struct RnnWeight { using type = float; };
template <> struct RnnWeight<RNN_FP16> { using type = unsigned short; };
template <> struct RnnWeight<RNN_BF16> { using type = unsigned short; };
template <int MODE>
__host__ __device__ constexpr int rnn_wstride(int k)
{
    return MODE == RNN_FP32 ? rnn_row_stride(k) : rnn_tf32_mma(MODE) ? rnn_round_up(k, 8) + 4 : rnn_round_up(k, 16) + 8;
}

__device__ __forceinline__ unsigned rnn_tf32_bits(float v)
{
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}
__device__ __forceinline__ float rnn_half_to_float(unsigned short h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ float rnn_bf16_to_float(unsigned short h) { return __uint_as_float((unsigned)h << 16); }

// The 16-bit pattern of v rounded to nearest even in fp16 or bf16: a weight, or the 16-bit copy of a GEMM
// operand the cell code writes beside the fp32 value (engine/codegen/wavefront.py).
template <int MODE>
__device__ __forceinline__ unsigned short rnn_bits16(float v)
{
    static_assert(MODE == RNN_FP16 || MODE == RNN_BF16, "16-bit modes only");
    unsigned short h;
    if constexpr (MODE == RNN_FP16) asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    else asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}

// float32x3's two 11-bit parts of v held as fp16 (engine/rounding.py split_fp16): hi = fp16(tf32(v)), lo =
// fp16(tf32(v - hi) * 2^11), lo from hi as stored. Returns whether v is past fp16's range (|v| > 65504: no fp16 hi).
__device__ __forceinline__ bool rnn_split_fp16(const float v, unsigned short& hi, unsigned short& lo)
{
    hi = rnn_bits16<RNN_FP16>(__uint_as_float(rnn_tf32_bits(v)));
    lo = rnn_bits16<RNN_FP16>(__uint_as_float(rnn_tf32_bits(v - rnn_half_to_float(hi))) * 2048.0f);
    return fabsf(v) > 65504.0f;
}

// tf32's step operand held as fp16 (engine/schedules/tf32_fp16.py): h = fp16(tf32(v) * 2^10), exact for |v| from 2^-24
// to ~64 (a TF32 value has fp16's 11 significant bits). Returns whether v is past that (|tf32(v) * 2^10| > 65504).
__device__ __forceinline__ bool rnn_tf32_fp16(const float v, unsigned short& h)
{
    const float s = __uint_as_float(rnn_tf32_bits(v)) * 1024.0f;
    h = rnn_bits16<RNN_FP16>(s);
    return fabsf(s) > 65504.0f;
}

// Where element (b, k) of a matrix of ld columns of BYTES-byte elements sits in the wgmma products' tiles
// (kernels/x3_wgmma.cu, kernels/mode_wgmma.cu, engine/schedules/wgmma_products.py): blocks of 64 rows, each as tiles of 64
// rows x 128 bytes (ld rounded up to whole tiles), in a tile row r's 16-byte group c at group c ^ (r % 8)
// (engine/schedules/base.py chunked).
template <int BYTES>
__device__ __forceinline__ long rnn_tile_at(const long b, const long k, const long ld)
{
    constexpr long cols = 128 / BYTES, group = 16 / BYTES;     // a tile's columns, a 16-byte group's elements
    const long tiles = (ld + cols - 1) / cols;
    return ((b >> 6) * tiles + k / cols) * 64 * cols + (b & 63) * cols + (((k / group) % 8) ^ (b & 7)) * group + k % group;
}

// v as it enters a product in this mode (exactly representable in the mode's format, held as a float); fp32 and
// float32x3 (whose warp GEMV is strict fp32): v itself.
template <int MODE>
__device__ __forceinline__ float rnn_operand(float v)
{
    if constexpr (MODE == RNN_TF32) {
        return __uint_as_float(rnn_tf32_bits(v));
    } else if constexpr (MODE == RNN_FP16) {
        return rnn_half_to_float(rnn_bits16<MODE>(v));
    } else if constexpr (MODE == RNN_BF16) {
        return rnn_bf16_to_float(rnn_bits16<MODE>(v));
    } else {
        return v;
    }
}
template <int MODE>
__device__ __forceinline__ float4 rnn_operand4(float4 v)
{
    return make_float4(rnn_operand<MODE>(v.x), rnn_operand<MODE>(v.y), rnn_operand<MODE>(v.z), rnn_operand<MODE>(v.w));
}

// Four consecutive weights as floats: one 16-byte (fp32, tf32) or 8-byte (fp16, bf16) load. GLOBAL: through
// the read-only path (the weights never change during a run).
template <int MODE, bool GLOBAL>
__device__ __forceinline__ float4 rnn_weight4(const typename RnnWeight<MODE>::type* p)
{
    if constexpr (MODE == RNN_FP16 || MODE == RNN_BF16) {
        const uint2 bits = GLOBAL ? __ldg(reinterpret_cast<const uint2*>(p)) : *reinterpret_cast<const uint2*>(p);
        const unsigned short h[4] = {(unsigned short)(bits.x & 0xFFFF), (unsigned short)(bits.x >> 16),
                                     (unsigned short)(bits.y & 0xFFFF), (unsigned short)(bits.y >> 16)};
        float f[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) f[i] = MODE == RNN_FP16 ? rnn_half_to_float(h[i]) : rnn_bf16_to_float(h[i]);
        return make_float4(f[0], f[1], f[2], f[3]);
    } else {
        return GLOBAL ? __ldg(reinterpret_cast<const float4*>(p)) : *reinterpret_cast<const float4*>(p);
    }
}
template <int MODE>
__device__ __forceinline__ float rnn_weight1(const typename RnnWeight<MODE>::type* p)
{
    if constexpr (MODE == RNN_FP16) return rnn_half_to_float(__ldg(p));
    else if constexpr (MODE == RNN_BF16) return rnn_bf16_to_float(__ldg(p));
    else return __ldg(p);
}

__device__ __forceinline__ void rnn_cp_async16(float* smem_dst, const float* global_src)
{
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global_src) : "memory");
}
__device__ __forceinline__ void rnn_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void rnn_cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ float rnn_dot4(float4 a, float4 b, float acc)
{
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    return fmaf(a.w, b.w, acc);
}

// Copies the block's NC rows of W (N, K), from row 0 of w, into shared memory as ws[c * rnn_wstride<MODE>(K) + k],
// zeros past K and for rows NC..ncp-1.
template <int MODE = RNN_FP32, typename T>
__device__ void rnn_load_resident(T* __restrict__ ws, const T* __restrict__ w, long ldw, int K, int NC, int ncp)
{
    const int ld = rnn_wstride<MODE>(K);
    for (int i = threadIdx.x; i < ncp * ld; i += blockDim.x) {
        const int c = i / ld;            // consecutive threads read consecutive k of one row: coalesced
        const int k = i - c * ld;
        ws[i] = c < NC && k < K ? __ldg(w + (long)c * ldw + k) : T(0);
    }
}

// ---- few rows: a warp per CW columns, lanes over K -----------------------------------------------------
// One GEMM of a stage for rnn_warp_gemvs: Y[b, c] = X[b, :] . W[c, :] (+ bias[c]) for c < NC, X (BR, K) with
// row stride ldx, W (NC, K) in global memory (Wg, row stride ldw) or resident (Ws, rows rnn_wstride<MODE>(K)).
template <int MODE>
struct RnnGemvJob {
    const float* X;
    long ldx;
    int K;
    const typename RnnWeight<MODE>::type* Wg;
    long ldw;
    const typename RnnWeight<MODE>::type* Ws;
    int NC;
    float* Y;
    long ldy;
    const float* bias;
};

// Four consecutive elements of row `row` from k: one 16-byte load (VEC = 4, k < K) or four guarded ones.
template <int VEC>
__device__ __forceinline__ float4 rnn_x4(const float* row, int k, int K)
{
    if (k >= K) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (VEC == 4) return __ldcg(reinterpret_cast<const float4*>(row + k));
    return make_float4(__ldcg(row + k), k + 1 < K ? __ldcg(row + k + 1) : 0.0f,
                       k + 2 < K ? __ldcg(row + k + 2) : 0.0f, k + 3 < K ? __ldcg(row + k + 3) : 0.0f);
}

// RESIDENT: bit g set when job g's weight is resident (Ws), clear when it is read from global memory (Wg): known
// when the kernel is generated, so that the weight loads of a step are straight-line code the compiler can batch.
// Columns past NC (a warp's last ones, or a short last block) compute on row NC - 1 and are not written.
template <int BR, int CW, int VEC, int MODE, int NJ, int KSTEPS, unsigned RESIDENT>
__device__ void rnn_warp_gemvs(const RnnGemvJob<MODE> (&jobs)[NJ])
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float acc[NJ][CW][BR];
    float bias[NJ][CW];                    // read before the products: off the step's latency chain
    int kmax = 0;
#pragma unroll
    for (int g = 0; g < NJ; ++g) {
        kmax = max(kmax, jobs[g].K);
#pragma unroll
        for (int j = 0; j < CW; ++j) {
            const int c = warp + j * warps;
            bias[g][j] = lane == 0 && jobs[g].bias && c < jobs[g].NC ? __ldg(jobs[g].bias + c) : 0.0f;
#pragma unroll
            for (int b = 0; b < BR; ++b) acc[g][j][b] = 0.0f;
        }
    }
    for (int k0 = lane * 4; k0 < kmax; k0 += 128 * KSTEPS) {
        float4 xv[NJ][KSTEPS][BR];         // every load of this pass in flight at once
#pragma unroll
        for (int g = 0; g < NJ; ++g)
#pragma unroll
            for (int s = 0; s < KSTEPS; ++s)
#pragma unroll
                for (int b = 0; b < BR; ++b)
                    xv[g][s][b] = rnn_operand4<MODE>(
                        rnn_x4<VEC>(jobs[g].X + (long)b * jobs[g].ldx, k0 + s * 128, jobs[g].K));
#pragma unroll
        for (int g = 0; g < NJ; ++g) {
            const int K = jobs[g].K, ldr = rnn_wstride<MODE>(K), last = jobs[g].NC - 1;
#pragma unroll
            for (int s = 0; s < KSTEPS; ++s) {
                const int k = k0 + s * 128;
                if (k >= K) break;
                float4 wv[CW];
#pragma unroll
                for (int j = 0; j < CW; ++j) {
                    const int c = min(warp + j * warps, last);
                    if ((RESIDENT >> g) & 1u) {            // g is a constant once unrolled: no branch
                        wv[j] = rnn_weight4<MODE, false>(jobs[g].Ws + (long)c * ldr + k);
                    } else if (VEC == 4) {
                        wv[j] = rnn_weight4<MODE, true>(jobs[g].Wg + (long)c * jobs[g].ldw + k);
                    } else {
                        const auto* row = jobs[g].Wg + (long)c * jobs[g].ldw + k;
                        wv[j].x = rnn_weight1<MODE>(row);
                        wv[j].y = k + 1 < K ? rnn_weight1<MODE>(row + 1) : 0.0f;
                        wv[j].z = k + 2 < K ? rnn_weight1<MODE>(row + 2) : 0.0f;
                        wv[j].w = k + 3 < K ? rnn_weight1<MODE>(row + 3) : 0.0f;
                    }
                }
#pragma unroll
                for (int j = 0; j < CW; ++j)
#pragma unroll
                    for (int b = 0; b < BR; ++b) acc[g][j][b] = rnn_dot4(xv[g][s][b], wv[j], acc[g][j][b]);
            }
        }
    }
#pragma unroll
    for (int g = 0; g < NJ; ++g)
#pragma unroll
        for (int j = 0; j < CW; ++j) {
            const int c = warp + j * warps;
#pragma unroll
            for (int b = 0; b < BR; ++b) {
                float v = acc[g][j][b];
#pragma unroll
                for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
                if (lane == 0 && c < jobs[g].NC) jobs[g].Y[(long)b * jobs[g].ldy + c] = v + bias[g][j];
            }
        }
}

// ---- many rows: register tiles over staged chunks --------------------------------------------------------
// One GEMM of a stage, for rnn_tile_gemms / rnn_mma_gemms: X (B, K) and W (NC, K) with row stride K; Ws its
// resident copy or null. XT: fp32, or the 16-bit copy of X on the fp16/bf16 tensor-core path (mma_gemm.cuh).
template <typename WT, typename XT = float>
struct RnnGemmT {
    const XT* X;
    const WT* W;
    const WT* Ws;
    float* Y;
    long ldy;
    const float* bias;
    int K, NC;
    int NCT;    // the columns its tiles cover (rnn_tile_gemms): NC of every block but a last, narrower one; 0: NC
};
using RnnGemm = RnnGemmT<float>;

// The columns a GEMM's tiles cover. A compile-time constant when NCT is (the generator writes 4 * UNITS, say): the
// tile counts, the K split and the trip count of the multiply loop then fold to constants, in every block alike.
// Tiles past NC compute on rows of W that are zero (resident) or stale (streamed) and are never stored.
template <typename WT, typename XT>
__device__ __forceinline__ int rnn_tile_cols(const RnnGemmT<WT, XT>& J) { return J.NCT > 0 ? J.NCT : J.NC; }

// Stages columns [k0, k0 + kc) of `rows` rows of a global operand (row stride lds) into dst[r * ld + k],
// zeros for k in [kc, round_up(kc, 4)). VEC = 4: 16-byte cp.async copies through L2, a thread taking
// quad threadIdx % (KC / 4) of every (blockDim / (KC / 4))-th row; else plain loads.
template <int VEC, int KC>
__device__ __forceinline__ void rnn_stage_rows(float* __restrict__ dst, int ld, const float* __restrict__ src, long lds,
                                               int rows, int k0, int kc)
{
    if (VEC == 4) {
        constexpr int QK = KC / 4;
        const int q = threadIdx.x % QK;
        if (4 * q < kc) {
            for (int r = threadIdx.x / QK; r < rows; r += blockDim.x / QK)
                rnn_cp_async16(dst + r * ld + 4 * q, src + (long)r * lds + k0 + 4 * q);
        }
    } else {
        const int kc4 = rnn_round_up(kc, 4);
        for (int i = threadIdx.x; i < rows * kc4; i += blockDim.x) {
            const int r = i / kc4, k = i - r * kc4;
            dst[r * ld + k] = k < kc ? __ldcg(src + (long)r * lds + k0 + k) : 0.0f;
        }
    }
}

// How a block's threads cover one GEMM: nbg x ncg tiles of RB x RC; K split `split` ways when the
// tiles are fewer than the threads, else `passes` rounds of tiles. The split is the largest power of two the
// threads allow that divides a chunk's KC / 4 k-steps, so that every part runs the same unrolled steps of a whole
// chunk (rnn_mma_chunk): 416 threads over 32 tiles split 8 ways, not 13 (GRU-Cho's one-gate GEMM at blogB), the
// other threads idle. (A fixed-trip loop, so that it folds to a constant like the rest.)
template <int RB, int RC>
struct RnnTiles {
    int nbg, ncg, groups, split, passes;
    __device__ RnnTiles(int B, int NC, int ksteps)
    {
        nbg = rnn_round_up(B, RB) / RB;
        ncg = rnn_round_up(NC, RC) / RC;
        groups = nbg * ncg;
        const int most = groups >= (int)blockDim.x ? 1 : (int)blockDim.x / groups;
        split = 1;
#pragma unroll
        for (int d = 2; d <= 64; d *= 2)
            if (d <= most && ksteps % d == 0) split = d;
        passes = split > 1 ? 1 : (groups + blockDim.x - 1) / blockDim.x;
    }
};

// Which tile (row group bg, column group cg) slot `slot` computes. Where the tiles come in whole 4 x 8 blocks (ncg a
// multiple of 8, nbg of 4), each 32 consecutive slots (a warp) take one block, so arranged that every half-warp reads
// four X rows and eight W rows per float4 load, each quarter-warp two rows of X and four of W, the two quarters
// disjoint: a quarter's 16-byte reads then fall in bank groups its partner does not touch, and each half-warp is
// served in one shared-memory wavefront (ncu on `large`: the row-major order, eight W rows in every quarter, took
// four wavefronts per W load, two per X load). Otherwise row-major: bg = slot / ncg, cg = slot % ncg.
template <int RB, int RC>
__device__ __forceinline__ void rnn_tile_of(const RnnTiles<RB, RC>& tl, int slot, int& bg, int& cg)
{
    if (tl.ncg % 8 == 0 && tl.nbg % 4 == 0) {
        const int warp = slot >> 5, lane = slot & 31, blocks_c = tl.ncg >> 3;
        const int half = lane >> 4, quarter = (lane >> 3) & 1, i = lane & 7;
        bg = (warp / blocks_c) * 4 + quarter * 2 + (i >> 2);
        cg = (warp % blocks_c) * 8 + (quarter ^ half) * 4 + (i & 3);
    } else {
        bg = slot / tl.ncg;
        cg = slot % tl.ncg;
    }
}

// Where the staging of a stage's chunks has got to: GEMM `job`, K chunk `chunk`, chunks `left` in this GEMM
// (its chunks times its passes over the tiles). Walked one chunk at a time, so there is no division per chunk.
struct RnnCursor {
    int job, chunk, left;
};

// The multiply-accumulate of one staged chunk into a thread's tile. The shared-memory reads of step
// k + k_step are issued before the FMAs of step k (two register sets), so their latency hides behind
// the arithmetic even with one warp per scheduler.
template <int RB, int RC>
__device__ __forceinline__ void rnn_mma_load(float4 (&xv)[RB], float4 (&wv)[RC], const float* __restrict__ xr, int xstep,
                                             const float* __restrict__ wr, long wstep, int k)
{
#pragma unroll
    for (int r = 0; r < RB; ++r) xv[r] = *reinterpret_cast<const float4*>(xr + r * xstep + k);
#pragma unroll
    for (int c = 0; c < RC; ++c) wv[c] = *reinterpret_cast<const float4*>(wr + c * wstep + k);
}

// Four k at a time, k outermost: RB x RC independent FMAs between two that depend on each other (the
// sum of every output still runs over k in order, so results do not depend on the tiling of the loop).
template <int RB, int RC>
__device__ __forceinline__ void rnn_mma_step(float (&acc)[RB][RC], const float4 (&xv)[RB], const float4 (&wv)[RC])
{
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
        for (int r = 0; r < RB; ++r)
#pragma unroll
            for (int c = 0; c < RC; ++c)
                acc[r][c] = fmaf(reinterpret_cast<const float*>(&xv[r])[kk], reinterpret_cast<const float*>(&wv[c])[kk],
                                 acc[r][c]);
}

// `steps` (<= MAXSTEPS) k-steps of four, k = k_begin + j * k_step. The loop runs to the compile-time MAXSTEPS and
// leaves at `steps`, so it always unrolls: every shared-memory address is a register plus an immediate where k_step
// folds to a constant (the block size known through __builtin_assume, the tile counts through NCT), and the exits
// fold away too where `steps` does (a whole chunk of a K that is a multiple of KC).
template <int RB, int RC, int MAXSTEPS>
__device__ __forceinline__ void rnn_mma_chunk(float (&acc)[RB][RC], const float* __restrict__ x, int ldx,
                                              const float* __restrict__ w, int ldw, int bg, int nbg, int cg, int ncg,
                                              int k_begin, int steps, int k_step)
{
    const float* xr = x + bg * ldx + k_begin;
    const float* wr = w + (long)cg * ldw + k_begin;
    const int xstep = nbg * ldx;
    const long wstep = (long)ncg * ldw;
    if (steps <= 0) return;
    float4 xa[RB], wa[RC], xb[RB], wb[RC];
    rnn_mma_load<RB, RC>(xa, wa, xr, xstep, wr, wstep, 0);
#pragma unroll
    for (int j = 0; j < MAXSTEPS; j += 2) {
        if (j + 1 < steps) rnn_mma_load<RB, RC>(xb, wb, xr, xstep, wr, wstep, (j + 1) * k_step);
        rnn_mma_step<RB, RC>(acc, xa, wa);
        if (j + 1 >= steps) break;
        if (j + 2 < steps) rnn_mma_load<RB, RC>(xa, wa, xr, xstep, wr, wstep, (j + 2) * k_step);
        rnn_mma_step<RB, RC>(acc, xb, wb);
        if (j + 2 >= steps) break;
    }
}

// The same for a partial chunk (K not a multiple of KC) or a K split that does not divide KC: a plain loop over k in
// [k_begin, k_end) by k_step (a different shape of code on purpose, so that the compiler does not merge it with the
// unrolled whole-chunk loop above and lose that loop's constant trip count).
template <int RB, int RC>
__device__ __forceinline__ void rnn_mma_part(float (&acc)[RB][RC], const float* __restrict__ x, int ldx,
                                             const float* __restrict__ w, int ldw, int bg, int nbg, int cg, int ncg,
                                             int k_begin, int k_end, int k_step)
{
    const float* xr = x + bg * ldx;
    const float* wr = w + (long)cg * ldw;
    const int xstep = nbg * ldx;
    const long wstep = (long)ncg * ldw;
    if (k_begin >= k_end) return;
    float4 xa[RB], wa[RC], xb[RB], wb[RC];
    rnn_mma_load<RB, RC>(xa, wa, xr, xstep, wr, wstep, k_begin);
    int k = k_begin;
    for (; k + k_step < k_end; k += 2 * k_step) {
        rnn_mma_load<RB, RC>(xb, wb, xr, xstep, wr, wstep, k + k_step);
        rnn_mma_step<RB, RC>(acc, xa, wa);
        if (k + 2 * k_step < k_end) rnn_mma_load<RB, RC>(xa, wa, xr, xstep, wr, wstep, k + 2 * k_step);
        rnn_mma_step<RB, RC>(acc, xb, wb);
    }
    if (k < k_end) rnn_mma_step<RB, RC>(acc, xa, wa);     // an odd number of steps: the last is in xa, wa
}

// Writes a thread's tile of Y (+ bias); with split K, first sums the parts through `red` in a fixed order, in rounds
// of RV = min(RB * RC, 16) values of every tile: `red` holds blockDim * RV floats (16 KiB for 8x8 tiles at 256
// threads, not the 64 KiB of all 64 values at once, which pushed `mid`'s four resident layers out of shared memory).
// Every thread of the block calls it (barriers inside).
template <int RB, int RC>
__device__ __forceinline__ void rnn_store_tile(const RnnGemm& J, const RnnTiles<RB, RC>& tl, float (&acc)[RB][RC],
                                               int B, int slot, int part, bool active, float* __restrict__ red)
{
    int bg, cg;
    rnn_tile_of(tl, slot, bg, cg);
    if (tl.split == 1) {
        if (active) {
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                const int b = bg + r * tl.nbg;
#pragma unroll
                for (int c = 0; c < RC; ++c) {
                    const int col = cg + c * tl.ncg;
                    if (b < B && col < J.NC) J.Y[(long)b * J.ldy + col] = acc[r][c] + (J.bias ? __ldg(J.bias + col) : 0.0f);
                }
            }
        }
        return;
    }
    constexpr int V = RB * RC, RV = V < 16 ? V : 16;
    const int stride = tl.split * tl.groups;
#pragma unroll
    for (int v0 = 0; v0 < V; v0 += RV) {
        if (active) {
#pragma unroll
            for (int i = 0; i < RV; ++i) red[i * stride + part * tl.groups + slot] = acc[(v0 + i) / RC][(v0 + i) % RC];
        }
        __syncthreads();
        for (int e = threadIdx.x; e < RV * tl.groups; e += blockDim.x) {
            const int i = e / tl.groups, s = e - i * tl.groups, rc = v0 + i;
            int sb, sc;
            rnn_tile_of(tl, s, sb, sc);
            const int b = sb + (rc / RC) * tl.nbg, col = sc + (rc % RC) * tl.ncg;
            if (b >= B || col >= J.NC) continue;
            float v = red[i * stride + s];
            for (int p = 1; p < tl.split; ++p) v += red[i * stride + p * tl.groups + s];
            J.Y[(long)b * J.ldy + col] = v + (J.bias ? __ldg(J.bias + col) : 0.0f);
        }
        __syncthreads();                               // red is written again by the next round or GEMM
    }
}

// jobs[j] for a j known only at run time, by selects over the unrolled jobs: indexing the array with j would
// put it in local memory.
template <typename Job, int N>
__device__ __forceinline__ Job rnn_select(const Job (&jobs)[N], int j)
{
    Job J = jobs[0];
#pragma unroll
    for (int i = 1; i < N; ++i) {
        const bool hit = i == j;
        J.X = hit ? jobs[i].X : J.X;
        J.W = hit ? jobs[i].W : J.W;
        J.Ws = hit ? jobs[i].Ws : J.Ws;
        J.K = hit ? jobs[i].K : J.K;
        J.NC = hit ? jobs[i].NC : J.NC;
        J.NCT = hit ? jobs[i].NCT : J.NCT;
    }
    return J;                                          // (Y, ldy and bias are jobs[0]'s: staging does not use them)
}

// Stages the chunk under the cursor `at` (X rows, and W rows when W is not resident) into `slot`; moves the cursor.
// Chunks of one GEMM in a stage's stream: its K chunks, once per pass over its tiles.
template <int RB, int RC, int KC>
__device__ __forceinline__ int rnn_chunk_count(const RnnGemm& J, int B)
{
    return RnnTiles<RB, RC>(B, rnn_tile_cols(J), KC / 4).passes * ((J.K + KC - 1) / KC);
}

template <int RB, int RC, int VEC, int KC, int N>
__device__ __forceinline__ void rnn_stage_next(const RnnGemm (&jobs)[N], RnnCursor& at, float* __restrict__ slot,
                                               int ld, int B, int bp)
{
    const RnnGemm J = rnn_select(jobs, at.job);
    const int k0 = at.chunk * KC, kc = min(KC, J.K - k0);
    rnn_stage_rows<VEC, KC>(slot, ld, J.X, J.K, B, k0, kc);
    if (!J.Ws) rnn_stage_rows<VEC, KC>(slot + bp * ld, ld, J.W, J.K, J.NC, k0, kc);
    if (++at.chunk * KC >= J.K) at.chunk = 0;
    if (--at.left == 0 && ++at.job < N) at.left = rnn_chunk_count<RB, RC, KC>(rnn_select(jobs, at.job), B);
}

// Every GEMM of one stage (they are independent: each reads values of earlier stages) as one stream of
// K chunks through a STAGES-deep cp.async pipeline (STAGES >= 2): the chunks of the next GEMM travel
// while the last chunks of this one are multiplied. One barrier per chunk: after it, chunk g is in
// shared memory for everyone and nobody reads chunk g - 1 any more, whose slot is refilled at once.
// Shared memory (floats, from smem): STAGES slots of (bp + ncs) * rnn_row_stride(KC), with ncs the
// widest streamed W (0 when all are resident), then the split-K partial sums (blockDim * min(RB * RC, 16)).
template <int RB, int RC, int VEC, int STAGES, int KC, int N>
__device__ void rnn_tile_gemms(const RnnGemm (&jobs)[N], int B, float* __restrict__ smem, int ncs)
{
    const int bp = rnn_round_up(B, RB);
    constexpr int ld = rnn_row_stride(KC);
    const int slot_floats = (bp + ncs) * ld;
    float* red = smem + STAGES * slot_floats;
    int total = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) total += rnn_chunk_count<RB, RC, KC>(jobs[j], B);
    RnnCursor at{0, 0, rnn_chunk_count<RB, RC, KC>(jobs[0], B)};

    __syncthreads();                                   // nobody still reads what the slots held before
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < total) rnn_stage_next<RB, RC, VEC, KC>(jobs, at, smem + (s % STAGES) * slot_floats, ld, B, bp);
        rnn_cp_async_commit();                         // an empty group when there is nothing left: counts stay uniform
    }
    float acc[RB][RC];
#pragma unroll
    for (int r = 0; r < RB; ++r)
#pragma unroll
        for (int c = 0; c < RC; ++c) acc[r][c] = 0.0f;
    int g = 0;
#pragma unroll
    for (int i = 0; i < N; ++i) {                      // unrolled: jobs[i] and its tiling stay in registers
        const RnnGemm& J = jobs[i];
        const RnnTiles<RB, RC> tl(B, rnn_tile_cols(J), KC / 4);
        const int chunks = (J.K + KC - 1) / KC;
        const bool resident = J.Ws != nullptr;
        const int ldw = resident ? rnn_row_stride(J.K) : ld;
        for (int pass = 0; pass < tl.passes; ++pass) {
            const int slot = tl.split > 1 ? (int)threadIdx.x % tl.groups : pass * (int)blockDim.x + (int)threadIdx.x;
            const int part = tl.split > 1 ? (int)threadIdx.x / tl.groups : 0;
            const bool active = slot < tl.groups && part < tl.split;
            int bg, cg;
            rnn_tile_of(tl, slot, bg, cg);
            for (int chunk = 0; chunk < chunks; ++chunk, ++g) {
                rnn_cp_async_wait<STAGES - 2>();       // chunk g has landed (this thread's copies)
                __syncthreads();                       // ... everyone's; and chunk g - 1 is no longer read
                if (g + STAGES - 1 < total)                 // into the slot chunk g - 1 used
                    rnn_stage_next<RB, RC, VEC, KC>(jobs, at, smem + ((g + STAGES - 1) % STAGES) * slot_floats, ld, B, bp);
                rnn_cp_async_commit();
                const int k0 = chunk * KC, kc4 = rnn_round_up(min(KC, J.K - k0), 4);
                const float* x = smem + (g % STAGES) * slot_floats;
                const float* w = resident ? J.Ws + k0 : x + bp * ld;
                if (active) {
                    const int k_step = 4 * tl.split, k_begin = 4 * part;       // k_begin < k_step
                    if (kc4 == KC && KC % k_step == 0)       // a whole chunk: as many steps for every part
                        rnn_mma_chunk<RB, RC, KC / 4>(acc, x, ld, w, ldw, bg, tl.nbg, cg, tl.ncg, k_begin, KC / k_step,
                                                      k_step);
                    else
                        rnn_mma_part<RB, RC>(acc, x, ld, w, ldw, bg, tl.nbg, cg, tl.ncg, k_begin, kc4, k_step);
                }
            }
            rnn_store_tile<RB, RC>(J, tl, acc, B, slot, part, active, red);
#pragma unroll
            for (int r = 0; r < RB; ++r)
#pragma unroll
                for (int c = 0; c < RC; ++c) acc[r][c] = 0.0f;
        }
    }
    rnn_cp_async_wait<0>();                            // only empty groups remain
    __syncthreads();                                   // Y is complete for the whole block; the slots are free
}

#endif  // RNN_TILE_GEMM_CUH
