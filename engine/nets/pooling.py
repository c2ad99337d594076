"""Pooling over time: the one computation of a Pool block, on NumPy or CuPy arrays."""
from __future__ import annotations

import numpy as np

from ..backends.common import array_module_of
from ..backends.lengths import within
from ..errors import BackendError
from .data import Pool


def pool_over_time(x, block: Pool):
    """(T, B, F) -> (T', B, F): block.op over windows of block.window steps every block.stride steps (NumPy or
    CuPy arrays alike)."""
    xp = array_module_of(x)
    steps = block.steps_out(x.shape[0])
    if steps <= 0:                              # shorter than a window (the tail of a chunked run): nothing
        return x[:0]
    starts = xp.arange(steps) * block.stride
    windows = x[starts[:, None] + xp.arange(block.window)[None, :]]      # (T', window, B, F): one gather
    return windows.max(axis=1) if block.op == "max" else windows.mean(axis=1)


def pooled_lengths(lengths, block: Pool, where: str):
    """Each sequence's steps after the pool: the windows that lie wholly within it (so a max or mean never reads
    padding); a sequence shorter than the window is refused by name."""
    out = block.steps_out(lengths)
    if (out < 1).any():
        b = int(np.argmax(out < 1))
        raise BackendError(f"{where}: sequence {b} has {int(lengths[b])} step(s) when it reaches pool "
                           f"'{block.label}', shorter than its window of {block.window}; hint: longer sequences, or a "
                           "smaller pool window")
    return out


def zero_past(value, lengths):
    """value (T, B, F) with the steps past each sequence's end set to 0."""
    xp = array_module_of(value)
    return xp.where(xp.asarray(within(lengths, value.shape[0]))[..., None], value, 0)
