"""The frozen backward step graph: how one layer's step of a cell propagates adjoints from t to t-1.

It is data derived from a CellGraph (engine.autodiff.derive), read by the NumPy interpreter
(engine.autodiff.step) and, later, by code generators. Its values live in two namespaces that never
clash: forward values the step reads ("saved": the forward node names) and backward values (adjoints,
named "d_<forward node>", and parameter gradients, "grad_<parameter>").

Per step, every backward value is a (B, size) array, except the parameter gradients: those nodes
(`accumulates`) add into one gradient per parameter over the batch and every time step. describe() writes a graph
as text, one line per node.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..ir import CellGraph

# Where a backward node's result goes (BackwardNode.role).
ROLES = ("adjoint", "operand_grad", "weight_grad", "param_grad")
# Where an operand gradient W^T dy flows (BackwardNode.flows_to).
FLOWS = ("input", "state", "internal")


@dataclass(frozen=True)
class BackwardInput:
    """An adjoint that enters the step from outside: the layer output's (from the layer above, or the loss) or a
    state's (carried back from step t+1, or the loss's d_final_states at the last step)."""

    name: str
    source: str            # "output" or "carry"
    state: str             # the state whose value at t it is the adjoint of
    of: str                # the forward node it seeds: that state's next value


@dataclass(frozen=True)
class BackwardNode:
    """name = op(args). args name backward values or saved forward values.

    role "adjoint": a term of (or the whole) adjoint of the forward node `of` at this step.
    role "operand_grad": W^T dy, the adjoint term a matmul gives its operand `of`; `flows_to` says whether that is
        the input x (no recurrence: all steps can be one GEMM after the sweep), a state (recurrent: on the reverse
        wavefront's critical path) or an internal value; `recurrent` whether the operand depends on a state.
    role "weight_grad": dy^T operand, the outer product the matmul `of` gives its weight `param`. Accumulated over
        time, so a later pass can batch every step into one GEMM per layer.
    role "param_grad": a bias's or vector's adjoint summed over the batch; accumulated over time into `param`."""

    name: str
    op: str
    args: tuple[str, ...]
    of: str
    role: str = "adjoint"
    flows_to: str | None = None
    recurrent: bool = False
    param: str | None = None
    attrs: tuple[tuple[str, object], ...] = ()

    @property
    def accumulates(self) -> bool:
        """Whether it adds into a parameter's gradient (over the batch and time) instead of making a value."""
        return self.role in ("weight_grad", "param_grad")

    @property
    def attr_dict(self) -> dict:
        return dict(self.attrs)


@dataclass(frozen=True)
class BackwardGraph:
    """One layer's backward step of `cell`. Run in reverse time: the step at t reads the forward values saved at t,
    the inputs (d_output and each state's carried adjoint) and gives each state's adjoint at t-1, the input's
    adjoint (to the layer below) and adds to the parameter gradients."""

    cell: CellGraph
    inputs: tuple[BackwardInput, ...]
    nodes: tuple[BackwardNode, ...]                 # in execution order: the forward's reverse topological order
    adjoints: tuple[tuple[str, str], ...]           # forward node -> the backward value holding its adjoint
    state_adjoints: tuple[tuple[str, str | None], ...]   # state -> its adjoint at t-1 (None: never read, zero)
    input_adjoint: str | None                       # the adjoint of x_t, for the layer below (None: x not read)
    saved: tuple[str, ...]                          # the forward values the step reads, in forward order

    @cached_property
    def by_name(self) -> dict[str, BackwardNode]:
        return {n.name: n for n in self.nodes}

    @property
    def output_input(self) -> str:
        """The name of the input that carries the layer output's adjoint."""
        return next(i.name for i in self.inputs if i.source == "output")

    def carry_input(self, state: str) -> str:
        """The name of the input that carries `state`'s adjoint back from step t+1."""
        return next(i.name for i in self.inputs if i.source == "carry" and i.state == state)

    def adjoint_of(self, forward_node: str) -> str | None:
        return dict(self.adjoints).get(forward_node)

    def param_grads(self, param: str) -> tuple[BackwardNode, ...]:
        """The nodes that accumulate into `param`'s gradient (a weight: one per matmul that reads it)."""
        return tuple(n for n in self.nodes if n.accumulates and n.param == param)

    def with_role(self, role: str) -> tuple[BackwardNode, ...]:
        return tuple(n for n in self.nodes if n.role == role)

    def describe(self) -> str:
        """Readable text: the inputs, one line per backward node, the outputs (describe below)."""
        return describe(self)


# ---- describe(): a backward step graph as text, one line per node, as explain() shows forward graphs ----------
def describe(graph: BackwardGraph) -> str:
    cell = graph.cell
    dims = cell.dims
    lines = [f"backward step of cell '{cell.name}' ({len(graph.nodes)} nodes, in reverse topological order; "
             "values are (B, size) per step, '+=' accumulates over the batch and every step)"]
    lines.append("  in:")
    for i in graph.inputs:
        where = ("the layer above's input adjoint, or d_outputs" if i.source == "output"
                 else "carried back from step t+1, or d_final_states at t = T-1")
        lines.append(f"    {i.name} (B, {dims[i.of]}): adjoint of {i.state}[t] = {i.of} ({where})")
    lines.append("  saved: " + (", ".join(graph.saved) or "nothing"))
    for node in graph.nodes:
        lines.append("  " + _line(node))
    lines.append("  out:")
    for state, adjoint in graph.state_adjoints:
        lines.append(f"    {state}[t-1]: {adjoint or 'zero (not read)'} -> step t-1")
    x_adjoint = graph.input_adjoint or "zero (not read)"
    lines.append(f"    x[t]: {x_adjoint} -> the layer below (at layer 0: the gradient of x)")
    aliases = _aliases(graph)
    if aliases:
        lines.append("  shared adjoints (a term passed through unchanged: no node):")
        lines += [f"    {value}: also the adjoint of {', '.join(names)}" for value, names in aliases.items()]
    return "\n".join(lines) + "\n"


def _line(node: BackwardNode) -> str:
    args = ", ".join(node.args)
    if node.attrs:
        args += ", " + ", ".join(f"{k}={v}" for k, v in node.attrs)
    text = f"{node.name} {'+=' if node.accumulates else '='} {node.op}({args})"
    if node.role == "weight_grad":
        tag = f"weight gradient of {node.param} (matmul {node.of}), accumulated over time"
    elif node.role == "param_grad":
        tag = f"gradient of {node.param}, accumulated over time"
    elif node.role == "operand_grad":
        tag = f"operand gradient -> {node.flows_to} {node.of}" + (", recurrent" if node.recurrent else "")
    else:
        return text
    return f"{text}  [{tag}]"


def _aliases(graph: BackwardGraph) -> dict[str, list[str]]:
    """Backward value -> the forward nodes whose adjoint it is without being computed for them."""
    owner = {n.name: n.of for n in graph.nodes} | {i.name: i.of for i in graph.inputs}
    shared: dict[str, list[str]] = {}
    for forward, value in graph.adjoints:
        if owner.get(value) != forward:
            shared.setdefault(value, []).append(forward)
    return shared
