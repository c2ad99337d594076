"""Error of an implementation's output against a reference, overall and per time step.

All functions take arrays of one array module (NumPy or CuPy, `xp`), in float64, shaped (T, B, H),
and return plain Python floats and lists (JSON-ready; non-finite values become None).
"""
from __future__ import annotations

import math

# Relative error (max |out - ref| / max |ref|) against the float64 reference above which an
# implementation is reported as wrong. fp32-class results are gated: a bug gives O(1) errors,
# rounding gives ~1e-6. Reduced precisions are reported against a looser bound but not gated:
# only non-finite outputs disqualify them.
TOLERANCE = {"fp64": 1e-9, "fp32": 1e-3, "fp32x3": 1e-3, "tf32": 5e-2, "fp16": 1e-1, "bf16": 2.5e-1}
GATED = ("fp64", "fp32", "fp32x3")
# fp32 on tensor cores (fp32x3, 3xTF32) claims fp32-level error: its max relative error against float64 at most this
# many times cuDNN fp32's (TF32 off) on the same inputs (issue #34, item 2). Reported, beside both errors.
FP32X3_BOUND = 2.0


def _number(value, digits: int | None = None) -> float | None:
    value = float(value)
    if not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}") if digits else value


def error_summary(out, ref, xp, precision: str = "fp32") -> dict:
    """{"max_abs", "mean_abs", "rel", "nonfinite", "tolerance", "within_tolerance"}."""
    nonfinite = int(xp.count_nonzero(~xp.isfinite(out)))
    diff = xp.abs(out - ref)
    scale = float(xp.max(xp.abs(ref))) or 1.0
    max_abs = _number(xp.max(diff))
    rel = None if max_abs is None else max_abs / scale
    tolerance = TOLERANCE.get(precision)
    return {"max_abs": max_abs, "mean_abs": _number(xp.mean(diff)), "rel": rel, "nonfinite": nonfinite,
            "tolerance": tolerance,
            "within_tolerance": bool(nonfinite == 0 and rel is not None and (tolerance is None or rel <= tolerance))}


def step_curves(out, ref, xp) -> dict[str, list]:
    """Per time step t: max and mean over (B, H) of |out - ref|. {"max": [T], "mean": [T]}."""
    steps = out.shape[0]
    diff = xp.abs(out - ref).reshape(steps, -1)
    maxima = diff.max(axis=1)
    means = diff.mean(axis=1)
    if hasattr(maxima, "get"):            # CuPy: one copy each to the host
        maxima, means = maxima.get(), means.get()
    # 4 significant digits: enough for a plot, and T values per curve stay small in the results file.
    return {"max": [_number(v, 4) for v in maxima], "mean": [_number(v, 4) for v in means]}


def error_bound(entry: dict, cudnn_fp32: dict | None) -> dict | None:
    """For an fp32x3 row: its relative error against float64, cuDNN fp32's on the same inputs, their ratio and
    whether it is within FP32X3_BOUND; None for other rows, or where either error is missing."""
    if entry.get("precision") != "fp32x3" or cudnn_fp32 is None:
        return None
    rel, base = (entry.get("error") or {}).get("rel"), (cudnn_fp32.get("error") or {}).get("rel")
    if rel is None or base is None:
        return None
    ratio = rel / base if base > 0 else (1.0 if rel == 0 else math.inf)
    return {"rel": rel, "cudnn_fp32_rel": base, "ratio": _number(ratio, 4), "bound": FP32X3_BOUND,
            "within": bool(ratio <= FP32X3_BOUND)}


def gate(summary: dict, precision: str) -> str | None:
    """Why an output disqualifies the implementation from timing, or None."""
    if summary["nonfinite"]:
        return (f"output has {summary['nonfinite']} non-finite element(s) (NaN-poisoned outputs left unwritten, "
                "or an overflow)")
    if precision in GATED and not summary["within_tolerance"]:
        return (f"relative error {summary['rel']:.3g} against the float64 reference exceeds "
                f"{summary['tolerance']:g}")
    return None
