// Prototype (ninth session): rnn_tile_gemms with a producer warp. The block's last warp issues every cp.async of the
// stage's chunk stream into STAGES slots and signals `full[s]` (cp.async.mbarrier.arrive.noinc: the arrival happens
// when its copies land); the other warps (consumers) wait on full[s], multiply, and arrive on empty[s]; the producer
// refills a slot once empty[s] completes. No block-wide barrier per chunk; consumers sync among themselves (named
// barrier 1) only for the split-K sums. Same tiles and the same sums in the same order as rnn_tile_gemms.
#ifndef RNN_WS_GEMM_CUH
#define RNN_WS_GEMM_CUH

__device__ __forceinline__ void rnn_ws_sync(int threads) { asm volatile("bar.sync 1, %0;\n" ::"r"(threads) : "memory"); }
__device__ __forceinline__ void rnn_cp_async_arrive_noinc(unsigned bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

template <int RB, int RC>
struct RnnWsTiles {
    int nbg, ncg, groups, split;
    __device__ RnnWsTiles(int B, int NC, int ksteps, int threads)
    {
        nbg = rnn_round_up(B, RB) / RB;
        ncg = rnn_round_up(NC, RC) / RC;
        groups = nbg * ncg;
        const int most = groups >= threads ? 1 : threads / groups;
        split = 1;
#pragma unroll
        for (int d = 2; d <= 64; d *= 2)
            if (d <= most && ksteps % d == 0) split = d;
    }
};

// The producer's copies of one chunk: rows x [k0, k0 + kc) of a (rows, K) operand into dst (ld floats a row), the
// 32 lanes of the producer warp taking 16-byte quads in turn.
template <int KC, int PW = 1>
__device__ __forceinline__ void rnn_ws_stage_rows(float* __restrict__ dst, int ld, const float* __restrict__ src, long lds,
                                                  int rows, int k0, int kc, int lane)
{
    constexpr int QK = KC / 4;
    const int quads = (kc + 3) / 4;
    for (int i = lane; i < rows * QK; i += 32 * PW) {
        const int r = i / QK, q = i - r * QK;
        if (q < quads) rnn_cp_async16(dst + r * ld + 4 * q, src + (long)r * lds + k0 + 4 * q);
    }
}

template <int RB, int RC>
__device__ __forceinline__ void rnn_ws_store_tile(const RnnGemm& J, const RnnWsTiles<RB, RC>& tl, float (&acc)[RB][RC],
                                                  int B, int slot, int part, bool active, float* __restrict__ red,
                                                  int threads)
{
    int bg, cg;
    rnn_tile_of(RnnTiles<RB, RC>(B, tl.ncg * RC, 4), slot, bg, cg);
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
        rnn_ws_sync(threads);
        for (int e = threadIdx.x; e < RV * tl.groups; e += threads) {
            const int i = e / tl.groups, s = e - i * tl.groups, rc = v0 + i;
            int sb, sc;
            rnn_tile_of(RnnTiles<RB, RC>(B, tl.ncg * RC, 4), s, sb, sc);
            const int b = sb + (rc / RC) * tl.nbg, col = sc + (rc % RC) * tl.ncg;
            if (b >= B || col >= J.NC) continue;
            float v = red[i * stride + s];
            for (int p = 1; p < tl.split; ++p) v += red[i * stride + p * tl.groups + s];
            J.Y[(long)b * J.ldy + col] = v + (J.bias ? __ldg(J.bias + col) : 0.0f);
        }
        rnn_ws_sync(threads);
    }
}

// Shared memory: 2 x STAGES mbarriers (16 floats reserved), then STAGES slots of (bp + ncs) * rnn_row_stride(KC)
// floats, then the split-K sums (consumers x min(RB * RC, 16)). blockDim.x = consumers + 32.
template <int RB, int RC, int STAGES, int KC, int N, int PW = 1>
__device__ void rnn_ws_gemms(const RnnGemm (&jobs)[N], int B, float* __restrict__ smem, int ncs)
{
    const int consumers = (int)blockDim.x - 32 * PW;
    const int bp = rnn_round_up(B, RB);
    constexpr int ld = rnn_row_stride(KC);
    const int slot_floats = (bp + ncs) * ld;
    const unsigned bars = (unsigned)__cvta_generic_to_shared(smem);      // full[s] at 8 s, empty[s] at 8 (STAGES + s)
    float* slots = smem + 16;
    float* red = slots + STAGES * slot_floats;
    int chunks[N], total = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) {
        chunks[j] = (jobs[j].K + KC - 1) / KC;
        total += chunks[j];
    }
    __syncthreads();                                   // nobody waits on the barriers or reads the slots any more
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            rnn_bar_init(bars + 8 * s, 32 * PW);
            rnn_bar_init(bars + 8 * (STAGES + s), consumers / 32);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if ((int)threadIdx.x >= consumers) {               // the producer warp
        const int lane = (int)threadIdx.x - consumers;     // 0 .. 32 PW - 1
        int j = 0, c = 0;
        for (int g = 0; g < total; ++g) {
            const int s = g % STAGES;
            rnn_bar_wait(bars + 8 * (STAGES + s), ((g / STAGES) & 1) ^ 1);   // the slot's last reader is done
            RnnGemm J = jobs[0];
#pragma unroll
            for (int i = 1; i < N; ++i)
                if (i == j) J = jobs[i];
            const int k0 = c * KC, kc = min(KC, J.K - k0);
            float* slot = slots + s * slot_floats;
            rnn_ws_stage_rows<KC, PW>(slot, ld, J.X, J.K, B, k0, kc, lane);
            if (!J.Ws) rnn_ws_stage_rows<KC, PW>(slot + bp * ld, ld, J.W, J.K, J.NC, k0, kc, lane);
            rnn_cp_async_arrive_noinc(bars + 8 * s);
            if (++c == chunks[j]) {
                c = 0;
                ++j;
            }
        }
        rnn_cp_async_wait<0>();
    } else {
        int g = 0;
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const RnnGemm& J = jobs[i];
            const RnnWsTiles<RB, RC> tl(B, rnn_tile_cols(J), KC / 4, consumers);
            const bool resident = J.Ws != nullptr;
            const int ldw = resident ? rnn_row_stride(J.K) : ld;
            const int slot = tl.split > 1 ? (int)threadIdx.x % tl.groups : (int)threadIdx.x;
            const int part = tl.split > 1 ? (int)threadIdx.x / tl.groups : 0;
            const bool active = slot < tl.groups && part < tl.split;
            int bg, cg;
            rnn_tile_of(RnnTiles<RB, RC>(B, rnn_tile_cols(J), KC / 4), slot, bg, cg);
            float acc[RB][RC];
#pragma unroll
            for (int r = 0; r < RB; ++r)
#pragma unroll
                for (int c = 0; c < RC; ++c) acc[r][c] = 0.0f;
            for (int chunk = 0; chunk < chunks[i]; ++chunk, ++g) {
                const int s = g % STAGES;
                rnn_bar_wait(bars + 8 * s, (g / STAGES) & 1);              // the chunk has landed
                const int k0 = chunk * KC, kc4 = rnn_round_up(min(KC, J.K - k0), 4);
                const float* x = slots + s * slot_floats;
                const float* w = resident ? J.Ws + k0 : x + bp * ld;
                if (active) {
                    const int k_step = 4 * tl.split, k_begin = 4 * part;
                    if (kc4 == KC && KC % k_step == 0)
                        rnn_mma_chunk<RB, RC, KC / 4>(acc, x, ld, w, ldw, bg, tl.nbg, cg, tl.ncg, k_begin, KC / k_step, k_step);
                    else
                        rnn_mma_part<RB, RC>(acc, x, ld, w, ldw, bg, tl.nbg, cg, tl.ncg, k_begin, kc4, k_step);
                }
                __syncwarp();
                if ((threadIdx.x & 31) == 0) rnn_bar_arrive(bars + 8 * (STAGES + s));
            }
            rnn_ws_store_tile<RB, RC>(J, tl, acc, B, slot, part, active, red, consumers);
        }
    }
    __syncthreads();                                   // Y is complete for the whole block; the slots are free
}

#endif  // RNN_WS_GEMM_CUH
