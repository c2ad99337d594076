"""Automatic differentiation of any cell, and backpropagation through time on the NumPy reference.

    from engine.autodiff import backward_graph, bptt
    print(backward_graph(cell).describe())       # the backward step: one line per node
    g = bptt(network, params, x, d_outputs=dL_dh)  # g.params, g.x, g.initial_states (+ the forward's outputs)

The gradient rules live with the op table (engine.ops: OpDef.vjp, GRAD_OPS). backward_graph derives from them a
frozen backward step graph (graph.py) whose matmul gradients are tagged for the later GPU passes: weight gradients
accumulated over time, operand gradients flowing to the input, a state or an internal value. bptt interprets it
(step.py) over all layers and steps; record() runs the forward pass and returns a Tape whose backward() gives the
gradients later (what a torch.autograd.Function needs); backend="naive" does both on the GPU through CuPy, and
backend="fused" (fp32) runs the generated training step: fused_plan.py plans it from the split (hoist.py),
fused_codegen.py writes its CUDA, fused.py launches it (CUDA graphs, cuBLAS), fused_numpy.py runs the same plan
through NumPy for the CPU tests.
"""
from .bptt import Gradients, Tape, bptt, record
from .derive import active_nodes, backward_graph
from .errors import AutodiffError
from .graph import BackwardGraph, BackwardInput, BackwardNode

__all__ = ["bptt", "record", "Tape", "Gradients", "backward_graph", "active_nodes", "AutodiffError", "BackwardGraph", "BackwardInput",
           "BackwardNode"]
