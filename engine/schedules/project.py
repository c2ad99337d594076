"""Input projections of the schedules: one GEMM over the whole sequence, in the run's precision.

    project(cupy, source, weight, bias, out, "bfloat16")
    # out (M, N) = round(source (M, K)) @ weight (N, K)^T + bias,  on the current stream

The GEMM goes through cublasLt with the bias added by its epilogue (engine/schedules/cublaslt.py: the add alone
was 4 % of a small-batch call); where cublasLt offers no algorithm, through cuBLAS and an add.
- float32: CUBLAS_COMPUTE_32F, IEEE fp32 (the fallback, cupy.matmul, is as long as CUPY_TF32 is unset, which the
  benchmarks record).
- tf32: the activations are rounded to TF32 first (round to nearest, ties away: cvt.rna, as the kernels do),
  then CUBLAS_COMPUTE_32F_FAST_TF32, so cuBLAS multiplies exactly the values the kernels and the emulating reference
  multiply (the weight is stored rounded already).
- float16 / bfloat16: the activations are rounded to 16 bits (nearest even), then 16-bit A and B, an fp32 C and
  CUBLAS_COMPUTE_32F (fp32 accumulation). The weight is stored in 16 bits.
- float32x3: three TF32 GEMMs of the split parts (3xTF32, as the kernels' MMAs): the activations and the (unrounded
  fp32) weight each split into hi = tf32(v) and lo = tf32(v - hi), then three TF32 products into the same fp32
  output, the small products first: x_hi w_lo (the bias in its epilogue), then x_lo w_hi and x_hi w_hi added
  (beta = 1), through cublasLt (split_products_lt: capturable) or, where it has no algorithm, cublasGemmEx with
  CUBLAS_COMPUTE_32F_FAST_TF32 and the bias added after. Every part is a TF32 value already, so cuBLAS multiplies exactly the
  parts the emulating reference multiplies (engine.rounding.mode_matmul). The weight's split is redone every call:
  (N, K) elementwise work beside an (M, N, K) product. x_hi w_hi runs in K chunks of K_CHUNK_X3, each a GEMM added
  into the output by cuBLAS's fp32 epilogue: tensor cores add into their accumulator with truncation (Fasi et al.
  2021, "Numerical behavior of NVIDIA tensor cores", PeerJ CS 7:e330), so one accumulator over a long K drifts
  toward zero. Measured on an H200 (2026-11-27, benchmarks/probe_fp32x3_projection.py, M 3200, N 4096, K 1024,
  norm-relative error against float64): strict SGEMM 5.7e-7 in 0.73 ms; the big product in one GEMM 2.4e-6
  (0.39 ms); in chunks of 512, 256, 128: 1.2e-6, 6.4e-7, 3.4e-7 (0.45, 0.52, 0.99 ms, with the chunks copied).
"""
from __future__ import annotations

import numpy as np

from ..codegen.cublas_enums import (
    CUBLAS_COMPUTE_32F,
    CUBLAS_COMPUTE_32F_FAST_TF32,
    CUBLAS_GEMM_DEFAULT,
    CUBLAS_OP_N,
    CUBLAS_OP_T,
    CUBLAS_POINTER_MODE_HOST,
    CUDA_R_16BF,
    CUDA_R_16F,
    CUDA_R_32F,
)
from ..codegen.cuda import ROUND_THREADS, round_blocks, round_entry
from .cublaslt import LtProjection, Product

# each mode's operand type and compute type for cublasLt (the module's docstring: the products the kernels make)
LT_OPERANDS = {"float32": (CUDA_R_32F, CUBLAS_COMPUTE_32F), "tf32": (CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32),
               "float16": (CUDA_R_16F, CUBLAS_COMPUTE_32F), "bfloat16": (CUDA_R_16BF, CUBLAS_COMPUTE_32F)}
ROUND_ENTRIES = {"tf32": "round_contiguous_tf32", "float16": "round_contiguous_fp16", "bfloat16": "round_contiguous_bf16"}
K_CHUNK_X3 = 256                # float32x3: x_hi w_hi's K per GEMM (the docstring says why)
_ONE = np.array(1.0, dtype=np.float32)
_ZERO = np.array(0.0, dtype=np.float32)
_kernels: dict[str, object] = {}


def _rounding_kernel(cupy, precision: str):
    """An elementwise kernel: float32 -> the operand format (tf32 as float32, bf16 as its uint16 bits)."""
    if precision not in _kernels:
        if precision == "tf32":
            _kernels[precision] = cupy.ElementwiseKernel(
                "float32 x", "float32 y",
                "unsigned int u = __float_as_uint(x);"
                "y = isfinite(x) ? __uint_as_float((u + 0x1000u) & 0xFFFFE000u) : x;",
                "cellforge_round_tf32")
        else:
            _kernels[precision] = cupy.ElementwiseKernel(
                "float32 x", "uint16 y",
                "unsigned int u = __float_as_uint(x);"
                "y = isnan(x) ? (unsigned short)((u >> 16) | 0x40u)"
                "             : (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);",
                "cellforge_round_bf16")
    return _kernels[precision]


def _split_kernel(cupy):
    """An elementwise kernel: float32 -> (hi, lo), hi = tf32(x), lo = tf32(x - hi) (cvt.rna as the kernels do)."""
    if "split" not in _kernels:
        _kernels["split"] = cupy.ElementwiseKernel(
            "float32 x", "float32 hi, float32 lo",
            "unsigned int u = __float_as_uint(x);"
            "hi = isfinite(x) ? __uint_as_float((u + 0x1000u) & 0xFFFFE000u) : x;"
            "float rest = x - hi;"
            "unsigned int r = __float_as_uint(rest);"
            "lo = isfinite(rest) ? __uint_as_float((r + 0x1000u) & 0xFFFFE000u) : rest;",
            "cellforge_split_tf32")
    return _kernels["split"]


def split_tf32(cupy, source, hi=None, lo=None):
    """source (float32, any shape) as float32x3's two TF32 parts (hi, lo); into hi and lo (source's shape) where
    given."""
    return _split_kernel(cupy)(source) if hi is None else _split_kernel(cupy)(source, hi, lo)


def round_activations(cupy, source, precision: str):
    """source (M, K) float32 as the GEMM's A operand: tf32-rounded float32, float16, or bf16 bits (uint16). A
    C-contiguous source of whole 16-byte groups goes through kernels/round_operands.cu 16 bytes a thread (the
    kernels' own roundings); any other element by element."""
    return round_into(cupy, source, cupy.empty(source.shape, dtype=operand_dtype(cupy, precision)), precision)


def operand_dtype(cupy, precision: str):
    """The array dtype of a mode's rounded operand: float32 (tf32, and float32x3's TF32 parts), float16, or uint16
    (bf16's bits)."""
    return cupy.float32 if precision in ("tf32", "float32x3") else cupy.float16 if precision == "float16" else cupy.uint16


def round_into(cupy, source, out, precision: str):
    """round_activations into `out` (source's shape, operand_dtype's type; C-contiguous): no allocation, so a
    captured run can round into a buffer of its own every step (engine/schedules/fused_modes.py)."""
    if (source.flags.c_contiguous and source.size % 4 == 0 and source.data.ptr % 16 == 0 and source.size
            and source.dtype == cupy.float32 and out.data.ptr % 16 == 0):
        n4 = source.size // 4
        round_entry(cupy, ROUND_ENTRIES[precision])((round_blocks(cupy, n4),), (ROUND_THREADS,),
                                                   (source, out, np.int64(n4)))
    elif precision == "float16":
        out[...] = source                            # round to nearest even
    else:
        _rounding_kernel(cupy, precision)(source, out)
    return out


def project(cupy, source, weight, bias, out, precision: str) -> None:
    """out (M, N) = source (M, K) @ weight (N, K)^T (+ bias (N,)), in `precision`; everything C-contiguous.
    cublasLt first, the bias in its epilogue (engine/schedules/cublaslt.py says why), float32x3's three products too
    (split_products_lt); cuBLAS and an add where cublasLt offers no algorithm."""
    if (precision in LT_OPERANDS and source.dtype == cupy.float32
            and all(a.flags.c_contiguous for a in (source, weight, out))):
        operand = source if precision == "float32" else round_activations(cupy, source, precision)
        data_type, compute = LT_OPERANDS[precision]
        if LtProjection.on_current_device(cupy).matmul(operand, weight, bias, out, data_type, compute):
            return
    if precision == "float32x3" and split_products_lt(cupy, source, weight, bias, out):
        return
    if precision == "float32":
        cupy.matmul(source, weight.T, out=out)
    elif precision == "float32x3":
        (x_hi, x_lo), (w_hi, w_lo) = split_tf32(cupy, source), split_tf32(cupy, weight)
        for w_part, x_part, beta in ((w_lo, x_hi, _ZERO), (w_hi, x_lo, _ONE)):
            _gemm_ex(cupy, w_part, x_part, out, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, beta)
        K = source.shape[1]
        for k in range(0, K, K_CHUNK_X3):
            _gemm_ex(cupy, w_hi, x_hi, out, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, _ONE,
                     (k, min(K_CHUNK_X3, K - k)))
    else:
        operand = round_activations(cupy, source, precision)
        data_type = {"tf32": CUDA_R_32F, "float16": CUDA_R_16F, "bfloat16": CUDA_R_16BF}[precision]
        compute = CUBLAS_COMPUTE_32F_FAST_TF32 if precision == "tf32" else CUBLAS_COMPUTE_32F
        _gemm_ex(cupy, weight, operand, out, data_type, compute, _ZERO)
    if bias is not None:
        out += bias


def split_products_lt(cupy, source, weight, bias, out) -> bool:
    """float32x3's three products through cublasLt, in the cuBLAS path's order (x_hi w_lo, then x_lo w_hi, then x_hi
    w_hi in K chunks of K_CHUNK_X3, each added with beta = 1; the bias in the first one's epilogue), so that a run
    captured into a CUDA graph can hold them: CuPy refuses its cuBLAS calls during a capture (engine/chunk_replay.py),
    which left the schedules' float32x3 runs at `large` and blogA unreplayed (H200, 2026-11-28). False where the
    arrays are not C-contiguous float32 or cublasLt offers no algorithm for one product (out is then rewritten by the
    cuBLAS path)."""
    if source.dtype != cupy.float32 or not all(a.flags.c_contiguous for a in (source, weight, out)):
        return False
    (M, K), N = source.shape, weight.shape[0]
    (x_hi, x_lo), (w_hi, w_lo) = split_tf32(cupy, source), split_tf32(cupy, weight)
    lt, (data_type, compute) = LtProjection.on_current_device(cupy), LT_OPERANDS["tf32"]
    calls = [(Product.dense(M, N, K), x_lo.data.ptr, w_hi.data.ptr)]
    calls += [(Product(M, N, min(K_CHUNK_X3, K - k), K, K), x_hi.data.ptr + 4 * k, w_hi.data.ptr + 4 * k)
              for k in range(0, K, K_CHUNK_X3)]
    if not lt.product(Product.dense(M, N, K), x_hi.data.ptr, w_lo.data.ptr, out.data.ptr, data_type, compute,
                      bias=0 if bias is None else bias.data.ptr):
        return False
    return all(lt.product(shape, a, w, out.data.ptr, data_type, compute, accumulate=True) for shape, a, w in calls)


def _gemm_ex(cupy, weight, operand, out, data_type: int, compute: int, beta, k_range=None) -> None:
    """out (M, N) = operand (M, K) @ weight (N, K)^T + beta * out, through cublasGemmEx on the current stream;
    k_range (first, count): the product over those columns of both only (fp32 operands)."""
    from cupy.cuda import cublas  # deferred: CuPy is optional (no GPU in CI)
    M, K = operand.shape
    N = weight.shape[0]
    first, count = k_range or (0, K)
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setPointerMode(handle, CUBLAS_POINTER_MODE_HOST)
    # Row-major out (M, N) is column-major out^T (N, M) = W (N, K) x operand^T (K, M): W is column-major
    # (K, N) with lda = K, transposed; the operand is column-major (K, M) with ldb = K.
    cublas.gemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, count, _ONE.ctypes.data, weight.data.ptr + first * weight.itemsize,
                  data_type, K, operand.data.ptr + first * operand.itemsize, data_type, K, beta.ctypes.data, out.data.ptr, CUDA_R_32F,
                  N, compute, CUBLAS_GEMM_DEFAULT)
