// A CPU stand-in for cublasSgemm and the handle calls engine.export's programs make (see
// cuda_runtime.h beside this file). Column-major, as cuBLAS: C = alpha op(A) op(B) + beta C.
#pragma once
#include "cuda_runtime.h"

typedef void* cublasHandle_t;
typedef int cublasStatus_t;
enum { CUBLAS_STATUS_SUCCESS = 0 };
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;

inline cublasStatus_t cublasCreate(cublasHandle_t* h) { *h = nullptr; return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasDestroy(cublasHandle_t) { return CUBLAS_STATUS_SUCCESS; }
inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }

inline cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                  const float* alpha, const float* A, int lda, const float* B, int ldb,
                                  const float* beta, float* C, int ldc) {
    for (int col = 0; col < n; ++col) {
        for (int row = 0; row < m; ++row) {
            double acc = 0.0;
            for (int p = 0; p < k; ++p) {
                const float a = (ta == CUBLAS_OP_N) ? A[row + (long)p * lda] : A[p + (long)row * lda];
                const float b = (tb == CUBLAS_OP_N) ? B[p + (long)col * ldb] : B[col + (long)p * ldb];
                acc += (double)a * b;
            }
            float& c = C[row + (long)col * ldc];
            c = (float)(*alpha * acc + (*beta == 0.0f ? 0.0f : *beta * c));
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}
