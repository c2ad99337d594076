"""The precision modes' rounding, in NumPy: what the GPU kernels do to a matmul operand, emulated.

    round_operand(a, "bfloat16")   # float64 array of the values a bf16 MMA multiplies
    weight_bits(w, "float16")      # uint16 array: the packed weight the kernels read
    round_like(a, "tf32")          # the same rounding in a's own array module and dtype (NumPy or CuPy)
    split_tf32(a)                  # float32x3: (hi, lo) float64 arrays, hi = tf32(a), lo = tf32(a - hi)
    mode_matmul(w, a, "float32x3", matmul)   # a matmul as the mode computes it (the reference's emulation)

Each matches the conversion the kernels use (kernels/tile_gemm.cuh): tf32 is cvt.rna.tf32.f32 (round to
nearest, ties away from zero, on the float32 value), float16 and bfloat16 are round to nearest even
(cvt.rn.f16x2.f32, cvt.rn.bf16x2.f32). Inputs are float32-rounded first, as the kernels only ever see
float32 values.

float32x3 multiplies two TF32 parts of each operand (engine/codegen/precision.py): round_operand has no single
rounded value to give for it and refuses it by name; split_tf32 and mode_matmul say what it computes.
"""
from __future__ import annotations

import numpy as np

from .codegen.cuda import round_values
from .codegen.precision import precision as lookup
from .errors import CompileError


def _bits32(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32)).view(np.uint32)


def _tf32_bits(a) -> np.ndarray:
    u = _bits32(a)
    finite = (u & 0x7F800000) != 0x7F800000
    # Adding half a TF32 unit to the magnitude bits, then truncating: round half away from zero.
    rounded = ((u.astype(np.uint64) + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return np.where(finite, rounded, u)


def _bf16_bits(a) -> np.ndarray:
    u = _bits32(a).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16                    # nearest, ties to even
    return np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16)


def _refuse_split(what: str, name: str) -> None:
    if lookup(name).split:
        raise CompileError(f"{what} has no single rounded operand in precision '{name}' (each operand enters as two "
                           "TF32 parts); hint: use engine.rounding.split_tf32 or mode_matmul")


def split_tf32(a) -> tuple[np.ndarray, np.ndarray]:
    """float32x3's two parts of a (float32-rounded first), as float64: hi = tf32(a), lo = tf32(a - hi) (the
    subtraction is exact in float32). hi + lo is a to within 2^-23 of |a|; Inf and NaN give a NaN lo, as on the GPU."""
    single = np.asarray(a, dtype=np.float32)
    hi = _tf32_bits(single).view(np.float32)
    with np.errstate(invalid="ignore"):
        lo = _tf32_bits(single - hi).view(np.float32)
    return hi.astype(np.float64), lo.astype(np.float64)


def split_fp16(a) -> tuple[np.ndarray, np.ndarray]:
    """float32x3's two parts held as fp16 (the fused backend's x3_parts="fp16", engine/schedules/split_products.py), as
    float64: hi = fp16(tf32(a)), lo = fp16(tf32(a - hi) * 2^11), lo taken from hi as stored. A TF32 value has 11
    significant bits, as an fp16 one has, so for |a| >= 2^-12 hi is split_tf32's hi and lo its lo times 2^11; below,
    hi or lo can be subnormal and the pair holds a to about 2^-36 absolute (lo carries what a subnormal hi lost).
    |a| > 65504 gives an infinite hi (the kernels flag it)."""
    single = np.asarray(a, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        hi = _tf32_bits(single).view(np.float32).astype(np.float16)
        rest = _tf32_bits(single - hi.astype(np.float32)).view(np.float32)
        lo = (rest * np.float32(2048.0)).astype(np.float16)
    return hi.astype(np.float64), lo.astype(np.float64)


def mode_matmul(weight, operand, precision: str, matmul):
    """matmul(weight, operand) as the mode computes it: both operands rounded (the reduced modes), or (float32x3)
    matmul(w_hi, a_lo) + matmul(w_lo, a_hi) + matmul(w_hi, a_hi) of the split parts, in float64, so the
    emulation holds what the three MMAs multiply, and only fp32 accumulation is left between it and the GPU."""
    name = lookup(precision).name
    if name == "float32":
        return matmul(weight, operand)
    dtype = np.result_type(weight, operand)
    if lookup(name).split:
        (w_hi, w_lo), (a_hi, a_lo) = split_tf32(weight), split_tf32(operand)
        total = matmul(w_hi, a_lo) + matmul(w_lo, a_hi) + matmul(w_hi, a_hi)
        return np.asarray(total).astype(dtype, copy=False)
    return matmul(round_operand(weight, name).astype(dtype, copy=False),
                  round_operand(operand, name).astype(dtype, copy=False))


def round_operand(a, precision: str) -> np.ndarray:
    """a rounded as it enters a matmul in this mode, as float64 (float32 mode: unchanged; float32x3: refused, it
    multiplies split parts: split_tf32)."""
    name = lookup(precision).name
    _refuse_split("round_operand", name)
    if name == "float32":
        return np.asarray(a, dtype=np.float64)
    if name == "tf32":
        return _tf32_bits(a).view(np.float32).astype(np.float64)
    if name == "float16":
        return np.asarray(a, dtype=np.float32).astype(np.float16).astype(np.float64)
    return (_bf16_bits(a).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def weight_bits(w, precision: str) -> np.ndarray:
    """A weight as the kernels store it: float32 (float32, tf32 already rounded, float32x3 unrounded: the kernels
    split it as they load it), or the uint16 bit patterns of float16 / bfloat16."""
    name = lookup(precision).name
    if name in ("float32", "float32x3"):
        return np.asarray(w, dtype=np.float32)
    if name == "tf32":
        return _tf32_bits(w).view(np.float32)
    if name == "float16":
        return np.asarray(w, dtype=np.float32).astype(np.float16).view(np.uint16)
    return _bf16_bits(w)


def round_like(a, precision: str):
    """a rounded as it enters a matmul in this mode, in a's own array module (NumPy or CuPy) and dtype (float32 or
    float64; every mode's values are float32 numbers): what the training step's interpreted matmuls multiply
    (engine/autodiff/step.py). float32 mode: a itself; float32x3: refused (the training step does not run it)."""
    name = lookup(precision).name
    _refuse_split("round_like", name)
    if name == "float32":
        return a
    if type(a).__module__.split(".")[0] == "cupy" and a.dtype == np.float32:     # one launch of the kernels' rounding
        if a.flags.c_contiguous:
            return round_values(a, name)
        if a.flags.f_contiguous:                # a transposed operand (W^T dy): the same memory, rounded in place order
            return round_values(a.T, name).T
        return round_values(a.copy(), name)
    dtype = a.dtype
    single = a.astype("float32")
    if name == "float16":
        with np.errstate(over="ignore"):          # past half's range: Inf, as the GPU's conversion gives
            return single.astype("float16").astype(dtype)
    u = single.view("uint32")
    finite = (u & 0x7F800000) != 0x7F800000
    if name == "tf32":
        rounded = (u + 0x1000) & 0xFFFFE000                          # half a TF32 unit, truncated: ties away
    else:
        rounded = (u + (0x7FFF + ((u >> 16) & 1))) & 0xFFFF0000      # nearest, ties to even
    # Inf and NaN pass unchanged (a magnitude carried into the exponent would turn a NaN into an Inf)
    bits = rounded * finite + u * ~finite
    return bits.astype("uint32").view("float32").astype(dtype)
