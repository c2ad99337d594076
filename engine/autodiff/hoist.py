"""The pass split_backward: which nodes of a backward step must run inside the reverse time loop, and which can
run once a layer after it, on the whole sequence stacked into T x B rows.

Only the states' adjoints at t - 1 carry from one step to the next. Everything else a backward step computes (the
parameter gradients, the input's adjoint for the layer below, and the values only they read) can wait until the
sweep is over and then run on every step at once: each weight gradient becomes one GEMM over T x B rows (dy^T
operand, summed over the batch and time in one product), the input's adjoint one GEMM, each bias gradient one sum.
It is the forward's hoisting of the input projections, mirrored, and what the generated backward will do with
cuBLAS; the interpreters (NumPy, CuPy) already run it this way. The pass reads a BackwardGraph and returns a new
frozen split; it never edits the graph.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from .derive import backward_graph
from .graph import BackwardGraph, BackwardNode


@dataclass(frozen=True)
class BackwardSplit:
    graph: BackwardGraph
    per_step: tuple[BackwardNode, ...]   # the reverse sweep's critical path: what the states' adjoints at t-1 need
    after: tuple[BackwardNode, ...]      # once a layer after the sweep, on (T x B, size) rows
    recorded: tuple[str, ...]            # backward values of each step (per_step nodes' or the step's inputs) that
    #                                      the `after` nodes read, or the input's adjoint itself: kept for every step
    saved_after: tuple[str, ...]         # forward values the `after` nodes read (stacked over the steps)

    def describe(self) -> str:
        def names(nodes):
            return ", ".join(f"{n.name} ({n.op})" for n in nodes) or "none"
        return "\n".join([f"backward split of cell '{self.graph.cell.name}':",
                          f"  every step ({len(self.per_step)}): {names(self.per_step)}",
                          f"  once a layer, T x B rows ({len(self.after)}): {names(self.after)}",
                          f"  kept for every step: {', '.join(self.recorded) or 'none'}"])


def split_backward(graph: BackwardGraph) -> BackwardSplit:
    """Split `graph` into the nodes the states' adjoints depend on (per step) and the rest (after the sweep)."""
    by_name = graph.by_name
    needed = {name for _, name in graph.state_adjoints if name}
    in_loop: set[str] = set()
    for node in reversed(graph.nodes):                  # consumers before producers
        if node.name in needed and not node.accumulates:
            in_loop.add(node.name)
            needed.update(a for a in node.args if a in by_name)
    per_step = tuple(n for n in graph.nodes if n.name in in_loop)
    after = tuple(n for n in graph.nodes if n.name not in in_loop)
    made_after = {n.name for n in after}
    step_values = in_loop | {i.name for i in graph.inputs}
    reads = [a for n in after for a in n.args]
    if graph.input_adjoint is not None and graph.input_adjoint not in made_after:
        reads.append(graph.input_adjoint)               # the input's adjoint is a value of the step itself
    recorded = tuple(dict.fromkeys(a for a in reads if a in step_values))
    saved_after = tuple(dict.fromkeys(a for a in reads if a in graph.cell.by_name))
    return BackwardSplit(graph, per_step, after, recorded, saved_after)


@functools.lru_cache(maxsize=64)
def derived(cell) -> BackwardSplit:
    """The cell's backward graph, split: a pure function of the frozen cell, so derived once, not at every training
    step."""
    return split_backward(backward_graph(cell))
