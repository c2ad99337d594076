"""describe(): a backward step graph as text, one line per node, as explain() shows forward graphs."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .graph import BackwardGraph, BackwardNode


def describe(graph: "BackwardGraph") -> str:
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


def _line(node: "BackwardNode") -> str:
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


def _aliases(graph: "BackwardGraph") -> dict[str, list[str]]:
    """Backward value -> the forward nodes whose adjoint it is without being computed for them."""
    owner = {n.name: n.of for n in graph.nodes} | {i.name: i.of for i in graph.inputs}
    shared: dict[str, list[str]] = {}
    for forward, value in graph.adjoints:
        if owner.get(value) != forward:
            shared.setdefault(value, []).append(forward)
    return shared
