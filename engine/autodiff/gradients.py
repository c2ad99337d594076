"""Gradients: what bptt and Tape.backward return, on every backend (a result type, apart from the code that runs the
passes: engine/autodiff/bptt.py chooses the backend, engine/autodiff/tape.py and fused_tape.py fill it)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Gradients:
    """NumPy arrays from backend="reference", CuPy arrays (on the GPU) from backend="naive"."""
    params: list[dict[str, np.ndarray]]    # per layer: parameter name -> gradient, the parameter's shape
    x: np.ndarray | None                   # (T, B, I); None where the backward was asked not to (input_gradient)
    initial_states: dict[str, np.ndarray]  # state name -> (L, B, size)
    outputs: np.ndarray                    # (T, B, output size): the forward outputs of the same pass
    final_states: dict[str, np.ndarray]    # state name -> (L, B, size): the forward final states
