// One m64n64 wgmma of a reduced mode (tf32, bf16, fp16), both operands from shared memory, for the ring kernels
// (kernels/mode_wgmma.cu, kernels/mode_stream.cu). Needs tile_gemm.cuh (the modes) and wgmma.cuh before it.
#ifndef RNN_MODE_MMA_CUH
#define RNN_MODE_MMA_CUH

template <int MODE> struct ModeMma;
template <> struct ModeMma<RNN_TF32> {
    static __device__ __forceinline__ void mma(float (&d)[32], unsigned long long a, unsigned long long b, int scale)
    {
        RnnWgmma<64, true>::mma(d, a, b, scale);
    }
};
template <> struct ModeMma<RNN_BF16> {
    static __device__ __forceinline__ void mma(float (&d)[32], unsigned long long a, unsigned long long b, int scale)
    {
        RnnWgmma<64, false>::mma(d, a, b, scale);
    }
};
template <> struct ModeMma<RNN_FP16> {
    static __device__ __forceinline__ void mma(float (&d)[32], unsigned long long a, unsigned long long b, int scale)
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" RNN_WGMMA_OUT32 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                     : RNN_WGMMA_D32 : "l"(a), "l"(b), "r"(scale));
    }
};

#endif  // RNN_MODE_MMA_CUH
