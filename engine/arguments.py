"""Arguments as they enter the engine: integer-like sizes normalised once, wrong kinds refused naming the argument.

A size may come as a Python int, a NumPy integer (np.int64 from an array's shape) or anything else with
`__index__`; it leaves as a Python int, so every later check and every dataclass holds one kind of value. A bool,
a float (even 3.0) or a string is refused: silently truncating 2.5 layers, or reading True as 1, hides a mistake.
"""
from __future__ import annotations

import math
import operator
from typing import Callable

import numpy as np

from .errors import BackendError, EngineError

SIZE_LIMIT = 1 << 20          # a sanity bound on one size (hidden_size, layers, a pool window): far past any real net
FLOAT32_MAX = float(np.finfo(np.float32).max)    # the GPU kernels hold every constant as a float


def shown(value, width: int = 60) -> str:
    """repr(value) cut to `width` characters, safe for integers longer than Python prints (int_max_str_digits)
    and for values nested deeper than repr recurses."""
    try:
        text = repr(value)
    except RecursionError:
        return f"a {type(value).__name__} nested too deeply to show"
    except ValueError:
        return f"an integer of {int(value.bit_length() * 0.30103) + 1} digits"
    return text if len(text) <= width else text[:width - 3] + "..."


def finite_float32(value) -> bool:
    """A number (not a bool) that a float32 holds: finite, |value| <= 3.4e38."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        number = float(value)
    except OverflowError:
        return False
    return math.isfinite(number) and abs(number) <= FLOAT32_MAX


def integer(value, name: str, *, low: int = 1, high: int | None = SIZE_LIMIT, where: str = "",
            error: Callable[[str], EngineError] = BackendError) -> int:
    """`value` as a Python int in [low, high]; `error` naming `name` (and `where`, e.g. "net 'n', block 0")
    otherwise."""
    prefix = f"{where}: " if where else ""
    try:
        number = None if type(value).__name__ in ("bool", "bool_") else operator.index(value)
    except TypeError:
        number = None
    wanted = "a positive integer" if low == 1 else f"an integer of at least {low}"
    if number is None:
        raise error(f"{prefix}{name} must be {wanted}, got {type(value).__name__} {shown(value)}; hint: pass a whole "
                    f"number such as {max(low, 1) * 4}")
    if number < low:
        raise error(f"{prefix}{name} must be {wanted}, got {shown(number)}; hint: pass a whole number such as "
                    f"{max(low, 1) * 4}")
    if high is not None and number > high:
        raise error(f"{prefix}{name}={shown(number)} is larger than the limit {high:,}; hint: sizes of a real network are "
                    "far smaller; check the value")
    return number


def normalised(value):
    """An integer-like value (np.int64, anything with __index__ but a bool) as a Python int; anything else as it is,
    for a later check to refuse naming its argument."""
    if type(value) is int or type(value).__name__ in ("bool", "bool_"):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value


def float_dtype(dtype, name: str = "dtype", *, error: Callable[[str], EngineError] = BackendError):
    """`dtype` as np.dtype when it is float32 or float64; `error` naming the argument otherwise."""
    try:
        value = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError):     # np.dtype(",") parses the string as a Python literal
        value = None
    if value is None or value not in (np.float32, np.float64):
        shown_dtype = value.name if value is not None else shown(dtype)
        raise error(f"argument '{name}' must be float32 or float64, got {shown_dtype}; hint: {name}=np.float32 or "
                    f"{name}=np.float64")
    return value
