"""engine/autodiff: automatic differentiation of any cell, and backpropagation through time (bptt) on the NumPy
reference, through CuPy op by op ("naive") and as the generated fused training step ("fused", fp32 on the GPU).

    from engine.autodiff import backward_graph, bptt
    print(backward_graph(cell).describe())       # the backward step: one line per node
    g = bptt(network, params, x, d_outputs=dL_dh)  # g.params, g.x, g.initial_states (+ the forward's outputs)

May import: engine.ir, engine.ops, engine.plan (Lin), engine.codegen, engine.backends, engine.network, engine.params,
engine.errors, engine.schedules.base (compile_kernel, for the persistent launches). Never: engine.api, engine.bench,
engine.explain, engine.export, engine.training, engine.torch_module, engine.multigpu, engine.nets, app. No module of
this folder imports the package itself (`engine.autodiff`) or bptt.py, which orchestrates them.

What lives where:
- the backward step: derive.py derives it (backward_graph) from the op table's gradient rules (engine.ops: OpDef.vjp,
  GRAD_OPS) as a frozen BackwardGraph (graph.py, with its text); hoist.py splits it into what runs every step and what
  runs once a layer after the sweep (derived(cell): the cached split); step.py interprets it.
- results and orchestration: gradients.py (Gradients, what every backend returns); bptt.py (bptt, record: checks the
  arguments and chooses the backend); tape.py (the step-by-step reference's forward, Tape and its reverse sweep);
  checks.py (argument and memory checks); errors.py (AutodiffError).
- the fused step: fused_plan.py (the plan's data types), fused_planner.py and fused_planner_backward.py (training_plan),
  fused_describe.py (the plan as text), stage_fusion.py (GEMM + kernel as one launch), fused_codegen.py (its CUDA),
  persistent.py (a chunk of steps as one cooperative launch), cublas.py (sgemm through ctypes, split-K),
  fused_layer.py (a layer's buffers), fused_runner.py (the launches), fused_program.py (a (network, T, B)'s buffers and
  CUDA graphs, wavefront.py's order), fused_cache.py (programs and runners kept), fused_gradients.py (the gradients'
  buffer), fused_tape.py (record and FusedTape: the fused backend's entry), fused_numpy.py (the same plan through
  NumPy, for the CPU tests).
"""
from .bptt import bptt, record
from .derive import active_nodes, backward_graph
from .errors import AutodiffError
from .gradients import Gradients
from .graph import BackwardGraph, BackwardInput, BackwardNode
from .tape import Tape

__all__ = ["bptt", "record", "Tape", "Gradients", "backward_graph", "active_nodes", "AutodiffError", "BackwardGraph",
           "BackwardInput", "BackwardNode"]
