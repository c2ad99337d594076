"""Pooling over time: the one computation of a Pool block, on NumPy or CuPy arrays."""
from __future__ import annotations

from ..backends.common import array_module_of
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
