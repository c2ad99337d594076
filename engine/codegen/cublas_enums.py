"""The cuBLAS enum values the engine passes to cuBLAS by number (cublas_api.h, library_types.h; CUDA 13): one place
for the fused training step's handle (engine/autodiff/cublas.py, through ctypes) and the schedules' input
projections (engine/schedules/project.py, through CuPy's wrappers)."""

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1                              # cublasOperation_t
CUBLAS_POINTER_MODE_HOST = 0                                 # cublasPointerMode_t
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14               # cudaDataType_t
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32 = 68, 77    # cublasComputeType_t
CUBLAS_GEMM_DEFAULT = -1                                     # cublasGemmAlgo_t: cuBLAS's heuristics choose
