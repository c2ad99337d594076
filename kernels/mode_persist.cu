// A whole LSTM or GRU layer's steps in a 16-bit mode in one launch, for weights that outgrow the chip (blogA: a
// 2560 x 10240 weight streamed every step; benchmarks/probe_mode_persist.py; issue #34, bf16 / fp16 at blogA;
// benchmarks/NOTES.md 2026-11-28 12:16, 13:27, 13:51, 14:51). A probe's kernel: the engine does not launch it. Needs
// tile_gemm.cuh, mma_gemm.cuh, wgmma.cuh, mode_mma.cuh, tile_ring.cuh and layer_sync.cuh (the counter's acquire load)
// before it, and wgmma_ss.cuh.
//
//     sums = h_{t-1} W^T (G gates a unit: the LSTM's i, f, g, o; the GRU's r, z, n); with xp[t] (T, R, G H, permuted
//     as the weight, the input biases included): c, h = LSTM(xp + sums, c) or h = GRU(xp, sums, h)
//
// Each block owns UB hidden units for the whole run: ROWS = G UB weight rows, whose row r is gate r % G of unit
// UB blk + r / G (the weight and the projection permuted so; the weight in base.chunked's layout, blocks of ROWS rows:
// a chunk of them one copy). A step:
// - the product of h (in the wgmma products' tiles, two versions: step t reads version t % 2) by the block's rows,
//   through a ring of STAGES slots that a producer warp fills (warp 8: its first lane), or with FEEDS 2 two (warp 9's
//   first lane copies h, warp 8's the weight: one thread issuing both bounded the step: NOTES 14:51). The weight
//   copies run ahead into the next step as slots free up; only the copies of h wait for the grid-wide arrival counter.
//   Each of the two warpgroups multiplies every other chunk by all ROWS rows (m64nROWSk16, RnnWgmmaSS).
// - the cells' math, c (or the GRU's h) in registers, the step's projection loaded as the step starts. PERSIST_PAIRS
//   (the LSTM): the warpgroups exchange halves of their partial sums and the math runs on the accumulators (an even
//   lane holds gates i and f of a unit, its odd neighbour g and o: one exchange of two values). PERSIST_LSTM and
//   PERSIST_GRU: the sums staged in shared memory, 8 cells of one unit a thread (a generated cell's form);
// - h's copy in the mode stored into the other version, then one release-add on the counter; the fp32 outputs are
//   stored after it, while the block waits for the others. Every block must be resident at once (one a
//   multiprocessor).
// - projected_steps (or null: the projection is whole before the launch): a count of the steps whose projection is
//   written, that kernels on another stream raise piece by piece (the projection beside the kernel, on the SMs it
//   leaves free); step t's projection is loaded once the count passes t.
// UB = 32 (80 blocks at blogA) was measured (NOTES 2026-11-28 12:16, as mode_persist_*_2_8_split); UB = 20 (128
// blocks, m64n80k16) was no faster (NOTES 2026-11-28 13:27) and its entries are gone.

__device__ __forceinline__ unsigned long long persist_clock()
{
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return ns;
}

// A streamed 16-byte load kept where it is written (volatile: not sunk past the product to its use).
__device__ __forceinline__ float4 persist_load(const float* p)
{
    float4 v;
    asm volatile("ld.global.cs.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}

// The same for one float.
__device__ __forceinline__ float persist_load1(const float* p)
{
    float v;
    asm volatile("ld.global.cs.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

// The cell's math: IEEE (expf, tanhf, a correctly rounded division: as kernels/cell_ops.cuh), or with FAST the
// hardware approximations (the probe's measure of what the math costs; not the engine's semantics).
template <bool FAST>
__device__ __forceinline__ float persist_sigmoid(const float x)
{
    if constexpr (FAST) return __fdividef(1.0f, 1.0f + __expf(-x));
    else return 1.0f / (1.0f + expf(-x));
}
template <bool FAST>
__device__ __forceinline__ float persist_tanh(const float x)
{
    if constexpr (FAST) {
        float y;
        asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
        return y;
    } else {
        return tanhf(x);
    }
}

// The product: RnnWgmmaSS<MODE, N> (kernels/wgmma_ss.cuh), one m64nNk16 wgmma with h's 64 rows as A and the block's
// N = G UB weight rows as B, both from shared memory.

// UB units a block, ROWS = 4 UB weight rows; each of the two warpgroups multiplies every other chunk by all ROWS rows
// (RnnWgmmaSS), and they exchange halves of their partial sums at the end: warpgroup w keeps columns w HALF ..
// The cells a kernel computes: the LSTM with its math on the accumulators (PERSIST_PAIRS: an even lane holds gates i
// and f, its odd neighbour g and o), or from the step's sums staged in shared memory (PERSIST_LSTM, PERSIST_GRU: any
// gate count, each thread 8 cells of one unit, the form a generated cell would take).
#define PERSIST_PAIRS 0
#define PERSIST_LSTM 1
#define PERSIST_GRU 2

template <int MODE, int UB, int STAGES, bool FAST, int CELL, int FEEDS>
__device__ __forceinline__ void mode_persist_body(const float* __restrict__ xp, const unsigned char* __restrict__ weight,
                                                  unsigned short* __restrict__ hbuf, float* __restrict__ out,
                                                  unsigned* __restrict__ counter, const unsigned* __restrict__ projected_steps,
                                                  const float* __restrict__ bias_n, const int R, const int H,
                                                  const int T, const unsigned primary, const unsigned weight_bytes,
                                                  unsigned long long* __restrict__ trace, const int skip)
{
    extern __shared__ unsigned char persist_raw[];
    // trace (or null): block 0's times (ns) a step: the producer past the counter, the first chunk in, the last MMA
    // done, the cells' math done, their stores done, the proxy fence done; then every block's arrival a step
    // (probe_mode_persist.py phases)
    const bool tracing = trace != nullptr && blockIdx.x == 0;
    // skip (the probe's floor arithmetic; results then wrong): after step 0, bit 0 copies no h, bit 1 no weight,
    // bit 2 issues no wgmma (the copies and the slots' handshakes alone), bit 3 neither copies nor hands slots over
    // nor waits for the counter (the wgmmas on stale slots, the math and the stores alone)
    // G gates a unit, ROWS = G UB weight rows a block (row r: gate r % G of unit UB blk + r / G)
    constexpr int G = CELL == PERSIST_GRU ? 3 : 4, ROWS = G * UB, HALF = ROWS / 2, JJ = HALF / 8, KEEP = HALF / 2;
    constexpr int MMA = 256, CELLS = 8, LD = ROWS + (G == 3 ? 8 : 4);  // staged: 8 cells a thread, the sums' row
    // stride (the GRU's a row 8 banks on from the last: a half-warp's float2 stores, 4 rows by 4 lanes, fall on 32
    // distinct banks; the LSTM's 128 + 8 would outgrow shared memory by 128 bytes, so its stores meet two-way)
    static_assert(UB % 4 == 0, "a warpgroup's half of the rows in whole 8-column groups, h stored 4 units at a time");
    static_assert(CELL == PERSIST_PAIRS || UB == 32, "staged cells: a warp's lanes are a block's 32 units");
    static_assert(STAGES % 2 == 0, "slots: an even number (a warpgroup's chunks keep a slot parity)");
    constexpr unsigned WBYTES = ROWS * 128, SLOT = WBYTES + RNN_TILE_BYTES;   // a chunk's weight rows, then h's tile
    const int tid = threadIdx.x, blk = blockIdx.x, blocks = gridDim.x, N = G * H;
    const int chunks = (H + 63) / 64;            // even (the warpgroups take alternate chunks, a slot parity each)
    const long hversion = (long)((R + 63) / 64) * chunks * 64 * 64;      // elements of one version of h's tiles
    const unsigned raw = (unsigned)__cvta_generic_to_shared(persist_raw);
    const unsigned base = raw + ((1024u - (raw & 1023u)) & 1023u);
    const unsigned full = base + STAGES * SLOT, done = full + 8 * STAGES;
    // the exchange of the partial sums (2 x KEEP x 128 floats), which then stages a step's outputs for whole-row
    // stores: h in fp32 (64, UB), then its copy in the mode (64, UB); staged cells: the step's sums (64, LD)
    float* const xch = reinterpret_cast<float*>(persist_raw + (base - raw) + STAGES * SLOT + 16 * STAGES);
    float* const staged = xch;
    unsigned short* const staged16 = reinterpret_cast<unsigned short*>(staged + 64 * UB);
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            rnn_bar_init(full + 8 * s, FEEDS > 1 ? 2 : 1);    // FEEDS > 1: the weight's and h's producers post their
                                                              // own bytes
            rnn_bar_init(done + 8 * s, 4);       // a slot's chunk is one warpgroup's: a lane of each of its warps
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (FEEDS > 1 && (tid == MMA || tid == MMA + 32 || (FEEDS == 3 && tid == MMA + 64))) {
        // FEEDS 2 (duo): two producers, one thread each. Warp 8 copies the weight's chunks; warp 9 copies h's, once
        // the grid's count passes the step. One thread issuing both copies and the slot handshakes ran ~100
        // dependent instructions a chunk, about the product's whole time (NOTES 2026-11-28 14:51); each now issues
        // half. Each posts its own copy's bytes on the slot's barrier before the copy (two arrivals a phase). With
        // the weight producer posting both copies' bytes, a bf16 run hung (the fp16 one passed): an h copy's bytes
        // landing before they were posted drive the barrier's count of pending bytes below zero, which this design
        // does not rely on. FEEDS 3 (trio): warp 10 copies the weight's odd chunks, warp 8 its even ones (written
        // after the duo's runs; NOTES 2026-11-28 15:04).
        const bool h_feed = tid == MMA + 32;
        const int odd = FEEDS == 3 && tid == MMA + 64;   // FEEDS 3: this weight producer's chunks, c % 2
        const unsigned region = chunks * WBYTES;
        const unsigned char* const w_src = weight + (long)blk * region;
        unsigned long long policy = 0;
        if (primary && !h_feed)
            asm volatile("createpolicy.range.L2::evict_last.L2::evict_first.b64 %0, [%1], %2, %3;"
                         : "=l"(policy) : "l"(w_src), "r"(primary < region ? primary : region), "r"(region));
        unsigned s = 0, phase = 0, g = 0;        // the next chunk's slot, its use's parity, chunks so far
        for (int t = 0; t < T; ++t) {
            if (t > 0 && (skip & 8)) break;
            const unsigned char* const h_src = reinterpret_cast<const unsigned char*>(hbuf + (t & 1) * hversion);
            const bool no_h = t > 0 && (skip & 1), no_w = t > 0 && (skip & 2);
            if (h_feed && t > 0) {
                const long long start = clock64();
                while (rnn_load_acquire(counter) < (unsigned)(t * blocks))
                    if (clock64() - start > (1ll << 36)) __trap();       // a block not resident: fail, not hang
                asm volatile("fence.proxy.async.global;" ::: "memory");
            }
            if (h_feed && tracing) trace[6 * t] = persist_clock();
            for (int c = 0; c < chunks; ++c) {
                const unsigned at = base + s * SLOT, bar = full + 8 * s;
                const bool mine = h_feed || FEEDS == 2 || (c & 1) == odd;     // FEEDS 3: half the weight's chunks
                if (mine && g >= STAGES) rnn_bar_wait(done + 8 * s, phase ^ 1);
                if (h_feed) {
                    rnn_bar_expect(bar, no_h ? 0 : RNN_TILE_BYTES);
                    if (!no_h) rnn_bulk_copy(at + WBYTES, h_src + (long)c * RNN_TILE_BYTES, RNN_TILE_BYTES, bar);
                } else if (mine) {
                    rnn_bar_expect(bar, no_w ? 0 : WBYTES);
                    if (!no_w) {
                        const unsigned char* const w = w_src + (long)c * WBYTES;
                        if (primary) rnn_bulk_copy(at, w, WBYTES, bar, policy);
                        else rnn_bulk_copy(at, w, WBYTES, bar);
                    }
                }
                ++g;
                if (++s == STAGES) {
                    s = 0;
                    phase ^= 1;
                }
            }
        }
    } else if (FEEDS == 1 && tid == MMA) {       // the producer
        // The block's rows, chunk by chunk (one copy each), the first `primary` bytes of them evict_last and the rest
        // evict_first: every block keeps the same share in L2, since the step waits for the slowest (0: plain).
        const unsigned region = chunks * WBYTES;
        const unsigned char* const w_src = weight + (long)blk * region;
        unsigned long long policy = 0;
        if (primary)
            asm volatile("createpolicy.range.L2::evict_last.L2::evict_first.b64 %0, [%1], %2, %3;"
                         : "=l"(policy) : "l"(w_src), "r"(primary < region ? primary : region), "r"(region));
        long g = 0;
        for (int t = 0; t < T; ++t) {
            if (t > 0 && (skip & 8)) break;
            const unsigned char* const h_src = reinterpret_cast<const unsigned char*>(hbuf + (t & 1) * hversion);
            bool ready = t == 0;
            int sent = 0;                        // chunks of this step whose h is copied
            auto ready_up = [&](const int upto) {    // h of this step's chunks up to `upto`, once the others wrote it
                if (!ready) {
                    const long long start = clock64();
                    while (rnn_load_acquire(counter) < (unsigned)(t * blocks))
                        if (clock64() - start > (1ll << 36)) __trap();   // a block not resident: fail, not hang
                    asm volatile("fence.proxy.async.global;" ::: "memory");
                    ready = true;
                    if (tracing) trace[6 * t] = persist_clock();
                }
                for (; sent < upto; ++sent) {
                    if (t > 0 && (skip & 1)) continue;
                    const long gs = (long)t * chunks + sent;
                    rnn_bulk_copy(base + (gs % STAGES) * SLOT + WBYTES, h_src + (long)sent * RNN_TILE_BYTES,
                                  RNN_TILE_BYTES, full + 8 * (gs % STAGES));
                }
            };
            for (int c = 0; c < chunks; ++c, ++g) {
                const unsigned s = g % STAGES, at = base + s * SLOT;
                if (g >= STAGES) {
                    if (g - STAGES >= (long)t * chunks) ready_up(c);       // the slot waits on this step's h
                    rnn_bar_wait(done + 8 * s, ((g - STAGES) / STAGES) & 1);
                }
                const bool no_h = t > 0 && (skip & 1), no_w = t > 0 && (skip & 2);
                rnn_bar_expect(full + 8 * s, (no_h ? 0 : RNN_TILE_BYTES) + (no_w ? 0 : WBYTES));
                if (!no_w) {
                    const unsigned char* const w = w_src + (long)c * WBYTES;
                    if (primary) rnn_bulk_copy(at, w, WBYTES, full + 8 * s, policy);
                    else rnn_bulk_copy(at, w, WBYTES, full + 8 * s);
                }
                if (ready) ready_up(c + 1);
            }
            ready_up(chunks);
        }
    } else if (tid < MMA) {                      // warpgroup w: every other chunk, then its half's cells
        constexpr bool PAIRS = CELL == PERSIST_PAIRS;
        float part[HALF], acc[PAIRS ? KEEP : 1], c_state[PAIRS ? JJ : 1];
        float4 x[PAIRS ? JJ : 1];
        float xs[PAIRS ? 1 : CELLS * G], state[PAIRS ? 1 : CELLS];    // staged: row tid / 32 + 8 k, unit lane
        const int w = tid >> 7, me = tid & 127, q = me >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
        const bool odd = tq & 1;
        const int b = 16 * q + gq + (odd ? 8 : 0);       // the batch row of this thread's cells
        #pragma unroll
        for (int jj = 0; jj < JJ; ++jj) c_state[PAIRS ? jj : 0] = 0.0f;
        #pragma unroll
        for (int k = 0; k < CELLS; ++k) state[PAIRS ? 0 : k] = 0.0f;
        const float bn = CELL == PERSIST_GRU ? bias_n[blk * UB + lane] : 0.0f;    // the GRU's b_hn of this unit
        int projected = projected_steps == nullptr ? T : 0;     // steps whose projection is known written
        // FEEDS > 1: this warpgroup's next slot and its phase (chunks and STAGES even: its chunks keep the slots' parity
        // w), the slot of its last chunk, the descriptors of slot 0's h tile and weight rows
        unsigned slot = w, phase = 0, last = w;
        const unsigned long long h_desc = rnn_wgmma_desc(base + WBYTES), w_desc = rnn_wgmma_desc(base);
        for (int t = 0; t < T; ++t) {
            if (t >= projected) {                // the projection runs beside the kernel: wait for step t's piece
                const long long start = clock64();
                while ((projected = (int)rnn_load_acquire(projected_steps)) <= t)
                    if (clock64() - start > (1ll << 36)) __trap();       // no piece coming: fail, not hang
            }
            if constexpr (PAIRS) {
                #pragma unroll
                for (int jj = 0; jj < JJ; ++jj) x[jj] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (b < R) {                     // the step's projection: in flight during the product
                    const float* const row = xp + ((long)t * R + b) * N + (long)blk * ROWS + w * HALF + 4 * (tq >> 1);
                    #pragma unroll
                    for (int jj = 0; jj < JJ; ++jj) x[jj] = persist_load(row + 8 * jj);
                }
            } else {
                #pragma unroll
                for (int k = 0; k < CELLS; ++k) {
                    const int bk = (tid >> 5) + 8 * k;
                    const float* const row = xp + ((long)t * R + bk) * N + (long)blk * ROWS + lane * G;
                    #pragma unroll
                    for (int g = 0; g < G; ++g) xs[k * G + g] = bk < R ? persist_load1(row + g) : 0.0f;
                }
            }
            const bool bare = t > 0 && (skip & 8), idle = t > 0 && (skip & 4);     // the probe's floors
            if constexpr (FEEDS > 1) {
                // The loop below with its slot and phase carried from chunk to chunk and the descriptors' start
                // fields moved by the slot's offset (a descriptor's low 14 bits are the address / 16, and shared
                // memory ends below 2^18): a few percent on its own (NOTES 2026-11-28 14:51).
                for (int c = w; c < chunks; c += 2) {
                    if (!bare) rnn_bar_wait(full + 8 * slot, phase);
                    if (tracing && tid == 0 && c == 0) trace[6 * t + 1] = persist_clock();
                    if (!idle) {
                        const unsigned long long move = slot * (SLOT >> 4);
                        rnn_wgmma_fence();
                        #pragma unroll
                        for (int kk = 0; kk < 4; ++kk)
                            RnnWgmmaSS<MODE, ROWS>::mma(part, h_desc + move + 2 * kk, w_desc + move + 2 * kk,
                                                        c > w || kk > 0);
                        rnn_wgmma_commit();
                        rnn_wgmma_wait<1>();
                    }
                    if (c > w && !bare && lane == 0) rnn_bar_arrive(done + 8 * last);
                    last = slot;
                    slot += 2;
                    if (slot >= STAGES) {
                        slot -= STAGES;
                        phase ^= 1;
                    }
                }
                rnn_wgmma_wait<0>();
                if (!bare && lane == 0) rnn_bar_arrive(done + 8 * last);
            } else {
                for (int c = w; c < chunks; c += 2) {    // chunks even: both warpgroups take chunks / 2
                    const long gc = (long)t * chunks + c;
                    const unsigned at = base + (gc % STAGES) * SLOT;
                    if (!bare) rnn_bar_wait(full + 8 * (gc % STAGES), (gc / STAGES) & 1);
                    if (tracing && tid == 0 && c == 0) trace[6 * t + 1] = persist_clock();
                    if (!idle) {
                        rnn_wgmma_fence();
                        #pragma unroll
                        for (int kk = 0; kk < 4; ++kk)
                            RnnWgmmaSS<MODE, ROWS>::mma(part, rnn_wgmma_desc(at + WBYTES + kk * 32),
                                                        rnn_wgmma_desc(at + kk * 32), c > w || kk > 0);
                        rnn_wgmma_commit();
                        rnn_wgmma_wait<1>();
                    }
                    if (c > w && !bare && lane == 0) rnn_bar_arrive(done + 8 * ((gc - 2) % STAGES));
                }
                rnn_wgmma_wait<0>();
                if (!bare && lane == 0) rnn_bar_arrive(done + 8 * (((long)t * chunks + chunks - 2 + w) % STAGES));
            }
            unsigned short* const hnext = hbuf + ((t + 1) & 1) * hversion;
            const auto arrive = [&]() {          // h's copy stored: one release-add on the grid's counter
                if (tracing && tid == 0) trace[6 * t + 4] = persist_clock();
                asm volatile("fence.proxy.async.global;" ::: "memory");
                asm volatile("bar.sync 1, %0;" :: "n"(MMA) : "memory");
                if (tid == 0) {
                    if (tracing) trace[6 * t + 5] = persist_clock();
                    if (trace != nullptr) trace[6 * T + (long)t * blocks + blk] = persist_clock();
                    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
                }
            };
            if constexpr (!PAIRS) {
                // Accumulator element 4 j + 2 half + e is row 16 q + gq + 8 half, column 8 j + 2 tq + e: warpgroup 0
                // stages its partial sums, warpgroup 1 adds its own.
                #pragma unroll
                for (int pass = 0; pass < 2; ++pass) {
                    if (w == pass) {
                        #pragma unroll
                        for (int i = 0; i < HALF; i += 2) {
                            float2* const at = reinterpret_cast<float2*>(
                                xch + (16 * q + gq + 8 * ((i >> 1) & 1)) * LD + 8 * (i >> 2) + 2 * tq);
                            const float2 was = pass ? *at : make_float2(0.0f, 0.0f);
                            *at = make_float2(was.x + part[i], was.y + part[i + 1]);
                        }
                    }
                    asm volatile("bar.sync 1, %0;" :: "n"(MMA) : "memory");
                }
                if (tracing && tid == 0) trace[6 * t + 2] = persist_clock();
                float hv[CELLS];
                #pragma unroll
                for (int k = 0; k < CELLS; ++k) {    // row tid / 32 + 8 k, unit lane: its G sums side by side
                    const float* const sum = xch + ((tid >> 5) + 8 * k) * LD + lane * G;
                    const float* const xk = xs + k * G;
                    if constexpr (CELL == PERSIST_LSTM) {    // a unit's 4 sums in one 16-byte load
                        const float4 s4 = *reinterpret_cast<const float4*>(sum);
                        const float ig = persist_sigmoid<FAST>(s4.x + xk[0]);
                        const float fg = persist_sigmoid<FAST>(s4.y + xk[1]);
                        const float cg = persist_tanh<FAST>(s4.z + xk[2]), og = persist_sigmoid<FAST>(s4.w + xk[3]);
                        state[k] = fg * state[k] + ig * cg;
                        hv[k] = og * persist_tanh<FAST>(state[k]);
                    } else {                     // GRU (r, z, n; PyTorch's form: b_hn inside r's product)
                        const float rg = persist_sigmoid<FAST>(sum[0] + xk[0]);
                        const float zg = persist_sigmoid<FAST>(sum[1] + xk[1]);
                        const float ng = persist_tanh<FAST>(xk[2] + rg * (sum[2] + bn));
                        state[k] = (1.0f - zg) * ng + zg * state[k];
                        hv[k] = state[k];
                    }
                }
                if (tracing && tid == 0) trace[6 * t + 3] = persist_clock();
                #pragma unroll
                for (int k = 0; k < CELLS; ++k) {
                    const int bk = (tid >> 5) + 8 * k;
                    if (bk < R) hnext[rnn_tile_at<2>(bk, blk * UB + lane, H)] = rnn_bits16<MODE>(hv[k]);
                }
                arrive();
                #pragma unroll
                for (int k = 0; k < CELLS; ++k) {    // the fp32 outputs after the arrival: a warp stores 32 units
                    const int bk = (tid >> 5) + 8 * k;
                    if (bk < R) out[((long)t * R + bk) * H + blk * UB + lane] = hv[k];
                }
                // (every read of the sums is before arrive()'s barrier)
            } else {
                // Accumulator element 4 j + 2 half + e is column 8 j + 2 tq + e: warpgroup w keeps j in
                // [w JJ, w JJ + JJ), elements [w KEEP, w KEEP + KEEP), and hands the other half to the other one.
                #pragma unroll
                for (int i = 0; i < KEEP; ++i) xch[(w * KEEP + i) * 128 + me] = w ? part[i] : part[KEEP + i];
                asm volatile("bar.sync 1, %0;" :: "n"(MMA) : "memory");
                #pragma unroll
                for (int i = 0; i < KEEP; ++i)
                    acc[i] = (w ? part[KEEP + i] : part[i]) + xch[((1 - w) * KEEP + i) * 128 + me];
                asm volatile("bar.sync 1, %0;" :: "n"(MMA) : "memory");
                if (tracing && tid == 0) trace[6 * t + 2] = persist_clock();
                // Column 8 jj + 2 tq + e of the half is gate 2 (tq % 2) + e of unit 2 jj + tq / 2: an even lane holds
                // gates i, f and its odd neighbour g, o of one unit, for batch rows 16 q + gq and + 8. The even lane
                // takes the first row's cell, the odd the second's, after one exchange of two values.
                float hv[JJ];
                #pragma unroll
                for (int jj = 0; jj < JJ; ++jj) {    // no branch here: the cells' math interleaves
                    const float s0 = odd ? acc[4 * jj] : acc[4 * jj + 2], s1 = odd ? acc[4 * jj + 1] : acc[4 * jj + 3];
                    const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1), r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
                    const float gi = odd ? r0 : acc[4 * jj], gf = odd ? r1 : acc[4 * jj + 1];
                    const float gg = odd ? acc[4 * jj + 2] : r0, go = odd ? acc[4 * jj + 3] : r1;
                    const float ig = persist_sigmoid<FAST>(gi + x[jj].x), fg = persist_sigmoid<FAST>(gf + x[jj].y);
                    const float cg = persist_tanh<FAST>(gg + x[jj].z), og = persist_sigmoid<FAST>(go + x[jj].w);
                    c_state[jj] = fg * c_state[jj] + ig * cg;
                    hv[jj] = og * persist_tanh<FAST>(c_state[jj]);
                }
                if (tracing && tid == 0) trace[6 * t + 3] = persist_clock();
                #pragma unroll
                for (int jj = 0; jj < JJ; ++jj) {
                    const int ul = w * (UB / 2) + 2 * jj + (tq >> 1);
                    staged[b * UB + ul] = hv[jj];
                    staged16[b * UB + ul] = rnn_bits16<MODE>(hv[jj]);
                }
                asm volatile("bar.sync 1, %0;" :: "n"(MMA) : "memory");
                for (int i = tid; i < R * (UB / 4); i += MMA) {     // h's copy in the mode: 4 units (8 bytes) at a time
                    const int row = i / (UB / 4), part4 = i - row * (UB / 4);
                    *reinterpret_cast<uint2*>(hnext + rnn_tile_at<2>(row, blk * UB + 4 * part4, H)) =
                        *reinterpret_cast<const uint2*>(staged16 + row * UB + 4 * part4);
                }
                arrive();
                // the fp32 outputs after the arrival, beside the wait for the others: UB floats of each row
                for (int i = tid; i < R * (UB / 4); i += MMA) {
                    const int row = i / (UB / 4), part4 = i - row * (UB / 4);
                    *reinterpret_cast<float4*>(out + ((long)t * R + row) * H + blk * UB + 4 * part4) =
                        *reinterpret_cast<const float4*>(staged + row * UB + 4 * part4);
                }
                asm volatile("bar.sync 1, %0;" :: "n"(MMA) : "memory");     // staged is the next step's exchange
            }
        }
    }
}

// The entries: mode_persist_<mode>[_gru: PERSIST_GRU]_<UB>_<STAGES>[_fast: FAST][_staged: PERSIST_LSTM][_duo, _trio:
// FEEDS 2, 3]; the LSTM's otherwise PERSIST_PAIRS. 256 threads and a warp a producer (288, 320, 352): so 168
// registers a thread (three warps share one of the SM's four register files). A second accumulator a warpgroup (the odd
// k steps of a chunk into it: two dependent wgmma chains, not one) left the product as slow and spilled the math's
// registers: NOTES 2026-11-28 13:40. bias_n: the GRU's b_hn (H), null for the LSTM.
#define MODE_PERSIST(NAME, MODE, UB, STAGES, FAST, CELL, FEEDS)                                                    \
    extern "C" __global__ void __launch_bounds__(256 + 32 * FEEDS, 1) NAME(                                        \
        const float* __restrict__ xp, const unsigned char* __restrict__ weight, unsigned short* __restrict__ hbuf,  \
        float* __restrict__ out, unsigned* __restrict__ counter, const unsigned* __restrict__ projected_steps,      \
        const float* __restrict__ bias_n, const int R, const int H, const int T, const unsigned primary,           \
        const unsigned weight_bytes, unsigned long long* __restrict__ trace, const int skip)                        \
    {                                                                                                               \
        mode_persist_body<MODE, UB, STAGES, FAST, CELL, FEEDS>(xp, weight, hbuf, out, counter, projected_steps,     \
                                                              bias_n, R, H, T, primary, weight_bytes, trace, skip); \
    }
MODE_PERSIST(mode_persist_bfloat16_32_8, RNN_BF16, 32, 8, false, PERSIST_PAIRS, 1)
MODE_PERSIST(mode_persist_bfloat16_32_8_fast, RNN_BF16, 32, 8, true, PERSIST_PAIRS, 1)
MODE_PERSIST(mode_persist_float16_32_8, RNN_FP16, 32, 8, false, PERSIST_PAIRS, 1)
MODE_PERSIST(mode_persist_bfloat16_32_8_staged, RNN_BF16, 32, 8, false, PERSIST_LSTM, 1)
MODE_PERSIST(mode_persist_float16_32_8_staged, RNN_FP16, 32, 8, false, PERSIST_LSTM, 1)
MODE_PERSIST(mode_persist_bfloat16_gru_32_8, RNN_BF16, 32, 8, false, PERSIST_GRU, 1)
MODE_PERSIST(mode_persist_float16_gru_32_8, RNN_FP16, 32, 8, false, PERSIST_GRU, 1)
MODE_PERSIST(mode_persist_bfloat16_32_8_duo, RNN_BF16, 32, 8, false, PERSIST_PAIRS, 2)
MODE_PERSIST(mode_persist_float16_32_8_duo, RNN_FP16, 32, 8, false, PERSIST_PAIRS, 2)
MODE_PERSIST(mode_persist_bfloat16_gru_32_8_duo, RNN_BF16, 32, 8, false, PERSIST_GRU, 2)
MODE_PERSIST(mode_persist_float16_gru_32_8_duo, RNN_FP16, 32, 8, false, PERSIST_GRU, 2)
MODE_PERSIST(mode_persist_bfloat16_32_8_staged_duo, RNN_BF16, 32, 8, false, PERSIST_LSTM, 2)
MODE_PERSIST(mode_persist_bfloat16_32_8_trio, RNN_BF16, 32, 8, false, PERSIST_PAIRS, 3)
MODE_PERSIST(mode_persist_float16_32_8_trio, RNN_FP16, 32, 8, false, PERSIST_PAIRS, 3)
MODE_PERSIST(mode_persist_bfloat16_gru_32_8_trio, RNN_BF16, 32, 8, false, PERSIST_GRU, 3)
MODE_PERSIST(mode_persist_float16_gru_32_8_trio, RNN_FP16, 32, 8, false, PERSIST_GRU, 3)
#undef MODE_PERSIST

// One more piece of the projection written, `steps` steps (a thread, on the projection's stream after the piece's
// GEMM, which the stream has finished): the count's release-add that the kernel's acquire loads wait on.
extern "C" __global__ void mode_persist_piece_done(unsigned* __restrict__ projected_steps, const unsigned steps)
{
    __threadfence();
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(projected_steps), "r"(steps) : "memory");
}
