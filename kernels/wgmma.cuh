// Hopper's warpgroup MMA (wgmma, sm_90a) on operands in shared memory, for the recurrent step's GEMM (issue #34
// item 1; benchmarks/probe_wgmma.py checks and times these helpers before any schedule uses them).
//
// Layout: an operand tile is K-major, rows of 128 bytes (64 bf16 or 32 tf32 of K), each row's 16-byte groups
// XOR-swizzled by row (group g of row r at g ^ (r % 8): rnn_swz128), the tile starting on a 1024-byte boundary. That
// is wgmma's 128-byte swizzle, and also what ldmatrix needs to read 8 rows of one group without bank conflicts, so
// the warp MMA (mma.sync) reads the same tiles. A matrix descriptor (rnn_wgmma_desc) names a tile: its start address,
// 1024 bytes between 8-row core-matrix groups, the swizzle; one k step (32 bytes of a row: 16 bf16, 8 tf32) moves
// the start 32 bytes.
//
// RnnWgmma<N, TF32>::mma(d, a, b, scale_d): d (the m64nN fp32 accumulators, N / 2 a thread) = A B^T + (scale_d ? d
// : 0) for one k step, A the 64 x k-step rows of descriptor a (a warpgroup's slice of the batch), B the N x k-step
// rows of descriptor b (the block's weight columns). Issue between rnn_wgmma_fence() and rnn_wgmma_commit(); the
// products land in d once rnn_wgmma_wait<n>() leaves at most n groups in flight. Accumulator layout: warp q of the
// warpgroup owns rows 16 q .. 16 q + 15; lane (g = lane / 4, t = lane % 4) holds for each 8-column group j the
// elements (g, 8j + 2t), (g, 8j + 2t + 1), (g + 8, 8j + 2t), (g + 8, 8j + 2t + 1) at d[4j .. 4j + 3].
#ifndef RNN_WGMMA_CUH
#define RNN_WGMMA_CUH

// The byte offset of 16-byte group `group` of row `row` in a tile of 128-byte swizzled rows.
__device__ __forceinline__ unsigned rnn_swz128(int row, int group) { return row * 128 + ((group ^ (row & 7)) << 4); }

// A K-major tile of 128-byte swizzled rows at shared address `addr` as a wgmma matrix descriptor: start address >> 4
// (bits 0-13), leading byte offset 1 (unused with this swizzle), stride byte offset 1024 >> 4 (bits 32-45), swizzle
// mode 1, 128 bytes (bits 62-63); base offset 0, the tile being 1024-byte aligned (PTX ISA, "Matrix Descriptor
// Format" of the asynchronous warpgroup-level matrix instructions).
__device__ __forceinline__ unsigned long long rnn_wgmma_desc(unsigned addr)
{
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

__device__ __forceinline__ void rnn_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void rnn_wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void rnn_wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}

// Shared memory written by ordinary stores, made visible to the tensor cores' (async proxy) reads: each writing
// thread fences, then the block meets at a barrier, before the wgmma that reads it.
__device__ __forceinline__ void rnn_fence_async_shared()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The accumulators of an m64n16 wgmma of the transposed product Y^T = W X^T (its rows are weight rows, its columns
// batch rows) into Y (batch rows of `ld` floats), the tile's weight rows from m0: thread (q, g, t) of the warpgroup
// holds weight rows m0 + 16 q + g and + 8, batch rows 8 j + 2 t and + 1 (benchmarks/probe_cluster_gemm.py and
// probe_tf32_cluster_gemm.py; the engine's own store, with its bias and bounds, is kernels/wgmma_gemm.cuh's).
__device__ __forceinline__ void rnn_wgmma_store_t16(float* y, int ld, int m0, const float (&d)[8])
{
    const int q = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int col = m0 + 16 * q + g;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int row = 8 * j + 2 * t;
        y[row * ld + col] = d[4 * j];
        y[(row + 1) * ld + col] = d[4 * j + 1];
        y[row * ld + col + 8] = d[4 * j + 2];
        y[(row + 1) * ld + col + 8] = d[4 * j + 3];
    }
}

template <int N, bool TF32> struct RnnWgmma;

// The accumulators of an m64nN wgmma as asm operands: their names in the instruction text, and their bindings.
#define RNN_WGMMA_OUT8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define RNN_WGMMA_OUT16 RNN_WGMMA_OUT8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define RNN_WGMMA_OUT32 \
    RNN_WGMMA_OUT16 ", %16, %17, %18, %19, %20, %21, %22, %23" \
    ", %24, %25, %26, %27, %28, %29, %30, %31"
#define RNN_WGMMA_D8 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define RNN_WGMMA_D16 \
    RNN_WGMMA_D8, "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
    "+f"(d[14]), "+f"(d[15])
#define RNN_WGMMA_D32 \
    RNN_WGMMA_D16, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), \
    "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), \
    "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
// One specialization: N columns, SHAPE the instruction's shape and types, TRANS the transpose immediates (bf16
// takes them, tf32 does not), P / A / B the operand numbers of scale_d and the two descriptors (after the N / 2
// accumulators).
#define RNN_WGMMA(N, TF32, SHAPE, TRANS, P, A, B, OUTS, ...)                                                        \
    template <> struct RnnWgmma<N, TF32> {                                                                          \
        static __device__ __forceinline__ void mma(float (&d)[N / 2], unsigned long long a, unsigned long long b,   \
                                                   int scale_d)                                                     \
        {                                                                                                           \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\nwgmma.mma_async.sync.aligned." SHAPE " {"     \
                         OUTS "}, %" #A ", %" #B ", p, 1, 1" TRANS ";\n}\n"                                       \
                         : __VA_ARGS__ : "l"(a), "l"(b), "r"(scale_d));                                           \
        }                                                                                                           \
    };
RNN_WGMMA(16, false, "m64n16k16.f32.bf16.bf16", ", 0, 0", 10, 8, 9, RNN_WGMMA_OUT8, RNN_WGMMA_D8)
RNN_WGMMA(32, false, "m64n32k16.f32.bf16.bf16", ", 0, 0", 18, 16, 17, RNN_WGMMA_OUT16, RNN_WGMMA_D16)
RNN_WGMMA(64, false, "m64n64k16.f32.bf16.bf16", ", 0, 0", 34, 32, 33, RNN_WGMMA_OUT32, RNN_WGMMA_D32)
RNN_WGMMA(16, true, "m64n16k8.f32.tf32.tf32", "", 10, 8, 9, RNN_WGMMA_OUT8, RNN_WGMMA_D8)
RNN_WGMMA(32, true, "m64n32k8.f32.tf32.tf32", "", 18, 16, 17, RNN_WGMMA_OUT16, RNN_WGMMA_D16)
RNN_WGMMA(64, true, "m64n64k8.f32.tf32.tf32", "", 34, 32, 33, RNN_WGMMA_OUT32, RNN_WGMMA_D32)
#undef RNN_WGMMA

// The same product with A from registers (wgmma's register-source form): a[4] is this thread's fragment of the
// 64 x 16 A tile of one k step, in the layout of mma.sync m16n8k16's A for the 16 rows of its warp (warp q of the
// warpgroup: rows 16 q ..): a0 (g, 2t..2t+1) a1 (g+8, ..) a2 (g, 2t+8..) a3 (g+8, 2t+8..), 16-bit pairs (bf16, or
// fp16 with F16); checked against NumPy by benchmarks/probe_cluster_gemm.py. An operand that stays in registers
// across steps (a weight slice) is read by the tensor cores without passing through shared memory each step.
template <int N, bool F16> struct RnnWgmmaRs;   // F16: fp16 operands, else bf16
#define RNN_WGMMA_RS(N, F16, SHAPE, TRANS, AS, B, P, OUTS, ...)                                                   \
    template <> struct RnnWgmmaRs<N, F16> {                                                                        \
        static __device__ __forceinline__ void mma(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long b, \
                                                   int scale_d)                                                     \
        {                                                                                                           \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\nwgmma.mma_async.sync.aligned." SHAPE " {"     \
                         OUTS "}, {" AS "}, %" #B ", p, 1, 1" TRANS ";\n}\n"                                         \
                         : __VA_ARGS__ : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));          \
        }                                                                                                           \
    };
// Both 16-bit types of one shape (SHAPE: "16k16" for m64n16k16).
#define RNN_WGMMA_RS2(N, SHAPE, AS, B, P, OUTS, D)                                                                   \
    RNN_WGMMA_RS(N, false, "m64n" SHAPE ".f32.bf16.bf16", ", 0", AS, B, P, OUTS, D)                                  \
    RNN_WGMMA_RS(N, true, "m64n" SHAPE ".f32.f16.f16", ", 0", AS, B, P, OUTS, D)
RNN_WGMMA_RS2(16, "16k16", "%8, %9, %10, %11", 12, 13, RNN_WGMMA_OUT8, RNN_WGMMA_D8)
RNN_WGMMA_RS2(32, "32k16", "%16, %17, %18, %19", 20, 21, RNN_WGMMA_OUT16, RNN_WGMMA_D16)
RNN_WGMMA_RS2(64, "64k16", "%32, %33, %34, %35", 36, 37, RNN_WGMMA_OUT32, RNN_WGMMA_D32)
#undef RNN_WGMMA_RS2
#undef RNN_WGMMA_RS

#endif  // RNN_WGMMA_CUH
