"""The schedules' input projections through cublasLt: out (M, N) = A (M, K) @ W (N, K)^T + bias in one call, the
bias added by the GEMM's epilogue (CUBLASLT_EPILOGUE_BIAS), with the algorithm cublasLt's heuristic ranks first.

    LtProjection.on_current_device(cupy).matmul(operand, weight, bias, out, data_type, compute)   # True: done

Why not cupy.matmul / cublasGemmEx, then `out += bias`: on an H200 (2026-11-27, CUDA 13.0) one LSTM layer at
B = 16, T = 1024, H = 512 in bf16 spent 160 us of its 4.0 ms call on the bias add (128 MiB read and written), and
the minGRU scan's strict-fp32 GEMM (32768 x 1024 x 512) took 0.824 ms through cupy.matmul against 0.760 with
cublasLt's first algorithm (benchmarks/probe_scan_gemm.py): cuBLAS's and cublasLt's heuristics pick different
kernels. And cublasLt through ctypes can be captured into a CUDA graph, which CuPy's wrappers refuse
(engine/chunk_replay.py).

The operand types and compute types are the callers' (engine/schedules/project.py): fp32 operands with
CUBLAS_COMPUTE_32F (strict, no TF32), tf32-rounded fp32 operands with CUBLAS_COMPUTE_32F_FAST_TF32, 16-bit operands
with CUBLAS_COMPUTE_32F; C and D are fp32, and so is the bias (cublasLt's rule: the bias has D's type). One handle and
a 32 MiB workspace per device (cuBLAS's recommendation for Hopper); a plan (descriptors, layouts and the algorithm)
per shape, types and epilogue, made once.
"""
from __future__ import annotations

import ctypes
from collections import OrderedDict
from dataclasses import dataclass, field

from ..codegen.cublas_enums import (
    CUBLAS_OP_N,
    CUBLAS_OP_T,
    CUDA_R_32F,
    LT_ALGO_BYTES,
    LT_ALGO_CAP_REDUCTION_SCHEME_MASK,
    LT_ALGO_CAP_SPLITK_SUPPORT,
    LT_ALGO_CONFIG_REDUCTION_SCHEME,
    LT_ALGO_CONFIG_SPLITK_NUM,
    LT_DESC_BIAS_POINTER,
    LT_DESC_EPILOGUE,
    LT_DESC_SM_COUNT_TARGET,
    LT_DESC_TRANSA,
    LT_DESC_TRANSB,
    LT_EPILOGUE_BIAS,
    LT_EPILOGUE_DEFAULT,
    LT_HEURISTIC_RESULT_BYTES,
    LT_LAYOUT_BATCH_COUNT,
    LT_LAYOUT_STRIDED_BATCH_OFFSET,
    LT_PREF_MAX_WORKSPACE_BYTES,
    LT_PREF_MIN_ALIGNMENT_BYTES,
    LT_REDUCTION_SCHEME_COMPUTE_TYPE,
)
from ..codegen.libraries import loaded_library
from ..errors import BackendError

WORKSPACE = 32 << 20
SPLITK_CANDIDATES = 8    # a split-K product: the first of the heuristic's first 8 algorithms that can split K
MAX_PLANS = 256          # plans kept a device, the least recently used destroyed past it (a process that sees many
                         # shapes, sequences of many lengths say, would otherwise keep every one)
_ONE, _ZERO = ctypes.c_float(1.0), ctypes.c_float(0.0)


class LtError(BackendError):
    """A cublasLt call returned an error status."""


@dataclass(frozen=True)
class Product:
    """The shape of out (M, N) = A (M, K) @ W (N, K)^T as cublasLt is told it, row-major: A's rows lda elements
    apart and W's ldw (a K slice of wider matrices: lda, ldw > K), out's N. batch > 1: that many such products,
    A_i, W_i and out_i `strides` (A, W, out) elements after A_0, W_0 and out_0 (strides of K-slice width: the
    K chunks of one product, engine/schedules/split_products.py). splits > 1: cublasLt's own split-K, K cut into
    that many parts, each summed in an accumulator of its own and the parts added in fp32 in the workspace
    (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE): float32x3's K chunks in one product, out one plane."""
    M: int
    N: int
    K: int
    lda: int
    ldw: int
    batch: int = 1
    strides: tuple[int, int, int] = (0, 0, 0)
    splits: int = 1

    @property
    def workspace_bytes(self) -> int:
        """What a split-K product's reduction holds in the workspace (one fp32 plane a split), else 0."""
        return self.splits * self.M * self.N * 4 if self.splits > 1 else 0

    @classmethod
    def dense(cls, M: int, N: int, K: int) -> Product:
        return cls(M, N, K, K, K)


@dataclass
class Plan:
    """One product's descriptors (kept alive: cublasLt reads them at every call) and its algorithm; algo None:
    the heuristic offered none (the caller multiplies another way)."""
    desc: ctypes.c_void_p
    layouts: tuple
    algo: object
    bias: int = 0                    # the bias pointer the descriptor holds now
    candidates: list = field(default_factory=list)    # the heuristic's algorithms, best first (algo: the one used)


def alignment(pointer: int) -> int:
    """The largest power of two up to 256 that divides the address (what cublasLt's alignment preferences take)."""
    return min(256, pointer & -pointer) if pointer else 256


class LtProjection:
    """cublasLt on one device: its handle, workspace and plans."""

    _by_device: dict = {}

    def __init__(self, cupy):
        self.cupy = cupy
        self.lib = ctypes.CDLL(loaded_library("cublasLt"))
        self.handle = ctypes.c_void_p()
        self._check(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.workspace = cupy.empty(WORKSPACE, dtype=cupy.uint8)
        self.plans: OrderedDict = OrderedDict()

    @classmethod
    def on_current_device(cls, cupy) -> LtProjection:
        device = cupy.cuda.Device().id
        if device not in cls._by_device:
            cls._by_device[device] = cls(cupy)
        return cls._by_device[device]

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status == 15:            # CUBLAS_STATUS_NOT_SUPPORTED: e.g. a split-K count the algorithm does not take
            raise LtError(f"the input projection's {what} returned cuBLAS status 15 (not supported: this cublasLt "
                          "takes no such product, layout or setting on this GPU); hint: run it without the setting "
                          "(e.g. no split-K); backend='fused' (float32) multiplies without cublasLt")
        if status != 0:
            raise LtError(f"the input projection's {what} returned cuBLAS status {status} (cublas_api.h: 3 is an allocation "
                          "that failed, 7 an invalid value, 13 a failed launch); hint: check that the GPU has memory free "
                          "and run again; backend='fused' (float32) multiplies without cublasLt")

    def _layout(self, data_type: int, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        out = ctypes.c_void_p()
        self._check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(out), ctypes.c_int(data_type),
                                                        ctypes.c_uint64(rows), ctypes.c_uint64(cols),
                                                        ctypes.c_int64(ld)), "cublasLtMatrixLayoutCreate")
        return out

    def _layout_set(self, layout, attribute: int, value) -> None:
        self._check(self.lib.cublasLtMatrixLayoutSetAttribute(layout, ctypes.c_int(attribute), ctypes.byref(value),
                                                              ctypes.c_size_t(ctypes.sizeof(value))),
                    "cublasLtMatrixLayoutSetAttribute")

    def _set(self, desc, attribute: int, value) -> None:
        self._check(self.lib.cublasLtMatmulDescSetAttribute(desc, ctypes.c_int(attribute), ctypes.byref(value),
                                                            ctypes.c_size_t(ctypes.sizeof(value))),
                    "cublasLtMatmulDescSetAttribute")

    def plan(self, shape: Product, data_type: int, compute: int, bias: int,
             aligned: tuple[int, int, int] = (256, 256, 256), sms: int = 0) -> Plan:
        """The plan of out (M, N) = A (M, K) W (N, K)^T (+ bias when bias != 0): column-major, out^T (N, M) =
        W^T . A^T with W read as a column-major (K, N) matrix transposed and A as (K, M). aligned: the bytes that
        W's, A's and out's addresses are multiples of (alignment()). sms: the SMs to plan for (0: all of them)."""
        key = (shape, data_type, compute, bias != 0, aligned, sms)
        if key in self.plans:
            self.plans.move_to_end(key)
            return self.plans[key]
        while len(self.plans) >= MAX_PLANS:
            self._destroy(self.plans.popitem(last=False)[1])
        plan = self.plans[key] = self._new_plan(shape, data_type, compute, bias, aligned=aligned, sms=sms)
        return plan

    def _new_plan(self, shape: Product, data_type: int, compute: int, bias: int, count: int = 1,
                  aligned: tuple[int, int, int] = (256, 256, 256), sms: int = 0) -> Plan:
        """The product's descriptors and the algorithm cublasLt's heuristic ranks first (plan.candidates: its first
        `count`, best first). The heuristic assumes every matrix 256-byte aligned unless told: `aligned` (W, A,
        out) tells it, so a product on a row slice (a chunk of a sequence) gets an algorithm that reads it right.
        sms > 0: CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, for a product that runs beside a concurrent stream's work."""
        desc = ctypes.c_void_p()
        self._check(self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), ctypes.c_int(compute),
                                                      ctypes.c_int(CUDA_R_32F)), "cublasLtMatmulDescCreate")
        self._set(desc, LT_DESC_TRANSA, ctypes.c_int32(CUBLAS_OP_T))
        self._set(desc, LT_DESC_TRANSB, ctypes.c_int32(CUBLAS_OP_N))
        self._set(desc, LT_DESC_EPILOGUE, ctypes.c_int32(LT_EPILOGUE_BIAS if bias else LT_EPILOGUE_DEFAULT))
        if bias:             # the heuristic reads the pointer's alignment
            self._set(desc, LT_DESC_BIAS_POINTER, ctypes.c_void_p(bias))
        if sms:
            self._set(desc, LT_DESC_SM_COUNT_TARGET, ctypes.c_int32(sms))
        M, N, K = shape.M, shape.N, shape.K
        w = self._layout(data_type, K, N, shape.ldw)
        a = self._layout(data_type, K, M, shape.lda)
        c = self._layout(CUDA_R_32F, N, M, N)
        if shape.batch > 1:
            for layout, stride in zip((a, w, c), shape.strides):
                self._layout_set(layout, LT_LAYOUT_BATCH_COUNT, ctypes.c_int32(shape.batch))
                self._layout_set(layout, LT_LAYOUT_STRIDED_BATCH_OFFSET, ctypes.c_int64(stride))
        preference = ctypes.c_void_p()
        self._check(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(preference)), "cublasLtMatmulPreferenceCreate")
        size = ctypes.c_uint64(WORKSPACE)
        self._check(self.lib.cublasLtMatmulPreferenceSetAttribute(preference, ctypes.c_int(LT_PREF_MAX_WORKSPACE_BYTES),
                                                                  ctypes.byref(size), ctypes.c_size_t(8)),
                    "cublasLtMatmulPreferenceSetAttribute")
        for attribute, value in zip(LT_PREF_MIN_ALIGNMENT_BYTES, (aligned[0], aligned[1], aligned[2], aligned[2])):
            if value < 256:
                self._check(self.lib.cublasLtMatmulPreferenceSetAttribute(
                    preference, ctypes.c_int(attribute), ctypes.byref(ctypes.c_uint32(value)), ctypes.c_size_t(4)),
                    "cublasLtMatmulPreferenceSetAttribute")
        if shape.splits > 1:
            count = max(count, SPLITK_CANDIDATES)
        results = (ctypes.c_uint8 * (LT_HEURISTIC_RESULT_BYTES * count))()
        found = ctypes.c_int(0)
        status = self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, desc, w, a, c, c, preference,
                                                         ctypes.c_int(count), results, ctypes.byref(found))
        self.lib.cublasLtMatmulPreferenceDestroy(preference)
        raw = bytes(results)
        candidates = [(ctypes.c_uint8 * LT_ALGO_BYTES).from_buffer_copy(
            raw[k * LT_HEURISTIC_RESULT_BYTES:k * LT_HEURISTIC_RESULT_BYTES + LT_ALGO_BYTES])
            for k in range(found.value if status == 0 else 0)]
        if shape.splits > 1:
            split = [s for s in (self._split(algo, shape.splits) for algo in candidates) if s is not None]
            return Plan(desc, (w, a, c), split[0] if split and shape.workspace_bytes <= WORKSPACE else None, bias,
                        split)
        return Plan(desc, (w, a, c), candidates[0] if candidates else None, bias, candidates)

    def _split(self, algo, splits: int):
        """A copy of `algo` set to split K `splits` ways, the splits summed in the workspace in fp32; None where the
        algorithm cannot (cublasLt's capability attributes) or refuses the setting."""
        def capability(attribute: int) -> int:
            value, written = ctypes.c_uint32(0), ctypes.c_size_t(0)
            status = self.lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), ctypes.c_int(attribute),
                                                                ctypes.byref(value), ctypes.c_size_t(4),
                                                                ctypes.byref(written))
            return int(value.value) if status == 0 else 0
        if not capability(LT_ALGO_CAP_SPLITK_SUPPORT) or not (
                capability(LT_ALGO_CAP_REDUCTION_SCHEME_MASK) & LT_REDUCTION_SCHEME_COMPUTE_TYPE):
            return None
        copy = type(algo).from_buffer_copy(bytes(algo))
        for attribute, value in ((LT_ALGO_CONFIG_SPLITK_NUM, splits),
                                 (LT_ALGO_CONFIG_REDUCTION_SCHEME, LT_REDUCTION_SCHEME_COMPUTE_TYPE)):
            v = ctypes.c_uint32(value)
            if self.lib.cublasLtMatmulAlgoConfigSetAttribute(ctypes.byref(copy), ctypes.c_int(attribute),
                                                             ctypes.byref(v), ctypes.c_size_t(4)) != 0:
                return None
        return copy

    def bind(self, weight, out, data_type: int, compute: int, count: int = 1) -> BoundProduct | None:
        """out (M, N) = A (M, K) @ weight (N, K)^T with everything but A and the stream bound, for a product issued
        again and again (scan.WalkCall); None where cublasLt offers no algorithm. Its plan is its own, outside the
        plans this object evicts; count > 1 keeps the heuristic's first `count` algorithms (plan.candidates) for
        BoundProduct.use (benchmarks/probe_scan_overlap.py times them)."""
        plan = self._new_plan(Product.dense(out.shape[0], out.shape[1], weight.shape[1]), data_type, compute, 0,
                              count)
        if plan.algo is None:
            self._destroy(plan)
            return None
        return BoundProduct(self, plan, weight, out)

    def _destroy(self, plan: Plan) -> None:
        """A plan's descriptors freed (cublasLt reads them when a product is issued, not when a captured graph
        replays it, so no graph holds them)."""
        self.lib.cublasLtMatmulDescDestroy(plan.desc)
        for layout in plan.layouts:
            self.lib.cublasLtMatrixLayoutDestroy(layout)

    def matmul(self, operand, weight, bias, out, data_type: int, compute: int, workspace=None, sms: int = 0) -> bool:
        """out (M, N) = operand (M, K) @ weight (N, K)^T (+ bias (N,) fp32) on the current stream; every array
        C-contiguous. False where cublasLt offers no algorithm for it (nothing was written). workspace: a WORKSPACE-byte
        buffer of the caller's, for products issued on several streams at once (cuBLAS: one workspace a stream).
        sms: plan for that many SMs (0: all), where another stream's work holds the rest."""
        M, K = operand.shape
        return self.product(Product.dense(M, weight.shape[0], K), operand.data.ptr, weight.data.ptr, out.data.ptr,
                            data_type, compute, bias=0 if bias is None else bias.data.ptr, workspace=workspace,
                            sms=sms)

    @staticmethod
    def _aligned(shape: Product, a: int, w: int, out: int, data_type: int) -> tuple[int, int, int]:
        """The alignments (W, A, out) to tell the heuristic: each address's, and for a K slice or a batch the
        least of every row's or batch member's start (a dense product's rows follow from its address)."""
        if shape == Product.dense(shape.M, shape.N, shape.K):
            return alignment(w), alignment(a), alignment(out)
        item = 4 if data_type == CUDA_R_32F else 2
        strides = (shape.strides if shape.batch > 1 else (0, 0, 0))
        starts = ((w, item, shape.ldw, strides[1]), (a, item, shape.lda, strides[0]), (out, 4, shape.N, strides[2]))
        return tuple(min(alignment(p), *(alignment(n * size) for n in steps if n)) for p, size, *steps in starts)

    def product(self, shape: Product, a: int, w: int, out: int, data_type: int, compute: int, *, bias: int = 0,
                accumulate: bool = False, workspace=None, sms: int = 0, alpha: float = 1.0) -> bool:
        """The product `shape` of the matrices at device addresses a, w and out (the first of a batch), on the
        current stream: out = alpha A W^T (+ bias), or out += alpha A W^T with accumulate (beta = 1: an fp32 addition
        into out, as the K chunks of float32x3's product are summed; alpha 2^-11 takes off what float32x3's fp16 lo
        parts carry). False where cublasLt offers no algorithm."""
        plan = self.plan(shape, data_type, compute, bias, self._aligned(shape, a, w, out, data_type), sms)
        if plan.algo is None:
            return False
        if bias and bias != plan.bias:
            self._set(plan.desc, LT_DESC_BIAS_POINTER, ctypes.c_void_p(bias))
            plan.bias = bias
        w_layout, a_layout, c = plan.layouts
        stream = ctypes.c_void_p(self.cupy.cuda.get_current_stream().ptr)
        scale = ctypes.byref(_ONE if alpha == 1.0 else ctypes.c_float(alpha))
        self._check(self.lib.cublasLtMatmul(self.handle, plan.desc, scale, ctypes.c_void_p(w), w_layout,
                                            ctypes.c_void_p(a), a_layout, ctypes.byref(_ONE if accumulate else _ZERO),
                                            ctypes.c_void_p(out), c, ctypes.c_void_p(out), c, plan.algo,
                                            ctypes.c_void_p((self.workspace if workspace is None else workspace)
                                                            .data.ptr), ctypes.c_size_t(WORKSPACE),
                                            stream), "cublasLtMatmul")
        return True


class BoundProduct:
    """One product's cublasLtMatmul arguments made once (LtProjection.bind): a call passes A's pointer and the
    stream's, ~16 ctypes conversions fewer than LtProjection.matmul on the path to the GPU's first kernel."""

    def __init__(self, lt: LtProjection, plan: Plan, weight, out):
        w, a, c = plan.layouts
        self.lt, self.plan, self.arrays = lt, plan, (weight, out)          # the arrays kept alive with their pointers
        out_ptr = ctypes.c_void_p(out.data.ptr)
        self.head = (lt.handle, plan.desc, ctypes.byref(_ONE), ctypes.c_void_p(weight.data.ptr), w)
        self.tail = (a, ctypes.byref(_ZERO), out_ptr, c, out_ptr, c, plan.algo,
                     ctypes.c_void_p(lt.workspace.data.ptr), ctypes.c_size_t(WORKSPACE))

    def __call__(self, operand_ptr: int, stream_ptr: int) -> None:
        status = self.lt.lib.cublasLtMatmul(*self.head, ctypes.c_void_p(operand_ptr), *self.tail,
                                            ctypes.c_void_p(stream_ptr))
        if status != 0:
            self.lt._check(status, "cublasLtMatmul")

    def use(self, algo) -> None:
        """Issue the product with `algo` (one of plan.candidates) from now on."""
        self.plan.algo = algo
        self.tail = (*self.tail[:6], algo, *self.tail[7:])

    def __del__(self):
        self.lt._destroy(self.plan)
