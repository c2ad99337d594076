"""The relative error of every gradient of a training step against a reference's, as the training tests measure
it: per array, ||got - want|| / max(||want||, floor * sqrt(size)), so values whose RMS is under `floor` are compared
absolutely (a cell such as s - tanh(s) has near-zero gradients). Arrays may be NumPy or CuPy."""
from __future__ import annotations

import numpy as np

FLOOR = 1e-2


def host(a) -> np.ndarray:
    return np.asarray(a.get() if hasattr(a, "get") else a, dtype=np.float64)


def relative(got, want, floor: float = FLOOR) -> float:
    got, want = host(got), host(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), floor * np.sqrt(want.size)))


def gradient_errors(got, want, state_names, layers: int, finals: bool = False, floor: float = FLOOR) -> dict:
    """{label: relative error} of a Gradients' outputs, x, (final states,) initial states and every layer's
    parameters."""
    pairs = [("outputs", got.outputs, want.outputs), ("x", got.x, want.x)]
    if finals:
        pairs += [(f"final {s}", got.final_states[s], want.final_states[s]) for s in state_names]
    pairs += [(f"initial {s}", got.initial_states[s], want.initial_states[s]) for s in state_names]
    pairs += [(f"layer {l} {p}", got.params[l][p], want.params[l][p]) for l in range(layers) for p in want.params[l]]
    errors = {}
    for label, a, b in pairs:
        try:
            errors[label] = relative(a, b, floor)
        except AssertionError as e:
            raise AssertionError(f"{label}: shapes {e}") from None
    return errors
