"""One backward step of one layer in NumPy: the interpreter of a BackwardGraph, as engine.backends.reference.step
is the interpreter of a CellGraph. It is the living definition of what a backward graph computes."""
from __future__ import annotations

from collections import ChainMap

import numpy as np

from ..ops import apply_backward
from .graph import BackwardGraph, BackwardNode


def backward_step(graph: BackwardGraph, saved: dict[str, np.ndarray], layer_params: dict[str, np.ndarray],
                  incoming: dict[str, np.ndarray], grads: dict[str, np.ndarray], dtype,
                  nodes: tuple[BackwardNode, ...] | None = None) -> dict[str, np.ndarray]:
    """saved: the forward values of this step (name -> (B, size), consts as scalars); incoming: each of
    graph.inputs by name -> (B, size); grads: parameter name -> its gradient so far, added to in place.
    Returns every backward value of the step by name. nodes: a part of graph.nodes to run (engine.autodiff.hoist:
    the part inside the time loop, or the part after it on (T x B, size) rows, every input then stacked alike)."""
    values: dict[str, np.ndarray] = dict(incoming)
    scope = ChainMap(values, saved, layer_params)
    for node in graph.nodes if nodes is None else nodes:
        result = apply_backward(node.op, [scope[a] for a in node.args], node.attr_dict).astype(dtype, copy=False)
        if node.accumulates:
            grads[node.param] += result
        else:
            values[node.name] = result
    return values
