"""One backward step of one layer in NumPy: the interpreter of a BackwardGraph, as engine.backends.reference.step
is the interpreter of a CellGraph. It is the living definition of what a backward graph computes."""
from __future__ import annotations

from collections import ChainMap

import numpy as np

from ..ops import GRAD_OPS, apply_backward
from ..rounding import round_like
from .graph import BackwardGraph, BackwardNode

# the backward ops that are matmuls (engine.ops: kind "matmul"), whose operands a precision mode rounds
MATMULS = frozenset(name for name, op in GRAD_OPS.items() if op.kind == "matmul")


def backward_step(graph: BackwardGraph, saved: dict[str, np.ndarray], layer_params: dict[str, np.ndarray],
                  incoming: dict[str, np.ndarray], grads: dict[str, np.ndarray], dtype,
                  nodes: tuple[BackwardNode, ...] | None = None, precision: str = "float32",
                  exact: frozenset = frozenset()) -> dict[str, np.ndarray]:
    """saved: the forward values of this step (name -> (B, size), consts as scalars); incoming: each of
    graph.inputs by name -> (B, size); grads: parameter name -> its gradient so far, added to in place.
    Returns every backward value of the step by name. nodes: a part of graph.nodes to run (engine.autodiff.hoist:
    the part inside the time loop, or the part after it on (T x B, size) rows, every input then stacked alike).
    precision: a mode of engine.codegen.precision: both operands of every matmul (an operand's adjoint W^T dy, a
    weight's gradient dy^T operand) rounded to its format first, as the forward's are; the rest stays in `dtype`.
    exact: weights whose matmuls are sums (a reduction's fixed matrix in the dense form, engine/dense.py), which no
    mode rounds."""
    values: dict[str, np.ndarray] = dict(incoming)
    scope = ChainMap(values, saved, layer_params)
    for node in graph.nodes if nodes is None else nodes:
        args = [scope[a] for a in node.args]
        if precision != "float32" and node.op in MATMULS and not (
                exact and (node.param in exact or any(a in exact for a in node.args))):
            args = [round_like(a, precision) for a in args]
        result = apply_backward(node.op, args, node.attr_dict).astype(dtype, copy=False)
        if node.accumulates:
            grads[node.param] += result
        else:
            values[node.name] = result
    return values
