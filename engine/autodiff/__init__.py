"""Automatic differentiation of any cell, and backpropagation through time on the NumPy reference.

    from engine.autodiff import backward_graph
    print(backward_graph(cell).describe())       # the backward step: one line per node

The gradient rules live with the op table (engine.ops: OpDef.vjp, GRAD_OPS). backward_graph derives from them a
frozen backward step graph (graph.py) whose matmul gradients are tagged for the later GPU passes: weight gradients
accumulated over time, operand gradients flowing to the input, a state or an internal value.
"""
from .derive import active_nodes, backward_graph
from .errors import AutodiffError
from .graph import BackwardGraph, BackwardInput, BackwardNode

__all__ = ["backward_graph", "active_nodes", "AutodiffError", "BackwardGraph", "BackwardInput", "BackwardNode"]
