#ifndef RNN_WGMMA_SS_CUH
#define RNN_WGMMA_SS_CUH

// One m64nNk16 wgmma of a 16-bit mode (bf16, fp16) with both operands in shared memory, fp32 accumulators: the
// products of kernels/mode_persist.cu and kernels/wgmma_stream.cuh. N = 64, 96 or 128. Needs tile_gemm.cuh (the
// modes) and wgmma.cuh (descriptors, fence, commit, wait; its m64n64 operand lists) before it.
//
// A is 64 rows of h, B the block's N weight rows (each a K-major operand of 128-byte swizzled rows, 8-row groups
// 1024 bytes apart). B's rows are a block's whole share, so h is read from shared memory once a wgmma for all of
// them: at N = 64 (a tile a warpgroup) the two operands' 4 KB a wgmma of 32 clocks of math met shared memory's 128
// bytes a clock; at N = 128, 6 KB a 64-clock wgmma stays under it.
#define RNN_WGMMA_OUT48 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define RNN_WGMMA_D48 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
#define RNN_WGMMA_OUT64 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define RNN_WGMMA_D64 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
template <int MODE, int N> struct RnnWgmmaSS;
#define RNN_WGMMA_SS(MODE, TYPE, N, OUTS, D, A, B, P)                                                               \
    template <> struct RnnWgmmaSS<MODE, N> {                                                                        \
        static __device__ __forceinline__ void mma(float (&d)[N / 2], unsigned long long a, unsigned long long b,  \
                                                   int scale)                                                       \
        {                                                                                                           \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N "k16.f32." \
                         TYPE "." TYPE " {" OUTS "}, %" #A ", %" #B ", p, 1, 1, 0, 0;\n}\n"                        \
                         : D : "l"(a), "l"(b), "r"(scale));                                                         \
        }                                                                                                           \
    };
RNN_WGMMA_SS(RNN_BF16, "bf16", 96, RNN_WGMMA_OUT48, RNN_WGMMA_D48, 48, 49, 50)
RNN_WGMMA_SS(RNN_FP16, "f16", 96, RNN_WGMMA_OUT48, RNN_WGMMA_D48, 48, 49, 50)
RNN_WGMMA_SS(RNN_BF16, "bf16", 128, RNN_WGMMA_OUT64, RNN_WGMMA_D64, 64, 65, 66)
RNN_WGMMA_SS(RNN_FP16, "f16", 128, RNN_WGMMA_OUT64, RNN_WGMMA_D64, 64, 65, 66)
RNN_WGMMA_SS(RNN_BF16, "bf16", 64, RNN_WGMMA_OUT32, RNN_WGMMA_D32, 32, 33, 34)
RNN_WGMMA_SS(RNN_FP16, "f16", 64, RNN_WGMMA_OUT32, RNN_WGMMA_D32, 32, 33, 34)
#undef RNN_WGMMA_SS

#endif
