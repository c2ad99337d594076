// float32x3's step product in fp16 parts on Hopper's warpgroup MMA, each K chunk's tensor-core accumulator promoted
// into an fp32 sum in registers (engine/schedules/wgmma_products.py; issue #34's fp32-accurate mode). Needs tile_gemm.cuh,
// mma_gemm.cuh (the bulk copies and their barriers), wgmma.cuh and tile_ring.cuh before it.
//
//     out (R, N) = (h_lo W_hi + h_hi W_lo) / 2^11 + sum over groups of `promote` K chunks of (h_hi W_hi over the group)
//
// Why: the tensor cores add into their accumulator with truncation, so one accumulator over a long K drifts (Fasi et
// al. 2021). cuBLAS can only keep the drift short by a batch of K chunks, each a plane of P written to memory and read
// again by a fold. Here the accumulator of `promote` chunks of 64 columns is added into an fp32 sum (round to nearest)
// and starts again from zero, as DeepSeek-V3's FP8 GEMM promotes its partial sums every 128 elements (DeepSeek-AI
// 2024, "DeepSeek-V3 Technical Report", section 3.3.2): K is one product, P is gone. The small products need no
// promotion (2^-11 of the result).
//
// Operands, all fp16 bits in the bulk pipeline's chunked layout (mma_gemm.cuh rnn_chunked, engine/schedules/base.py
// chunked): blocks of 64 rows, each as Kp / 64 chunks of 64 x 64 elements, one 8 KB tile whose row r's 16-byte group
// c sits at group c ^ (r % 8), wgmma's 128-byte swizzle. parts: Rp / 64 blocks of h_hi, then Rp / 64 of h_lo (the
// copies write them so: engine/codegen/operand_copies.py); weight: Np / 64 blocks of W_hi, then Np / 64 of W_lo.
// Rows and columns past R, N and K are zeros (rows past R and N are never stored).
//
// A block owns 64 features and 64 batch rows, one warpgroup. Thread 0 fills a ring of STAGES slots with four bulk
// copies a chunk (W_hi, W_lo, h_hi, h_lo: 32 KB), counted by the slot's mbarrier; each chunk is 12 wgmma m64n64k16
// (fp16 in, fp32 accumulators: big += h_hi W_hi, small += h_lo W_hi and h_hi W_lo). A slot is filled again once the
// block has met past the chunk's MMA. Two slots where the grid has more blocks than the GPU has SMs (three blocks an
// SM then fit), four otherwise (engine/schedules/wgmma_products.py stages).
#define X3_TILE_BYTES RNN_TILE_BYTES

// d (m64n64 fp32, 32 a thread) = A B^T + (scale_d ? d : 0) for one k step of 16 fp16 columns, A and B K-major
// tiles of 128-byte swizzled rows (wgmma.cuh's layout and descriptors).
__device__ __forceinline__ void x3_mma(float (&d)[32], unsigned long long a, unsigned long long b, int scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" RNN_WGMMA_OUT32 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : RNN_WGMMA_D32 : "l"(a), "l"(b), "r"(scale_d));
}

// One chunk's 12 MMA on the slot at shared address `sw`; big promoted into sum after every `promote` chunks and at
// the last.
__device__ __forceinline__ void x3_chunk(float (&big)[32], float (&small)[32], float (&sum)[32], const unsigned sw,
                                         const int chunk, const int chunks, const int promote)
{
    const int fresh = chunk % promote == 0;                     // big starts a new accumulation here
    rnn_wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const unsigned long long whi = rnn_wgmma_desc(sw + kk * 32);
        const unsigned long long wlo = rnn_wgmma_desc(sw + X3_TILE_BYTES + kk * 32);
        const unsigned long long hhi = rnn_wgmma_desc(sw + 2 * X3_TILE_BYTES + kk * 32);
        const unsigned long long hlo = rnn_wgmma_desc(sw + 3 * X3_TILE_BYTES + kk * 32);
        x3_mma(big, hhi, whi, !(fresh && kk == 0));
        x3_mma(small, hlo, whi, 1);
        x3_mma(small, hhi, wlo, 1);
    }
    rnn_wgmma_commit();
    rnn_wgmma_wait<0>();
    if ((chunk + 1) % promote == 0 || chunk + 1 == chunks) {
        #pragma unroll
        for (int i = 0; i < 32; ++i) sum[i] += big[i];         // fp32, round to nearest: the group promoted
    }
}

// out = small * scale + sum, the block's 64 rows and 64 features (tile_ring.cuh rnn_tile_store).
__device__ __forceinline__ void x3_store(const float (&small)[32], const float (&sum)[32], float* __restrict__ out,
                                         const int R, const int N, const int mb, const int nb, const float scale)
{
    rnn_tile_store(out, R, N, mb, nb, [&](const int i) { return small[i] * scale + sum[i]; });
}

// The four operands' first tiles for the block of weight rows nb and batch rows mb, `first` tiles along K in:
// W_hi, W_lo, h_hi, h_lo (each operand's blocks of 64 rows, Kp / 64 tiles a block).
__device__ __forceinline__ void x3_sources(const unsigned char* (&src)[4], const unsigned short* parts,
                                           const unsigned short* weight, const int chunks, const int Rp, const int Np,
                                           const int nb, const int mb, const int first)
{
    const long block = (long)chunks * RNN_TILE_BYTES;                // bytes of a block of 64 rows
    const unsigned char* w = reinterpret_cast<const unsigned char*>(weight) + first * RNN_TILE_BYTES;
    const unsigned char* h = reinterpret_cast<const unsigned char*>(parts) + first * RNN_TILE_BYTES;
    src[0] = w + nb * block;
    src[1] = w + (Np / 64 + nb) * block;
    src[2] = h + mb * block;
    src[3] = h + (Rp / 64 + mb) * block;
}

// out (R, N), row-major: rows m0 .., features n0 ..; Rp, Np the parts' and the weight's rows rounded up to 64; Kp the
// columns, a multiple of 64; scale: 1 / 2^11.
template <int STAGES>
__device__ __forceinline__ void x3_wgmma_body(const unsigned short* __restrict__ parts,
                                              const unsigned short* __restrict__ weight, float* __restrict__ out,
                                              const int R, const int N, const int Rp, const int Np, const int Kp,
                                              const int promote, const float scale)
{
    extern __shared__ unsigned char x3_raw[];
    const int tid = threadIdx.x, nb = blockIdx.x, mb = blockIdx.y, chunks = Kp / 64;
    const unsigned char* src[4];
    x3_sources(src, parts, weight, chunks, Rp, Np, nb, mb, 0);
    float big[32], small[32], sum[32];
    #pragma unroll
    for (int i = 0; i < 32; ++i) big[i] = small[i] = sum[i] = 0.0f;
    RnnTileRing<STAGES, 4> ring;
    ring.start(x3_raw, src, chunks, tid == 0);
    for (int chunk = 0; chunk < chunks; ++chunk) {
        ring.wait(chunk);
        x3_chunk(big, small, sum, ring.slot(chunk), chunk, chunks, promote);
        __syncthreads();                                          // every warp's MMA has read the slot
        if (tid == 0 && chunk + STAGES < chunks) ring.fill(chunk + STAGES, src);
    }
    x3_store(small, sum, out, R, N, mb, nb, scale);
}

// The entries: NAME with the kernels' one parameter list, THREADS a block, the body's call after it.
#define X3_ENTRY(NAME, THREADS, ...)                                                                                \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(                                                      \
        const unsigned short* __restrict__ parts, const unsigned short* __restrict__ weight, float* __restrict__ out, \
        const int R, const int N, const int Rp, const int Np, const int Kp, const int promote, const float scale)   \
    {                                                                                                               \
        __VA_ARGS__;                                                                                                \
    }
X3_ENTRY(x3_wgmma_2, 128, x3_wgmma_body<2>(parts, weight, out, R, N, Rp, Np, Kp, promote, scale))
X3_ENTRY(x3_wgmma_4, 128, x3_wgmma_body<4>(parts, weight, out, R, N, Rp, Np, Kp, promote, scale))

// A variant for grids that fill the SMs at most once (`large`: 128 blocks on 132 SMs), where one warpgroup an SM waits
// on each chunk's MMA before its next (the MMA is most of the kernel's time there): two warpgroups a block split the
// chunks between them, even and odd, each with its own ring, accumulators and promotion, so one's MMA run while the
// other waits; at the end the odd one's sums go through shared memory and the even one adds them (sum_even +
// sum_odd, a fixed order: runs are bit-identical). The engine launches it where the grid fits the SMs once
// (wgmma_products.x3_kernel; benchmarks/probe_x3_promote.py --pair: 10.1 us against 12.7 at `large`). A second accumulator set in one warpgroup with wgmma.wait_group 1 was tried first: ptxas serializes every
// wgmma when ordinary instructions read one accumulator while another's group is in flight (C7514).
template <int STAGES>
__device__ __forceinline__ void x3_pair_body(const unsigned short* __restrict__ parts,
                                             const unsigned short* __restrict__ weight, float* __restrict__ out,
                                             const int R, const int N, const int Rp, const int Np, const int Kp,
                                             const float scale)
{
    extern __shared__ unsigned char x3_raw[];
    const int wg = threadIdx.x >> 7, leader = (threadIdx.x & 127) == 0;
    const int nb = blockIdx.x, mb = blockIdx.y, chunks = Kp / 64, mine = (chunks - wg + 1) / 2;
    const unsigned char* src[4];
    x3_sources(src, parts, weight, chunks, Rp, Np, nb, mb, wg);           // this warpgroup's first chunk: wg
    float big[32], small[32], sum[32];
    #pragma unroll
    for (int i = 0; i < 32; ++i) big[i] = small[i] = sum[i] = 0.0f;
    RnnTileRing<STAGES, 4> ring;
    ring.step = 2;                                             // this warpgroup's chunks: every other one
    ring.start(x3_raw + wg * RNN_TILE_RING_BYTES(STAGES, 4), src, mine, leader);
    for (int c = 0; c < mine; ++c) {
        ring.wait(c);
        x3_chunk(big, small, sum, ring.slot(c), c, mine, 1);
        asm volatile("bar.sync %0, 128;" :: "r"(1 + wg) : "memory");   // this warpgroup's MMA have read the slot
        if (leader && c + STAGES < mine) ring.fill(c + STAGES, src);
    }
    __syncthreads();                                           // both rings drained: their memory is free
    float* odd = reinterpret_cast<float*>(x3_raw + ((1024u - ((unsigned)__cvta_generic_to_shared(x3_raw) & 1023u)) & 1023u));
    const int t = threadIdx.x & 127;
    if (wg == 1) {
        #pragma unroll
        for (int i = 0; i < 32; ++i) {
            odd[i * 128 + t] = small[i];
            odd[(32 + i) * 128 + t] = sum[i];
        }
    }
    __syncthreads();
    if (wg == 0) {
        #pragma unroll
        for (int i = 0; i < 32; ++i) {
            small[i] += odd[i * 128 + t];
            sum[i] += odd[(32 + i) * 128 + t];
        }
        x3_store(small, sum, out, R, N, mb, nb, scale);
    }
}

X3_ENTRY(x3_wgmma_pair_2, 256, x3_pair_body<2>(parts, weight, out, R, N, Rp, Np, Kp, scale))
X3_ENTRY(x3_wgmma_pair_3, 256, x3_pair_body<3>(parts, weight, out, R, N, Rp, Np, Kp, scale))
#undef X3_ENTRY
