"""The scan schedule's matrix products in a precision mode (engine/codegen/precision.py).

A mode changes the matmuls only: every operand of every matmul is rounded to the mode's format and the products are
summed in fp32; the elementwise math, the scan and the states stay float32. So the scan in a mode is the scan with
its products taken here:

    products = Products("bfloat16", cupy)
    products.project(operand, weight)          # operand (M, K) @ weight (N, K)^T, the forward's input projections
    products.matmul(dy, weight)                # a @ b of the gradients: an operand's adjoint, a weight's gradient

- NumPy (the CPU tests, float32 or float64): both operands rounded as engine.rounding rounds them (float32x3 split
  into its TF32 parts), then multiplied in the array's own dtype. This is the reference backend's emulation.
- CuPy, the forward: engine/schedules/project.py, the schedules' input projection in the mode (cublasLt on the
  rounded activations and the weight in the mode's format; float32x3 as three TF32 GEMMs of split parts).
- CuPy, the gradients: cuBLAS GemmEx on operands rounded into compact buffers (engine/autodiff/cublas.py, the
  training step's GEMMs). float32x3 does not train (engine.backends.common.check_training_precision).

A reduction's fixed matrix (engine/dense.py: layer_norm's mean as a matmul by a constant matrix) is a sum, which no
mode rounds: its products are `exact` (strict fp32), as the step-by-step backward keeps them
(engine/autodiff/step.py).
"""
from __future__ import annotations

import numpy as np

from ..autodiff.cublas import Sgemm
from ..codegen.precision import precision as lookup
from ..errors import BackendError
from ..rounding import mode_matmul, round_like
from .project import project, round_activations


def fixed_weight(cell, name: str) -> bool:
    """Whether weight `name` of the (dense) cell is a reduction's fixed matrix, whose products no mode rounds."""
    return bool(cell[name].attr("fixed", None)) if name in cell.by_name else False


class Products:
    """The matrix products of one run of the scan in `precision`, on arrays of xp (NumPy or CuPy)."""

    def __init__(self, precision: str = "float32", xp=np):
        self.precision, self.xp = lookup(precision).name, xp
        self._weights: dict = {}           # id(weight) -> (weight, its mode format): a program's weights, converted once

    @property
    def strict(self) -> bool:
        return self.precision == "float32"

    def project(self, operand, weight, out=None, exact: bool = False):
        """operand (M, K) @ weight (N, K)^T in the mode (exact: strict, whatever the mode), into out where given."""
        xp, strict = self.xp, self.strict or exact
        if xp is np or operand.dtype != np.float32:      # NumPy, or float64 on the GPU (strict there: check_mode)
            result = xp.asarray(operand @ weight.T if strict else
                                mode_matmul(weight, operand, self.precision, lambda w, a: a @ w.T), dtype=operand.dtype)
            if out is None:
                return result
            out[...] = result
            return out
        out = xp.empty((operand.shape[0], weight.shape[0]), dtype=xp.float32) if out is None else out
        project(xp, xp.ascontiguousarray(operand), xp.ascontiguousarray(weight) if strict else self.weight(weight),
                None, out, "float32" if strict else self.precision)
        return out

    def weight(self, weight):
        """A CuPy float32 weight (N, K) in the mode's storage, as project() reads it: tf32-rounded float32, float16,
        bf16 bits (uint16), or itself (float32x3 splits it as it multiplies). Converted once an array."""
        if self.precision in ("float32", "float32x3"):
            return self.xp.ascontiguousarray(weight)
        kept = self._weights.get(id(weight))
        if kept is None or kept[0] is not weight:
            kept = self._weights[id(weight)] = (weight, round_activations(self.xp, self.xp.ascontiguousarray(weight),
                                                                          self.precision))
        return kept[1]

    def matmul(self, a, b, exact: bool = False):
        """a @ b (2-D, either may be a transposed view) with both operands in the mode: the gradients' GEMMs."""
        xp = self.xp
        if self.strict or exact:
            return a @ b
        if lookup(self.precision).split:
            raise BackendError("the scan's gradients do not run in precision 'float32x3' (3xTF32: the training "
                               "GEMMs are not split in three); hint: precision='float32' for fp32 accuracy, or "
                               "'tf32' for tensor cores")
        if xp is np or a.dtype != np.float32:
            return round_like(a, self.precision) @ round_like(b, self.precision)
        return _gemm_in_mode(xp, a, b, self.precision)


def _gemm_in_mode(cupy, a, b, precision: str):
    """a (m, k) @ b (k, n) for float32 CuPy arrays, each C-contiguous or the transpose of a C-contiguous one, through
    cuBLAS GemmEx on operands rounded to the mode (engine/autodiff/cublas.py Sgemm, one handle a device and mode)."""
    a_t, a_base = _stored(cupy, a)
    b_t, b_base = _stored(cupy, b)
    m, k = a.shape
    n = b.shape[1]
    out = cupy.empty((m, n), dtype=cupy.float32)
    if not (m and n):
        return out
    if not k:
        out[...] = 0
        return out
    gemm = _handle(cupy, precision)
    gemm.bind(cupy.cuda.get_current_stream().ptr)
    # Row-major out (m, n) is column-major out^T (n, m) = op(b)^T op(a)^T; a stored row-major array is its own
    # transpose column-major, with the row length as the leading dimension.
    gemm.gemm(0 if not b_t else 1, 0 if not a_t else 1, n, m, k, b_base.data.ptr, b_base.shape[1],
              a_base.data.ptr, a_base.shape[1], gemm.p_zero, out.data.ptr, n)
    return out


def _stored(cupy, array):
    """(transposed, the C-contiguous array in memory) of a matrix operand: itself, or the base of its transpose
    (copied where it is neither)."""
    if array.flags.c_contiguous:
        return False, array
    if array.T.flags.c_contiguous:
        return True, array.T
    return False, cupy.ascontiguousarray(array)


_handles: dict = {}


def _handle(cupy, precision: str):
    key = (cupy.cuda.runtime.getDevice(), precision)
    if key not in _handles:
        _handles[key] = Sgemm(cupy, precision)
    return _handles[key]
