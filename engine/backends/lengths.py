"""Variable-length batches (issue #35): `lengths` (B,) gives each sequence's number of steps in a (T, B, I) batch
padded at the end. Sequence b runs steps 0 .. lengths[b] - 1; after its last step its states stay as they are (so
the final states are each sequence's own last ones), its outputs are zero, and the loss's gradients with respect to
them are ignored, as torch.nn.LSTM does with a PackedSequence.

    run(network, params, x, lengths=[5, 3])      # x: (5, 2, I); sequence 1's steps 3 and 4 are padding
"""
from __future__ import annotations

import numpy as np

from ..arguments import shown
from ..errors import BackendError


def check_lengths(lengths, T: int, B: int) -> np.ndarray | None:
    """lengths as a host int64 array (B,) with 1 <= lengths[b] <= T, or None; errors name the argument."""
    if lengths is None:
        return None
    if type(lengths).__module__.split(".")[0] in ("cupy", "torch"):
        lengths = lengths.get() if hasattr(lengths, "get") else lengths.cpu().numpy()
    try:
        array = np.asarray(lengths)
    except (TypeError, ValueError):
        array = np.asarray(None)
    if array.ndim != 1 or array.shape[0] != B or array.dtype.kind not in "iu" or array.dtype == bool:
        raise BackendError(f"argument 'lengths' must be {B} integers, one a sequence of the batch, got "
                           f"{shown(lengths)}; hint: lengths=[T, ...] for sequences padded at the end to T steps")
    if array.min() < 1 or array.max() > T:
        raise BackendError(f"argument 'lengths' must lie in 1 .. {T} (the batch's steps), got {array.tolist()[:16]}; "
                           "hint: a sequence has at least one step and at most x.shape[0]")
    return array.astype(np.int64)


def within(lengths, T: int) -> np.ndarray:
    """(T, B) bool: True where step t lies within sequence b (t < lengths[b])."""
    return np.arange(T)[:, None] < np.asarray(lengths)[None, :]


def step_masks(lengths: np.ndarray | None, T: int, dtype, xp) -> list | None:
    """[t]: (B, 1) array of 1 where step t lies within the sequence and 0 past its end (None without lengths)."""
    if lengths is None:
        return None
    device = xp.asarray(within(lengths, T).astype(dtype))                      # (T, B)
    return [device[t][:, None] for t in range(T)]


def hold_past_end(next_states: dict, states: dict, mask, xp) -> dict:
    """The states after a step of a padded batch: the step's where mask (B, 1) is 1, unchanged where it is 0."""
    return {s: xp.where(mask > 0, v, states[s]) for s, v in next_states.items()}


# What takes lengths= where: engine.run's backends (the GPU schedules through kernels that hold the rows past their
# end, engine/passes/lengths.py), and bptt's (the fused training step likewise, engine/autodiff/fused_lengths.py).
RUN_BACKENDS = ("reference", "fused", "graph", "persistent")
BPTT_BACKENDS = ("reference", "naive", "fused")


def only_on(backend: str, where: str, takes: tuple[str, ...] = RUN_BACKENDS) -> BackendError:
    """The refusal of lengths= on a backend that runs batches of one length, naming those that take it."""
    if backend == "scan":
        return BackendError(f"{where}: schedule 'scan' runs batches of one length (its scan over time has no row "
                            f"that ends early); lengths= runs on {', '.join(map(repr, takes))}; hint: "
                            "backend='auto' picks a schedule that takes lengths")
    return BackendError(f"{where}: lengths= runs on {', '.join(map(repr, takes))}, not {backend!r}; hint: one of "
                        "those, or group the sequences by length and run each group without lengths")
