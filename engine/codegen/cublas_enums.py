"""The cuBLAS enum values the engine passes to cuBLAS by number (cublas_api.h, library_types.h; CUDA 13): one place
for the fused training step's handle (engine/autodiff/cublas.py, through ctypes) and the schedules' input
projections (engine/schedules/project.py through CuPy's wrappers, engine/schedules/cublaslt.py through ctypes)."""

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1                              # cublasOperation_t
CUBLAS_POINTER_MODE_HOST = 0                                 # cublasPointerMode_t
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14               # cudaDataType_t
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32 = 68, 77    # cublasComputeType_t
CUBLAS_GEMM_DEFAULT = -1                                     # cublasGemmAlgo_t: cuBLAS's heuristics choose

# cublasLt.h (CUDA 13), for the schedules' projections through cublasLt (engine/schedules/cublaslt.py)
LT_DESC_TRANSA, LT_DESC_TRANSB = 3, 4                       # cublasLtMatmulDescAttributes_t
LT_DESC_EPILOGUE, LT_DESC_BIAS_POINTER = 7, 8
LT_DESC_SM_COUNT_TARGET = 15      # int32: the SMs the heuristic plans for, where a concurrent stream has the rest
LT_EPILOGUE_DEFAULT, LT_EPILOGUE_BIAS = 1, 4                 # cublasLtEpilogue_t
LT_LAYOUT_BATCH_COUNT, LT_LAYOUT_STRIDED_BATCH_OFFSET = 5, 6   # cublasLtMatrixLayoutAttribute_t: int32, int64
LT_PREF_MAX_WORKSPACE_BYTES = 1                              # cublasLtMatmulPreferenceAttributes_t
LT_PREF_MIN_ALIGNMENT_BYTES = (5, 6, 7, 8)                     # A, B, C, D (cublasLt.h: the heuristic assumes 256 B unless told)
LT_HEURISTIC_RESULT_BYTES = 96   # cublasLtMatmulHeuristicResult_t: algo (64 B), workspaceSize, state, wavesCount, int[4]
LT_ALGO_BYTES = 64               # cublasLtMatmulAlgo_t: uint64_t data[8]
LT_ALGO_CONFIG_SPLITK_NUM, LT_ALGO_CONFIG_REDUCTION_SCHEME = 2, 3   # cublasLtMatmulAlgoConfigAttributes_t: uint32 each
LT_ALGO_CAP_SPLITK_SUPPORT, LT_ALGO_CAP_REDUCTION_SCHEME_MASK = 0, 1  # cublasLtMatmulAlgoCapAttributes_t: int32, uint32
LT_REDUCTION_SCHEME_COMPUTE_TYPE = 2   # cublasLtReductionScheme_t: the splits summed in the workspace in compute type
