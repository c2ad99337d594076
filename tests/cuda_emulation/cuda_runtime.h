// A CPU stand-in for the parts of the CUDA runtime that engine.export's programs use, so the
// exported .cu (kernels and host driver, as generated) can be built with g++ and run in CI without a
// GPU. tests/test_export.py rewrites each `kernel<<<grid, block, shmem, stream>>>(args);` line into
// `emu_launch(grid, block, [&] { kernel(args); });`, which runs every (block, thread) in turn.
// Streams and events do nothing: work runs in the order it is enqueued, which the exported driver
// keeps a valid order (it enqueues the wavefront diagonal by diagonal).
#pragma once
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>

#define __global__
#define __device__
#define __forceinline__ inline

// CUDA's math functions that the C library lacks.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

struct emu_dim3 { unsigned int x = 0, y = 0, z = 0; };
inline emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

inline void emu_launch(unsigned int grid, unsigned int block, const std::function<void()>& body) {
    gridDim.x = grid; blockDim.x = block;
    for (unsigned int g = 0; g < grid; ++g) {
        for (unsigned int t = 0; t < block; ++t) {
            blockIdx.x = g; threadIdx.x = t;
            body();
        }
    }
}

typedef int cudaError_t;
typedef void* cudaStream_t;
typedef void* cudaEvent_t;
enum { cudaSuccess = 0 };
enum { cudaStreamNonBlocking = 1, cudaEventDisableTiming = 2 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };

inline const char* cudaGetErrorName(cudaError_t) { return "cudaErrorEmulated"; }
inline const char* cudaGetErrorString(cudaError_t) { return "emulated"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

inline cudaError_t cudaMalloc(void** p, size_t bytes) {
    *p = std::malloc(bytes ? bytes : 1);
    // Poison fresh memory with NaN bytes; the program must write (or memset) before it reads.
    std::memset(*p, 0xff, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaFree(void* p) { std::free(p); return cudaSuccess; }
inline cudaError_t cudaMemset(void* p, int value, size_t bytes) { std::memset(p, value, bytes); return cudaSuccess; }
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
    std::memcpy(dst, src, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                                size_t height, cudaMemcpyKind) {
    for (size_t r = 0; r < height; ++r)
        std::memcpy((char*)dst + r * dpitch, (const char*)src + r * spitch, width);
    return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) { *s = nullptr; return cudaSuccess; }
inline cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) { *e = nullptr; return cudaSuccess; }
inline cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
