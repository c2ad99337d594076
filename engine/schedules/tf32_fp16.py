"""tf32's step products on fp16 tensor cores: the same values from half the bytes.

    stored, scale = scaled_weight(np, w)                 # fp16(tf32(w) * 2^s), and 2^-(OPERAND_SHIFT + s)
    copy = fp16(tf32(h) * 2^OPERAND_SHIFT)               # what the cell's kernels write (rnn_copy_tf32_fp16)
    out = (copy @ stored^T) * scale                      # cublasLt, fp16 operands, fp32 sums, alpha = scale

A TF32 value has an 11-bit significand, as an fp16 value has; what fp16 lacks is exponent range (normal from 2^-14 to
65504). Shifted by a power of two into that range, a TF32 operand is an fp16 one exactly, and its products, summed in
fp32 and shifted back by alpha (exact), are the TF32 products. So precision="tf32" on the fused backend holds a step
GEMM's weight and its operand's copy that way (tf32_storage="fp16", what "auto" picks where the step products run on
cuBLAS): the weight the step streams is half the bytes and the MMAs run at fp16's rate. On an H200 (2026-11-28,
benchmarks/probe_x3_promote.py --modes) cublasLt's fp16 product took 4.98 us at `large`'s LSTM layer against 7.35 in
TF32, and 16.3 against 30.6 at blogA's. The projections' inputs are the user's data, of any range: those GEMMs stay
TF32.

Where the shift cannot hold the values:
- a weight: the shift puts its largest |w| in [2^14, 2^15). Values under 2^-14 after it become fp16 subnormals,
  which keep fewer bits; a weight holds them to within 2^-25 after the shift, 2^-39 or less of its largest value,
  and a row whose largest value is at least 2^-ROW_SPAN of the weight's keeps that under 2^-21 of its own. A weight
  with a nonzero row further down (a gate whose weights are ~2^18 smaller than another's) cannot: check_weight says
  so and the program runs again with tf32_storage="tf32" (engine/schedules/fused_modes.py).
- a step operand (h, or what the cell multiplies by a weight in a step): shifted by 2^OPERAND_SHIFT, values up to
  OPERAND_LIMIT (~64) fit. One past it sets the copies' range flag, and the program runs again in TF32 storage, as
  float32x3's fp16 parts do. One under 2^-24 (2^-14 after the shift) is held to within 2^-35 absolute: for |v| >=
  2^-24 that is within TF32's own rounding (2^-11 |v|), and below it the product's error from it is under 2^-35
  |w| a term.
"""
from __future__ import annotations

import math

import numpy as np

from ..codegen.cuda import ROUND_THREADS, file_entry, round_blocks
from ..rounding import round_operand

OPERAND_SHIFT = 10                    # a step operand's copy: fp16(tf32(v) * 2^10)
OPERAND_LIMIT = 65504.0 / 2 ** OPERAND_SHIFT
WEIGHT_TOP = 14                       # a weight's largest |w| shifted into [2^14, 2^15)
ROW_SPAN = 18                         # every nonzero row's largest |w| at least 2^-18 of the weight's
TF32_STORAGES = ("auto", "fp16", "tf32")


def weight_shift(rounded) -> int:
    """The power of two a weight's TF32 values (float64) are multiplied by: its largest |w| into [2^14, 2^15)."""
    top = float(np.max(np.abs(rounded))) if rounded.size else 0.0
    if not top or not math.isfinite(top):
        return 0
    return WEIGHT_TOP - math.frexp(top)[1] + 1


def check_weight(w) -> str | None:
    """Why a weight (N, K) cannot be held as shifted fp16, or None where it can: a value not finite, or a nonzero row
    whose largest |w| is under 2^-ROW_SPAN of the weight's (fp16's subnormals would cost it its low bits)."""
    single = np.asarray(w, dtype=np.float32)
    if not np.isfinite(single).all():
        return "has values that are not finite"
    # TF32 rounding keeps order and sign, so a row's largest |tf32(w)| is tf32 of its largest |w|: only those round
    rows = round_operand(np.abs(single.reshape(single.shape[0], -1)).max(axis=1), "tf32") if single.size else \
        np.zeros(0)
    top = float(rows.max()) if rows.size else 0.0
    low = rows[(rows > 0) & (rows < top * 2.0 ** -ROW_SPAN)]
    if low.size:
        return (f"has a row whose largest |w| ({float(low.min()):.3g}) is under 2^-{ROW_SPAN} of the weight's "
                f"({top:.3g}): fp16 after one shift would lose its low bits")
    return None


def scaled_weight(w) -> tuple[np.ndarray, float]:
    """A weight (N, K) as the step products hold it, on the host: fp16(tf32(w) * 2^s), and the scale the products'
    sums are multiplied by, 2^-(OPERAND_SHIFT + s). The shift is exact and only subnormals round (check_weight)."""
    rounded = round_operand(np.asarray(w, dtype=np.float32), "tf32")
    shift = weight_shift(rounded)
    stored = (rounded * 2.0 ** shift).astype(np.float32).astype(np.float16)
    return stored, 2.0 ** -(OPERAND_SHIFT + shift)


def scaled_operand(a) -> np.ndarray:
    """A step operand as its copy holds it, on the host: fp16(tf32(a) * 2^OPERAND_SHIFT) (inf past OPERAND_LIMIT)."""
    with np.errstate(over="ignore"):
        return (round_operand(np.asarray(a, dtype=np.float32), "tf32") * 2.0 ** OPERAND_SHIFT).astype(
            np.float32).astype(np.float16)


def product_numpy(operand, stored, scale: float):
    """What the step product computes, in float64: the shifted fp16 operand (scaled_operand of the fp32 values) by
    the stored weight, times the scale; the GPU differs by its fp32 sums alone."""
    return (scaled_operand(operand).astype(np.float64) @ stored.astype(np.float64).T) * scale


def in_range(values) -> bool:
    """Whether every value of a step operand fits its copy (|v| <= OPERAND_LIMIT; NaN aside)."""
    values = np.asarray(values)
    return not values.size or not bool((np.abs(values) > OPERAND_LIMIT).any())


def round_into(cupy, source, out, flag) -> None:
    """source (float32, C-contiguous) -> out (float16, as many elements): the copy's values, as the kernels write
    them (kernels/tf32_fp16.cu), on the current stream, nothing allocated; flag (a uint32 device array of one) set
    where a value is past OPERAND_LIMIT."""
    n = source.size
    file_entry(cupy, "tf32_fp16.cu", "round_tf32_fp16")((round_blocks(cupy, n),), (ROUND_THREADS,),
                                                        (cupy.ascontiguousarray(source), out, np.int64(n), flag))
