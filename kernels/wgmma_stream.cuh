// One stage's step GEMMs on warpgroup MMA (wgmma) with the weights streamed, for 16-bit modes on sm_90a:
// TileConfig(stream_wgmma=True) (issue #34, bf16 / fp16 at blogA; benchmarks/NOTES.md 2026-11-28 15:12 and 15:20,
// step ii).
// The product of benchmarks/probe_mode_persist.py's duo kernel (kernels/mode_persist.cu), as a routine the
// generated kernels call in place of rnn_mma_gemms. Needs tile_gemm.cuh, mma_gemm.cuh (the jobs, the barriers and
// bulk copies, the chunked layout), wgmma.cuh and wgmma_ss.cuh before it.
//
// A block of 320 threads: two warpgroups of MMA warps (0-7) and two feed warps. Warp 8's first lane copies the weight's
// chunks (ncs rows x 64 columns of the chunked weight, evict_last for the first w_keep of them), warp 9's the X chunks
// (B rows x 64 columns of the chunked 16-bit copy), each posting its own bytes on the slot's full barrier (two arrivals
// a phase). Warpgroup w multiplies the chunks c with c % 2 == w of each GEMM (m64nNk16: X's 64 rows, rows past B stale
// and never stored, by the slot's N weight rows, rows past ncs stale and never stored), and releases a slot once its
// wgmmas are done (a lane a warp: four arrivals). Then the two warpgroups' sums go into Y in a fixed order (warpgroup
// 0's with the bias, then warpgroup 1 adds its own), so runs are bit-identical.
//
// Slots are numbered over the launch: chunk u of the launch (its stages' GEMMs in order) is fill u / STAGES of slot
// u % STAGES; the launch's chunk count so far is the int at byte 252 of the staging area (rnn_stream_init), read after
// the call's first barrier and written by thread 0 after its last.
//
// AHEAD (the persistent kernel, where a block's every call runs the same GEMMs: one stage of them a step): as a call
// ends, the weight's feed stages the next call's first min(STAGES, chunks) weight chunks into the slots this call
// freed, so those copies land while the cells' math and the step's barrier run (the one-launch layer's weight copies
// ran ahead so: NOTES 2026-11-28 13:27). The next call's X copies complete those slots. How many it staged is the int
// at byte 248, which only that thread reads and writes. The launch ends with rnn_stream_drain, which waits for the
// copies of a call that never came.
#ifndef RNN_WGMMA_STREAM_CUH
#define RNN_WGMMA_STREAM_CUH

constexpr int RNN_STREAM_THREADS = 320;   // two MMA warpgroups, the weight's and X's feed warps

// The barriers (the first 256 bytes of the staging area, which the cell code leaves alone: full[s] at 8 s, empty[s]
// at 8 (STAGES + s), the launch's chunk count at byte 252), once a launch before the first stage.
template <int STAGES>
__device__ __forceinline__ void rnn_stream_init(float* smem)
{
    static_assert(STAGES <= 15, "the barriers and the chunk count share 256 bytes");
    if (threadIdx.x == 0) {
        const unsigned bars = (unsigned)__cvta_generic_to_shared(smem);
        for (int s = 0; s < STAGES; ++s) {
            rnn_bar_init(bars + 8 * s, 2);              // the two feeds' arrivals, with their bytes
            rnn_bar_init(bars + 8 * (STAGES + s), 4);   // a lane of each warp of the warpgroup that read the slot
        }
        reinterpret_cast<int*>(smem)[63] = 0;
        reinterpret_cast<int*>(smem)[62] = 0;          // AHEAD: the next call's weight chunks staged already
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
}

// Shared memory from smem: 256 bytes of barriers, up to 1 KB to the next 1024-byte boundary, then STAGES slots of an
// X chunk (64 rows of 128 bytes) and a W chunk (N rows of 128 bytes). N: 64, 96 or 128 (RnnWgmmaSS), at least ncs.
template <int MODE, int N, int STAGES, bool AHEAD = false, int NJ = 1>
__device__ void rnn_stream_gemms(const RnnMmaJob<MODE> (&jobs)[NJ], int B, float* __restrict__ smem, int ncs,
                                 float w_keep = 1.0f)
{
    constexpr int KC = 64, XBYTES = 64 * 128, WBYTES = N * 128, SLOT = XBYTES + WBYTES;
    static_assert(SLOT % 1024 == 0, "slots on 1024-byte boundaries (the operands' 128-byte swizzle)");
    // An even count: the previous fill of a warpgroup's slot is its own chunk, whose phase it has waited on (with an
    // odd count the other warpgroup's, and the parity test could pass a phase early); at least 4: a warpgroup releases
    // a chunk after committing its next, so two slots would deadlock.
    static_assert(STAGES % 2 == 0 && STAGES >= 4, "slots: an even number, at least 4");
    const unsigned bars = (unsigned)__cvta_generic_to_shared(smem), full = bars, empty = bars + 8 * STAGES;
    const unsigned base = (bars + 256 + 1023) & ~1023u;
    int* const count = reinterpret_cast<int*>(smem) + 63;
    __builtin_assume(blockDim.x == RNN_STREAM_THREADS);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int total = 0;
#pragma unroll
    for (int j = 0; j < NJ; ++j) total += (jobs[j].K + KC - 1) / KC;
    __syncthreads();                                   // Y's readers and the count's writer are done
    const int first = *count;                          // chunks this launch staged before the call
    if (warp >= 8) {                                   // the feeds
        if (lane == 0) {
            const bool x_feed = warp == 9;
            const unsigned long long keep = x_feed ? 0ull : rnn_keep_policy(w_keep);
            // generic stores before the call (X; the cell code's use of the staging area), then bulk reads and writes
            asm volatile("fence.proxy.async;\n" ::: "memory");
            // chunk c of job J as the launch's chunk u: once the slot's last fill is read, this feed's bytes and copy
            const auto stage = [&](const int u, const RnnMmaJob<MODE>& J, const int c) {
                const int s = u % STAGES;
                if (u >= STAGES) rnn_bar_wait(empty + 8 * s, ((u / STAGES) & 1) ^ 1);
                const unsigned at = base + s * SLOT, bar = full + 8 * s;
                if (x_feed) {
                    const unsigned xb = B * KC * 2;
                    rnn_bar_expect(bar, xb);
                    rnn_bulk_copy(at, J.X + (long)c * B * KC, xb, bar);
                } else {
                    const unsigned wb = ncs * KC * 2;
                    rnn_bar_expect(bar, wb);
                    rnn_bulk_copy(at + XBYTES, J.W + (long)c * ncs * KC, wb, bar, keep);
                }
            };
            int* const ahead = reinterpret_cast<int*>(smem) + 62;
            const int staged = AHEAD && !x_feed ? *ahead : 0;          // the weight chunks the last call staged
            int g = 0;
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                const int chunks = (jobs[j].K + KC - 1) / KC;
                for (int c = 0; c < chunks; ++c, ++g)
                    if (g >= staged) stage(first + g, jobs[j], c);
            }
            if (AHEAD && !x_feed) {                    // the next call's first weight chunks, into slots now freed
                const int next = total < STAGES ? total : STAGES;     // (their last fills: this call's, or before)
                int i = 0;
#pragma unroll
                for (int j = 0; j < NJ; ++j) {
                    const int chunks = (jobs[j].K + KC - 1) / KC;
                    for (int c = 0; c < chunks && i < next; ++c, ++i) stage(first + total + i, jobs[j], c);
                }
                *ahead = next;
            }
        }
        __syncwarp();
    } else {                                           // warpgroup w: the chunks c % 2 == w, then its sums into Y
        const int w = warp >> 2, q = warp & 3, gq = lane >> 2, tq = lane & 3;
        float d[N / 2];
        int g = 0;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const RnnMmaJob<MODE>& J = jobs[j];
            const int chunks = (J.K + KC - 1) / KC;
            int mine = 0, last = -1;
            for (int c = 0; c < chunks; ++c, ++g) {
                if ((c & 1) != w) continue;
                const int u = first + g, s = u % STAGES;
                rnn_bar_wait(full + 8 * s, (u / STAGES) & 1);
                const unsigned at = base + s * SLOT;
                rnn_wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < 4; ++kk)
                    RnnWgmmaSS<MODE, N>::mma(d, rnn_wgmma_desc(at + kk * 32), rnn_wgmma_desc(at + XBYTES + kk * 32),
                                             mine > 0 || kk > 0);
                rnn_wgmma_commit();
                rnn_wgmma_wait<1>();                   // the warpgroup's previous chunk is read: release it
                if (last >= 0 && lane == 0) rnn_bar_arrive(empty + 8 * last);
                last = s;
                ++mine;
            }
            rnn_wgmma_wait<0>();
            if (last >= 0 && lane == 0) rnn_bar_arrive(empty + 8 * last);
            // Accumulator element 4 i + 2 h + e: row 16 q + gq + 8 h, column 8 i + 2 tq + e.
#pragma unroll
            for (int pass = 0; pass < 2; ++pass) {
                if (w == pass && mine > 0) {
#pragma unroll
                    for (int i = 0; i < N / 8; ++i)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int row = 16 * q + gq + 8 * (e >> 1), col = 8 * i + 2 * tq + (e & 1);
                            if (row < B && col < J.NC) {
                                float* const y = J.Y + (long)row * J.ldy + col;
                                *y = pass ? *y + d[4 * i + e] : d[4 * i + e] + (J.bias ? __ldg(J.bias + col) : 0.0f);
                            }
                        }
                }
                asm volatile("bar.sync 1, 256;" ::: "memory");   // the MMA warps only: warpgroup 0's sums are in
            }
        }
    }
    __syncthreads();                                   // Y is whole; the slots' fills of this call are all read
    if (tid == 0) *count = first + total;
}

// The launch's end, with AHEAD: the weight copies staged for a call that never came land before the block exits
// (their slots' full barriers get the X feed's arrival, with no bytes, and are waited on). Every thread calls it.
template <int STAGES>
__device__ void rnn_stream_drain(float* smem)
{
    __syncthreads();                                   // the last call's count is written
    if (threadIdx.x == 256) {                          // the weight's feed, which staged them
        const unsigned full = (unsigned)__cvta_generic_to_shared(smem);
        const int first = reinterpret_cast<int*>(smem)[63], staged = reinterpret_cast<int*>(smem)[62];
        for (int i = 0; i < staged; ++i) {
            const int u = first + i, s = u % STAGES;
            rnn_bar_arrive(full + 8 * s);
            rnn_bar_wait(full + 8 * s, (u / STAGES) & 1);
        }
    }
}

#endif
