"""cuBLAS for the fused training step (engine/autodiff/fused_runner.py): row-major GEMMs on raw pointers through ctypes,
on a handle of its own, so they can be captured into CUDA graphs (CuPy's wrappers refuse every cuBLAS call during stream
capture); and the split-K policy for the step GEMMs, whose partial products kernels/splitk_reduce.cu sums.

Precision modes (engine/codegen/precision.py): every buffer stays fp32 (fp32 master weights, activations and
gradients). Strict float32 calls cublasSgemm_v2 / cublasSgemmStridedBatched as it always did. tf32, float16 and
bfloat16 round both operands of each GEMM first, into compact buffers of the handle (kernels/round_operands.cu: the
roundings of engine/rounding.py), then call cublasGemmEx / cublasGemmStridedBatchedEx on them with an fp32 C:
fp16 / bf16 operands with CUBLAS_COMPUTE_32F, tf32-rounded fp32 operands with CUBLAS_COMPUTE_32F_FAST_TF32 (values
a TF32 conversion keeps as they are). So the products are exactly those the NumPy emulation multiplies, summed in
fp32. The fp32 operands with the FAST compute types alone did not do that: cuBLAS's documentation only *allows* the
down-conversion, and on an H200 (CUDA 13.0, 2026-11-27) _FAST_16BF and _FAST_16F gave TF32-level gradients
(5.8e-4 from float64 where bf16 is at 4.7e-3), _FAST_TF32 another rounding than cvt.rna.
"""
from __future__ import annotations

import ctypes

import numpy as np

from ..codegen.cublas_enums import (
    CUBLAS_COMPUTE_32F,
    CUBLAS_COMPUTE_32F_FAST_TF32,
    CUBLAS_GEMM_DEFAULT,
    CUBLAS_POINTER_MODE_HOST,
    CUDA_R_16BF,
    CUDA_R_16F,
    CUDA_R_32F,
)
from ..codegen.cuda import KERNELS_DIR, ROUND_THREADS, round_operands_source
from ..codegen.libraries import loaded_library
from ..codegen.nvrtc import load_module
from ..codegen.precision import precision as lookup

# Each reduced mode's GEMM operands as cublasGemmEx takes them: data type, bytes an element, compute type, and the
# kernel of kernels/round_operands.cu that rounds an fp32 operand into that format
OPERANDS = {"tf32": (CUDA_R_32F, 4, CUBLAS_COMPUTE_32F_FAST_TF32, "round_operand_tf32"),
            "float16": (CUDA_R_16F, 2, CUBLAS_COMPUTE_32F, "round_operand_fp16"),
            "bfloat16": (CUDA_R_16BF, 2, CUBLAS_COMPUTE_32F, "round_operand_bf16")}


class Sgemm:
    """Row-major GEMMs on raw pointers through cuBLAS, on a handle of its own (host scalars, the default math mode, a
    32 MiB workspace of its own, so the calls can be captured into a CUDA graph). precision "float32":
    cublasSgemm_v2, strict fp32, no TF32; "tf32", "float16", "bfloat16": both operands rounded into the handle's
    two compact buffers, then cublasGemmEx (the module's docstring; reserve() sizes the buffers before a capture,
    which may not allocate). CuPy's wrappers refuse every cuBLAS call during stream capture, so the library is
    called through ctypes: the libcublas CuPy loaded (lib: a stand-in, for tests; rounder: one for the rounding
    kernel, called (function name, src, dst, rows, cols, ld))."""

    WORKSPACE = 32 << 20

    def __init__(self, cupy, precision: str = "float32", lib=None, rounder=None):
        self.ctypes, self.xp = ctypes, cupy
        self.precision = lookup(precision).name
        self.operands = OPERANDS.get(self.precision)           # None: strict fp32 through cublasSgemm
        self.compute = self.operands[2] if self.operands else None
        self.rounder = rounder
        self.rounded: list = []            # the two compact operand buffers of a reduced mode (reserve)
        self.retired: list = []            # smaller ones they replaced, alive while the handle is
        self.capacity = 0                  # elements each holds
        lib = ctypes.CDLL(loaded_library("cublas")) if lib is None else lib
        vp, i, fp = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_float)
        lib.cublasSgemm_v2.argtypes = [vp, i, i, i, i, i, fp, vp, i, vp, i, fp, vp, i]
        ll = ctypes.c_longlong
        lib.cublasSgemmStridedBatched.argtypes = [vp, i, i, i, i, i, fp, vp, i, ll, vp, i, ll, fp, vp, i, ll, i]
        lib.cublasGemmEx.argtypes = [vp, i, i, i, i, i, fp, vp, i, i, vp, i, i, fp, vp, i, i, i, i]
        lib.cublasGemmStridedBatchedEx.argtypes = [vp, i, i, i, i, i, fp, vp, i, i, ll, vp, i, i, ll, fp, vp, i, i,
                                                   ll, i, i, i]
        lib.cublasSetStream_v2.argtypes = [vp, vp]
        lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
        lib.cublasSetPointerMode_v2.argtypes = [vp, i]
        lib.cublasSetMathMode.argtypes = [vp, i]
        lib.cublasDestroy_v2.argtypes = [vp]
        self.lib, self.handle = lib, ctypes.c_void_p()
        self._check(lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        self.workspace = cupy.empty(self.WORKSPACE, dtype=cupy.uint8)
        self._check(lib.cublasSetWorkspace_v2(self.handle, self.workspace.data.ptr, self.WORKSPACE), "workspace")
        self._check(lib.cublasSetPointerMode_v2(self.handle, CUBLAS_POINTER_MODE_HOST), "pointer mode")
        self._check(lib.cublasSetMathMode(self.handle, 0), "math mode")              # CUBLAS_DEFAULT_MATH
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self.p_one, self.p_zero = ctypes.pointer(self.one), ctypes.pointer(self.zero)

    def reserve(self, elements: int) -> None:
        """The rounded operands' buffers hold at least `elements` each (a reduced mode; strict fp32 needs none). Call it
        before capturing the GEMMs: a capture may not allocate."""
        if self.operands is None or elements <= self.capacity:
            return
        self.retired += self.rounded       # graphs captured with the smaller ones may still read them: kept
        self.rounded = [self.xp.empty(elements * self.operands[1], dtype=self.xp.uint8) for _ in range(2)]
        self.capacity = elements

    def round_into(self, src: int, dst: int, rows: int, cols: int) -> None:
        """A contiguous fp32 matrix (rows x cols, row-major) rounded into dst in the mode's format, the same layout:
        a weight rounded once where every GEMM of a step reads it (gemm's a_ready)."""
        self._rounding()(self.operands[3], src, dst, cols, rows, cols)     # column-major: cols x rows, ld = cols

    def _rounding(self):
        """The rounding kernels (loaded on first use: a strict fp32 handle never needs them)."""
        if self.rounder is None:
            self.rounder = _RoundingKernels(self.xp)
        return self.rounder

    def _round(self, which: int, src: int, rows: int, cols: int, ld: int) -> tuple[int, int]:
        """The stored (column-major rows x cols, leading dimension ld) fp32 operand rounded into compact buffer
        `which`: its address and leading dimension (rows)."""
        self.reserve(rows * cols)          # outside a capture only: the runner reserves enough before one
        dst = self.rounded[which].data.ptr
        self._rounding()(self.operands[3], src, dst, rows, cols, ld)
        return dst, rows

    def __del__(self):
        """The handle goes with the object (its workspace is a CuPy array, back to the pool with it)."""
        handle, lib = getattr(self, "handle", None), getattr(self, "lib", None)
        if handle is not None and handle.value and lib is not None:
            try:
                lib.cublasDestroy_v2(handle)
            except Exception:  # noqa: BLE001 - at interpreter exit the library may be gone already
                pass

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"cuBLAS {what} failed with status {status}")

    def bind(self, stream_ptr: int) -> None:
        self._check(self.lib.cublasSetStream_v2(self.handle, stream_ptr), "cublasSetStream")

    def gemm(self, op_a: int, op_b: int, m: int, n: int, k: int, a: int, lda: int, b: int, ldb: int, beta,
             c: int, ldc: int, exact: bool = False, a_ready: int | None = None) -> None:
        """cuBLAS's column-major C (m x n) = op(A) op(B) + beta C in the handle's mode (exact: strict fp32 whatever
        the mode: a sum such as a bias's gradient, which no mode rounds; a_ready: A already in the mode's format
        there, with the same leading dimension: a weight rounded once a load, round_into)."""
        if self.compute is None or exact:
            status = self.lib.cublasSgemm_v2(self.handle, op_a, op_b, m, n, k, self.p_one, a, lda, b, ldb, beta, c,
                                             ldc)
        else:                              # op(A) is m x k, stored k x m when transposed; op(B) k x n likewise
            a, lda = (a_ready, lda) if a_ready is not None else self._round(0, a, *((k, m) if op_a else (m, k)), lda)
            b, ldb = self._round(1, b, *((n, k) if op_b else (k, n)), ldb)
            kind = self.operands[0]
            status = self.lib.cublasGemmEx(self.handle, op_a, op_b, m, n, k, self.p_one, a, kind, lda, b, kind, ldb,
                                           beta, c, CUDA_R_32F, ldc, self.compute, CUBLAS_GEMM_DEFAULT)
        self._check(status, "sgemm" if self.compute is None or exact else f"gemmEx ({self.precision})")

    def __call__(self, a: int, lda: int, w: int, ldw: int, c: int, ldc: int, m: int, n: int, k: int,
                 w_transposed: bool, accumulate: bool, exact: bool = False, w_ready: int | None = None) -> None:
        """C (m x n, ldc) (+)= A (m x k, lda) @ W^T (W: n x k, ldw) if w_transposed else A @ W (W: k x n, ldw)
        (exact: strict fp32 whatever the mode; w_ready: W already rounded to the mode there; see gemm)."""
        # Row-major C = A op(W) is column-major C^T = op(W)^T A^T: cuBLAS computes n x m from W then A.
        self.gemm(1 if w_transposed else 0, 0, n, m, k, w, ldw, a, lda, self.p_one if accumulate else self.p_zero,
                  c, ldc, exact, w_ready)

    def raw(self, a_transposed: bool, b_transposed: bool, m: int, n: int, k: int, a: int, lda: int, b: int, ldb: int,
            c: int, ldc: int, exact: bool = False) -> None:
        """cuBLAS's own column-major C (m x n, ldc) += op(A) (m x k) @ op(B) (k x n) (exact: see gemm)."""
        self.gemm(int(a_transposed), int(b_transposed), m, n, k, a, lda, b, ldb, self.p_one, c, ldc, exact)

    def split(self, a: int, lda: int, w: int, ldw: int, part: int, m: int, n: int, k: int, splits: int,
              w_transposed: bool, exact: bool = False, w_ready: int | None = None) -> None:
        """part[i] (m x n, contiguous) = A[:, i*ks:(i+1)*ks] @ op(W)[i*ks:(i+1)*ks, :], ks = k / splits: the K
        dimension split over a strided batch, so a GEMM with few output tiles still fills the GPU (in the handle's
        mode; the parts are summed in fp32 by the kernel after it)."""
        ks = k // splits
        op_w, stride_w = (1, ks) if w_transposed else (0, ks * n)
        if self.compute is None or exact:
            status = self.lib.cublasSgemmStridedBatched(
                self.handle, op_w, 0, n, m, ks, self.p_one, w, ldw, stride_w, a, lda, ks, self.p_zero, part, n,
                m * n, splits)
        else:
            # Rounded whole: W stored k x n (transposed) or n x k, A stored k x m. The batch strides step along the
            # rows of the compact copies (ks) or by whole columns of n rows (ks * n, W's leading dimension n).
            w, ldw = (w_ready, ldw) if w_ready is not None else \
                self._round(0, w, *((k, n) if w_transposed else (n, k)), ldw)
            a, lda = self._round(1, a, k, m, lda)
            kind = self.operands[0]
            status = self.lib.cublasGemmStridedBatchedEx(
                self.handle, op_w, 0, n, m, ks, self.p_one, w, kind, ldw, stride_w, a, kind, lda, ks,
                self.p_zero, part, CUDA_R_32F, n, m * n, splits, self.compute, CUBLAS_GEMM_DEFAULT)
        self._check(status, "sgemm (split K)" if self.compute is None or exact else
                    f"gemmEx ({self.precision}, split K)")


class _RoundingKernels:
    """kernels/round_operands.cu on the current stream: (name, src, dst, rows, cols, ld) rounds one operand."""

    def __init__(self, cupy):
        self.module = load_module(round_operands_source())
        self.functions: dict = {}
        self.blocks = cupy.cuda.Device().attributes["MultiProcessorCount"] * 8

    def __call__(self, name: str, src: int, dst: int, rows: int, cols: int, ld: int) -> None:
        function = self.functions.get(name) or self.functions.setdefault(name, self.module.get_function(name))
        blocks = max(1, min(-(-rows * cols // ROUND_THREADS), self.blocks))
        function((blocks,), (ROUND_THREADS,), (np.uint64(src), np.uint64(dst), np.int32(rows), np.int32(cols),
                                               np.int64(ld)))


# A GEMM of a step has few output tiles (B = 64 rows), and cuBLAS then runs a handful of blocks down a long K on a
# GPU of 132 SMs. Splitting K over a strided batch and summing the partial products in one small kernel fills it.
SPLIT_TILE = (64, 128)          # rows x columns of output a cuBLAS SIMT block covers, roughly
MIN_SPLIT_DEPTH = 64            # each part keeps at least this much of K. 64, not 128, once the kernel after the GEMM
                                # sums the parts (stage_fusion.SPLIT_SUMS, no reduce launch): H100, alternating runs,
                                # GRU-Cho blogB 5.74 against 6.23-6.38 ms a step, LSTM mid 12.6-12.8 against 13.0-13.7
MAX_SPLITS = 8
MIN_SPLIT_ROWS = 16             # fewer rows (batch): cuBLAS runs a GEMV kernel; at `lat` (B = 1) the step's graphs
                                # had 800 reduce nodes of ~2,500, and the host's launch of them is the step's bound


def split_k(m: int, n: int, k: int, sms: int, max_splits: int | None = None) -> int:
    """How many parts to split K into for an (m x k) @ (k x n) GEMM on a GPU of `sms` SMs (1: no split): enough
    to give every SM a block, each part at least MIN_SPLIT_DEPTH deep, a divisor of k, at most max_splits (default
    MAX_SPLITS: the runner passes the value its summing kernels were compiled for)."""
    max_splits = MAX_SPLITS if max_splits is None else max_splits
    if m < MIN_SPLIT_ROWS:
        return 1                  # a GEMV to cuBLAS, spread over n already: a split adds a reduce launch, no blocks
    tiles = -(-m // SPLIT_TILE[0]) * -(-n // SPLIT_TILE[1])
    splits = 1
    while (splits * 2 <= max_splits and tiles * splits * 2 <= sms and k % (splits * 2) == 0
           and k // (splits * 2) >= MIN_SPLIT_DEPTH):
        splits *= 2
    return splits


SPLIT_REDUCE_FILE = KERNELS_DIR / "splitk_reduce.cu"
