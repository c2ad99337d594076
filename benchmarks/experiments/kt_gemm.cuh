// The fp32 register-tile GEMM with k-major operands in shared memory, for the wavefront schedules.
//
//     Y[b, c] = sum_k X[b, k] * W[c, k]  (+ bias[c])      b < B, c < NC
//
// Same product and operands as rnn_tile_gemms (kernels/tile_gemm.cuh); what differs is the layout in shared
// memory. Both operands sit there k-major (element (row, k) at k * ld + row), so a thread reads the RB rows of X
// and the RC columns of W it needs at one k with RB / 4 + RC / 4 float4 loads, and holds only those in registers
// (rnn_tile_gemms holds four k of every row and column: 8 x 8 tiles then needed 254 registers and two warps a
// scheduler). Resident weights are transposed once as they are loaded; X (and a streamed W) is staged chunk by
// chunk through registers: a thread issues the L2 loads of chunk g + 1 before it multiplies chunk g and writes them,
// transposed, after (two slots, one block barrier a chunk).
//
// A thread's tile: rows 4 tr + i + 4 nbg j (i < 4, j < RB / 4), columns 4 tc + i + 4 ncg j, so its loads are
// float4s of consecutive rows; in whole 4 x 8 blocks of tiles per warp where the tile grid allows, a warp's loads of
// one k touch 4 float4s of X and 8 of W, one shared-memory wavefront each. When the block has more threads than
// tiles, K is split among them: part p takes k in [p KC / split, (p + 1) KC / split) of every chunk, and the parts'
// sums are added in a fixed order through shared memory (bit-identical run to run).
//
// RB, RC: 4 or 8. B, THREADS, NCS (the widest streamed W, 0: all resident) are the kernel's compile-time constants.
#ifndef RNN_KT_GEMM_CUH
#define RNN_KT_GEMM_CUH

// The K chunk a block starts at (the reverted rotation experiment's helper; 0: every block from chunk 0).
template <int KC>
__device__ __forceinline__ int rnn_first_chunk(int) { return 0; }

#ifndef RNN_KT_LOAD
#define RNN_KT_LOAD 0
#endif
__device__ __forceinline__ float4 rnn_kt_ld4(const float* p)
{
#if RNN_KT_LOAD == 0
    return __ldcg(reinterpret_cast<const float4*>(p));
#else
    float4 v;
#if RNN_KT_LOAD == 1
    asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
#else
    asm volatile("ld.global.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
#endif
    return v;
#endif
}

// Floats between k-rows of a k-major shared operand of `cols` rows (batch rows of X, columns of W).
__host__ __device__ constexpr int rnn_kt_stride(int cols) { return rnn_round_up(cols, 4) + 4; }

// Copies the block's NC rows of W (N, K), from row 0 of w, into shared memory k-major: ws[k * rnn_kt_stride(ncp) + c],
// zeros for columns NC..ncp-1.
__device__ void rnn_load_resident_kt(float* __restrict__ ws, const float* __restrict__ w, long ldw, int K, int NC, int ncp)
{
    const int ld = rnn_kt_stride(ncp);
    for (int i = threadIdx.x; i < K * ncp; i += blockDim.x) {
        const int c = i / K, k = i - c * K;    // consecutive threads read consecutive k of one row: coalesced
        ws[k * ld + c] = c < NC ? __ldg(w + (long)c * ldw + k) : 0.0f;
    }
}

template <int RB, int RC>
struct RnnKtTiles {
    int nbg, ncg, groups, split;
    __device__ RnnKtTiles(int bp, int nct, int kc)
    {
        nbg = bp / RB;
        ncg = nct / RC;
        groups = nbg * ncg;
        const int most = groups >= (int)blockDim.x ? 1 : (int)blockDim.x / groups;
        split = 1;
#pragma unroll
        for (int d = 2; d <= 32; d *= 2)
            if (d <= most && kc % (2 * d) == 0) split = d;     // at least two k a part
    }
    // Tile slot -> row group tr, column group tc: whole 4 x 8 blocks of tiles per warp where they fit, else row-major.
    __device__ __forceinline__ void of(int slot, int& tr, int& tc) const
    {
        if (nbg % 4 == 0 && ncg % 8 == 0) {
            const int warp = slot >> 5, lane = slot & 31, blocks_c = ncg >> 3;
            tr = (warp / blocks_c) * 4 + (lane >> 3);
            tc = (warp % blocks_c) * 8 + (lane & 7);
        } else {
            tr = slot / ncg;
            tc = slot - tr * ncg;
        }
    }
};

// One k of a thread's tile: RB / 4 float4s of X, RC / 4 of W.
template <int RB, int RC>
__device__ __forceinline__ void rnn_kt_load(float4 (&xv)[RB / 4], float4 (&wv)[RC / 4], const float* __restrict__ x,
                                            int xstep, const float* __restrict__ w, int wstep)
{
#pragma unroll
    for (int j = 0; j < RB / 4; ++j) xv[j] = *reinterpret_cast<const float4*>(x + j * xstep);
#pragma unroll
    for (int j = 0; j < RC / 4; ++j) wv[j] = *reinterpret_cast<const float4*>(w + j * wstep);
}

template <int RB, int RC>
__device__ __forceinline__ void rnn_kt_fma(float (&acc)[RB][RC], const float4 (&xv)[RB / 4], const float4 (&wv)[RC / 4])
{
#pragma unroll
    for (int r = 0; r < RB; ++r)
#pragma unroll
        for (int c = 0; c < RC; ++c)
            acc[r][c] = fmaf(reinterpret_cast<const float*>(&xv[r >> 2])[r & 3],
                             reinterpret_cast<const float*>(&wv[c >> 2])[c & 3], acc[r][c]);
}

// k = 0 .. steps-1 of x[k * ldx], w[k * ldw] (steps <= MAXSTEPS; unrolled to MAXSTEPS with exits at steps, so every
// address is a register plus an immediate), the loads of k + 1 in flight during the FMAs of k.
template <int RB, int RC, int MAXSTEPS>
__device__ __forceinline__ void rnn_kt_chunk(float (&acc)[RB][RC], const float* __restrict__ x, int ldx, int xstep,
                                             const float* __restrict__ w, int ldw, int wstep, int steps)
{
    if (steps <= 0) return;
    float4 xa[RB / 4], wa[RC / 4], xb[RB / 4], wb[RC / 4];
    rnn_kt_load<RB, RC>(xa, wa, x, xstep, w, wstep);
#pragma unroll
    for (int k = 0; k < MAXSTEPS; k += 2) {
        if (k + 1 < steps) rnn_kt_load<RB, RC>(xb, wb, x + (k + 1) * ldx, xstep, w + (k + 1) * ldw, wstep);
        rnn_kt_fma<RB, RC>(acc, xa, wa);
        if (k + 1 >= steps) break;
        if (k + 2 < steps) rnn_kt_load<RB, RC>(xa, wa, x + (k + 2) * ldx, xstep, w + (k + 2) * ldw, wstep);
        rnn_kt_fma<RB, RC>(acc, xb, wb);
        if (k + 2 >= steps) break;
    }
}

// A partial chunk (K not a multiple of KC): a plain loop, a different shape on purpose (see rnn_mma_part).
template <int RB, int RC>
__device__ __forceinline__ void rnn_kt_part(float (&acc)[RB][RC], const float* __restrict__ x, int ldx, int xstep,
                                            const float* __restrict__ w, int ldw, int wstep, int steps)
{
    for (int k = 0; k < steps; ++k) {
        float4 xv[RB / 4], wv[RC / 4];
        rnn_kt_load<RB, RC>(xv, wv, x + k * ldx, xstep, w + k * ldw, wstep);
        rnn_kt_fma<RB, RC>(acc, xv, wv);
    }
}

// The staging of one chunk through registers: ITEMS float4s (or floats, VEC = 1) a thread, of X's B rows and (when
// W is streamed) W's NC rows, columns [k0, k0 + kc). Item e: row e % 8 + 8 (e / (8 QK)), quad (e / 8) % QK, so that
// four lanes read 64 consecutive bytes of a row and the transposed stores hit two lanes a bank at most.
template <int VEC, int KC, int B, int NCS, int THREADS>
struct RnnKtStage {
    static constexpr int QK = VEC == 4 ? KC / 4 : KC;            // items a row
    static constexpr int ROWS = rnn_round_up(B, 8) + rnn_round_up(NCS, 8);
    static constexpr int ITEMS = (ROWS * QK + THREADS - 1) / THREADS;
    float4 v[ITEMS];

    __device__ __forceinline__ static void where(int e, int& row, int& q)
    {
#ifdef RNN_KT_ROWMAJOR_ITEMS
        row = e / QK;
        q = e % QK;
#else
        row = (e & 7) + 8 * (e / (8 * QK));
        q = (e >> 3) % QK;
#endif
    }
    __device__ __forceinline__ void load(const float* __restrict__ X, const float* __restrict__ W, int K, int NC, int k0,
                                         int kc, bool streamed)
    {
        constexpr int BR = rnn_round_up(B, 8);
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const int e = threadIdx.x + i * THREADS;
            int row, q;
            where(e, row, q);
            const bool isx = row < BR;
            const int r = isx ? row : row - BR;
            const bool ok = (isx ? r < B : streamed && r < NC) && (VEC == 4 ? 4 * q : q) < kc;
            const float* src = (isx ? X : W) + (long)r * K + k0 + (VEC == 4 ? 4 * q : q);
#ifdef RNN_KT_NO_LDG
            if (VEC == 4) v[i] = make_float4(e, k0, r, 1.0f);
#else
            if (VEC == 4) v[i] = ok ? rnn_kt_ld4(src) : make_float4(0.f, 0.f, 0.f, 0.f);
#endif
            else v[i].x = ok ? __ldcg(src) : 0.0f;
        }
    }
    // x: the slot's X (KC rows of ldx floats), w: its W (ldw floats a row).
    __device__ __forceinline__ void store(float* __restrict__ x, int ldx, float* __restrict__ w, int ldw, int kc,
                                          bool streamed) const
    {
        constexpr int BR = rnn_round_up(B, 8);
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const int e = threadIdx.x + i * THREADS;
            int row, q;
            where(e, row, q);
            const bool isx = row < BR;
            const int r = isx ? row : row - BR;
            if (e >= ROWS * QK || (!isx && !streamed)) continue;
            float* dst = isx ? x + r : w + r;
            const int ld = isx ? ldx : ldw;
            if (VEC == 4) {
                const int k = 4 * q;
                if (k < kc) {
                    dst[k * ld] = v[i].x;
                    dst[(k + 1) * ld] = v[i].y;
                    dst[(k + 2) * ld] = v[i].z;
                    dst[(k + 3) * ld] = v[i].w;
                }
            } else if (q < kc) {
                dst[q * ld] = v[i].x;
            }
        }
    }
};

// Writes a thread's tile of Y (+ bias); with split K, first sums the parts through `red` (THREADS x 16 floats) in a
// fixed order, 16 values of every tile a round. Every thread of the block calls it (barriers inside).
template <int RB, int RC>
__device__ __forceinline__ void rnn_kt_store(const RnnGemm& J, const RnnKtTiles<RB, RC>& tl, float (&acc)[RB][RC], int B,
                                             int slot, int part, bool active, float* __restrict__ red)
{
    if (tl.split == 1) {
        if (active) {
            int tr, tc;
            tl.of(slot, tr, tc);
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                const int b = 4 * tr + (r & 3) + (r >> 2) * 4 * tl.nbg;
#pragma unroll
                for (int c = 0; c < RC; ++c) {
                    const int col = 4 * tc + (c & 3) + (c >> 2) * 4 * tl.ncg;
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
            const int i = e / tl.groups, s = e - i * tl.groups, rc = v0 + i, r = rc / RC, c = rc % RC;
            int tr, tc;
            tl.of(s, tr, tc);
            const int b = 4 * tr + (r & 3) + (r >> 2) * 4 * tl.nbg;
            const int col = 4 * tc + (c & 3) + (c >> 2) * 4 * tl.ncg;
            if (b >= B || col >= J.NC) continue;
            float v = red[i * stride + s];
            for (int p = 1; p < tl.split; ++p) v += red[i * stride + p * tl.groups + s];
            J.Y[(long)b * J.ldy + col] = v + (J.bias ? __ldg(J.bias + col) : 0.0f);
        }
        __syncthreads();                               // red is written again by the next round or GEMM
    }
}

// Every GEMM of one stage as one stream of K chunks (the staging of the next GEMM's first chunk overlaps this
// one's last). Resident weights (J.Ws) are k-major with rows of rnn_kt_stride(NCT) floats (rnn_load_resident_kt).
// Shared memory (floats, from smem): two slots of KC x rnn_kt_stride(round_up(B, RB)) for X and, when NCS > 0,
// KC x rnn_kt_stride(NCS) for W; then the split-K partial sums (THREADS x 16). Every GEMM's tiles must fit the
// threads at once (rnn_round_up(B, RB) / RB x NCT / RC <= THREADS).
template <int RB, int RC, int VEC, int KC, int B, int THREADS, int NCS, int N>
__device__ void rnn_kt_gemms(const RnnGemm (&jobs)[N], float* __restrict__ smem)
{
    static_assert(RB % 4 == 0 && RC % 4 == 0, "k-major tiles are 4 or 8 rows and columns");
    constexpr int BP = rnn_round_up(B, RB);
    constexpr int LDX = rnn_kt_stride(BP), LDW = rnn_kt_stride(NCS);
    constexpr int SLOT = KC * (LDX + (NCS ? LDW : 0));
    float* red = smem + 2 * SLOT;
    int chunks[N], total = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) {
        chunks[j] = (jobs[j].K + KC - 1) / KC;
        total += chunks[j];
    }
    RnnKtStage<VEC, KC, B, NCS, THREADS> st;

    __syncthreads();                                   // nobody still reads what the slots held before
    if constexpr (BP > B) {                            // rows past B: zeros (their sums are never stored)
        for (int i = threadIdx.x; i < 2 * KC * (BP - B); i += THREADS) {
            const int s = i / (KC * (BP - B)), rest = i - s * KC * (BP - B), k = rest / (BP - B);
            smem[s * SLOT + k * LDX + B + rest - k * (BP - B)] = 0.0f;
        }
    }
    // The cursor of the staging stream: job sj, its chunk sc.
    int sj = 0, sc = rnn_first_chunk<KC>(jobs[0].K), sn = 0;
    auto stage_load = [&]() {
        RnnGemm J = jobs[0];
#pragma unroll
        for (int j = 1; j < N; ++j)
            if (j == sj) J = jobs[j];
        const int k0 = sc * KC;
        st.load(J.X, J.W, J.K, J.NC, k0, min(KC, J.K - k0), J.Ws == nullptr);
    };
    auto stage_store = [&](int g) {
        RnnGemm J = jobs[0];
#pragma unroll
        for (int j = 1; j < N; ++j)
            if (j == sj) J = jobs[j];
        const int k0 = sc * KC;
        float* x = smem + (g & 1) * SLOT;
        st.store(x, LDX, x + KC * LDX, LDW, min(KC, J.K - k0), J.Ws == nullptr);
        if (++sc == chunks[sj]) sc = 0;
        if (++sn == chunks[sj]) {
            sn = 0;
            ++sj;
            RnnGemm Jn = jobs[0];
#pragma unroll
            for (int j = 1; j < N; ++j)
                if (j == sj) Jn = jobs[j];
            sc = rnn_first_chunk<KC>(Jn.K);
        }
    };
    stage_load();
    stage_store(0);

    int g = 0;
#pragma unroll
    for (int i = 0; i < N; ++i) {                      // unrolled: jobs[i] and its tiling stay in registers
        const RnnGemm& J = jobs[i];
        const RnnKtTiles<RB, RC> tl(BP, rnn_tile_cols(J), KC);
        const int slot = (int)threadIdx.x % tl.groups, part = (int)threadIdx.x / tl.groups;
        const bool active = part < tl.split;
        int tr, tc;
        tl.of(slot, tr, tc);
        const bool resident = J.Ws != nullptr;
        const int ldr = resident ? rnn_kt_stride(rnn_tile_cols(J)) : LDW;
        float acc[RB][RC];
#pragma unroll
        for (int r = 0; r < RB; ++r)
#pragma unroll
            for (int c = 0; c < RC; ++c) acc[r][c] = 0.0f;
        const int first = rnn_first_chunk<KC>(J.K);
        for (int c = 0; c < chunks[i]; ++c, ++g) {
            const int chunk = c + first < chunks[i] ? c + first : c + first - chunks[i];
            __syncthreads();                           // chunk g is staged; slot (g + 1) & 1 is no longer read
#ifdef RNN_KT_NO_STAGE
            const bool more = false;
#else
            const bool more = g + 1 < total;
#endif
            if (more) stage_load();                    // chunk g + 1: its L2 loads travel during the FMAs
            const int k0 = chunk * KC, kc = min(KC, J.K - k0);
            const float* x = smem + (g & 1) * SLOT;
            const float* w = resident ? J.Ws + (long)k0 * ldr : x + KC * LDX;
            const int ldw = resident ? ldr : LDW;
            if (active) {
                const int kp = KC / tl.split, kb = part * kp;
                const float* xp = x + kb * LDX + 4 * tr;
                const float* wp = w + kb * ldw + 4 * tc;
                if (kc == KC)
                    rnn_kt_chunk<RB, RC, KC>(acc, xp, LDX, 4 * tl.nbg, wp, ldw, 4 * tl.ncg, kp);
                else
                    rnn_kt_part<RB, RC>(acc, xp, LDX, 4 * tl.nbg, wp, ldw, 4 * tl.ncg, max(0, min(kp, kc - kb)));
            }
            if (more) stage_store(g + 1);
        }
        rnn_kt_store<RB, RC>(J, tl, acc, B, slot, part, active, red);
    }
    __syncthreads();                                   // Y is complete for the whole block; the slots are free
}


// Rows [0, rows) x columns [0, kc) of a row-major staged chunk (rm, ldrm floats a row) into k-major km (ldkm).
template <int KC, int THREADS>
__device__ __forceinline__ void rnn_kt_transpose(const float* __restrict__ rm, int ldrm, float* __restrict__ km, int ldkm,
                                                 int rows, int kc)
{
    constexpr int QK = KC / 4;
    const int n = rnn_round_up(rows, 8) * QK;
    for (int e = threadIdx.x; e < n; e += THREADS) {
        const int row = (e & 7) + 8 * (e / (8 * QK)), q = (e >> 3) % QK, k = 4 * q;
        if (row < rows && k < kc) {
            const float4 v = *reinterpret_cast<const float4*>(rm + row * ldrm + k);
            float* d = km + k * ldkm + row;
            d[0] = v.x;
            d[ldkm] = v.y;
            d[2 * ldkm] = v.z;
            d[3 * ldkm] = v.w;
        }
    }
}

// As rnn_kt_gemms, but chunks land row-major by cp.async (three slots of rnn_row_stride(KC) floats a row, as
// rnn_tile_gemms stages them) and are transposed into the two k-major slots one chunk ahead of the FMAs.
// Shared memory: 3 x (BP + NCS) x rnn_row_stride(KC), then 2 x KC x (LDX + LDW), then THREADS x 16.
template <int RB, int RC, int VEC, int KC, int B, int THREADS, int NCS, int N>
__device__ void rnn_kt2_gemms(const RnnGemm (&jobs)[N], float* __restrict__ smem)
{
    constexpr int BP = rnn_round_up(B, RB);
    constexpr int LDX = rnn_kt_stride(BP), LDW = rnn_kt_stride(NCS), LDR = rnn_row_stride(KC);
    constexpr int RSLOT = (BP + NCS) * LDR, KSLOT = KC * (LDX + (NCS ? LDW : 0));
    float* km0 = smem + 3 * RSLOT;
    float* red = km0 + 2 * KSLOT;
    int chunks[N], total = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) {
        chunks[j] = (jobs[j].K + KC - 1) / KC;
        total += chunks[j];
    }
    __syncthreads();
    if constexpr (BP > B) {
        for (int i = threadIdx.x; i < 2 * KC * (BP - B); i += THREADS) {
            const int s = i / (KC * (BP - B)), rest = i - s * KC * (BP - B), k = rest / (BP - B);
            km0[s * KSLOT + k * LDX + B + rest - k * (BP - B)] = 0.0f;
        }
    }
    int cj = 0, cc = 0;           // the copy cursor: job, chunk
    auto issue = [&](int g) {
        if (g < total) {
            RnnGemm J = jobs[0];
#pragma unroll
            for (int j = 1; j < N; ++j)
                if (j == cj) J = jobs[j];
            const int k0 = cc * KC, kc = min(KC, J.K - k0);
            float* rm = smem + (g % 3) * RSLOT;
            rnn_stage_rows<VEC, KC>(rm, LDR, J.X, J.K, B, k0, kc);
            if (!J.Ws) rnn_stage_rows<VEC, KC>(rm + BP * LDR, LDR, J.W, J.K, J.NC, k0, kc);
            if (++cc == chunks[cj]) {
                cc = 0;
                ++cj;
            }
        }
        rnn_cp_async_commit();
    };
    int tj = 0, tc = 0;           // the transpose cursor
    auto transpose = [&](int g) {
        if (g >= total) return;
        RnnGemm J = jobs[0];
#pragma unroll
        for (int j = 1; j < N; ++j)
            if (j == tj) J = jobs[j];
        const int kc = min(KC, J.K - tc * KC);
        const float* rm = smem + (g % 3) * RSLOT;
        float* km = km0 + (g & 1) * KSLOT;
        rnn_kt_transpose<KC, THREADS>(rm, LDR, km, LDX, B, kc);
        if (!J.Ws) rnn_kt_transpose<KC, THREADS>(rm + BP * LDR, LDR, km + KC * LDX, LDW, J.NC, kc);
        if (++tc == chunks[tj]) {
            tc = 0;
            ++tj;
        }
    };
    issue(0);
    issue(1);
    rnn_cp_async_wait<1>();
    __syncthreads();
    transpose(0);

    int g = 0;
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const RnnGemm& J = jobs[i];
        const RnnKtTiles<RB, RC> tl(BP, rnn_tile_cols(J), KC);
        const int slot = (int)threadIdx.x % tl.groups, part = (int)threadIdx.x / tl.groups;
        const bool active = part < tl.split;
        int tr, tcg;
        tl.of(slot, tr, tcg);
        const bool resident = J.Ws != nullptr;
        const int ldr = resident ? rnn_tile_cols(J) : LDW;
        float acc[RB][RC];
#pragma unroll
        for (int r = 0; r < RB; ++r)
#pragma unroll
            for (int c = 0; c < RC; ++c) acc[r][c] = 0.0f;
        for (int chunk = 0; chunk < chunks[i]; ++chunk, ++g) {
            rnn_cp_async_wait<0>();                    // chunk g + 1 has landed (this thread's copies)
            __syncthreads();                           // ... everyone's; chunk g is transposed; older slots are free
            issue(g + 2);
            transpose(g + 1);
            const int k0 = chunk * KC, kc = min(KC, J.K - k0);
            const float* x = km0 + (g & 1) * KSLOT;
            const float* w = resident ? J.Ws + (long)k0 * ldr : x + KC * LDX;
            const int ldw = resident ? ldr : LDW;
            if (active) {
                const int kp = KC / tl.split, kb = part * kp;
                const float* xp = x + kb * LDX + 4 * tr;
                const float* wp = w + kb * ldw + 4 * tcg;
                if (kc == KC)
                    rnn_kt_chunk<RB, RC, KC>(acc, xp, LDX, 4 * tl.nbg, wp, ldw, 4 * tl.ncg, kp);
                else
                    rnn_kt_part<RB, RC>(acc, xp, LDX, 4 * tl.nbg, wp, ldw, 4 * tl.ncg, max(0, min(kp, kc - kb)));
            }
        }
        rnn_kt_store<RB, RC>(J, tl, acc, B, slot, part, active, red);
    }
    rnn_cp_async_wait<0>();
    __syncthreads();
}

// Resident weights without the padding (rnn_kt2_gemms reads them with rows of NCT floats).
__device__ void rnn_load_resident_kt2(float* __restrict__ ws, const float* __restrict__ w, long ldw, int K, int NC, int ncp)
{
    for (int i = threadIdx.x; i < K * ncp; i += blockDim.x) {
        const int c = i / K, k = i - c * K;
        ws[k * ncp + c] = c < NC ? __ldg(w + (long)c * ldw + k) : 0.0f;
    }
}

#endif  // RNN_KT_GEMM_CUH
