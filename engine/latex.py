"""LaTeX equations of a cell, generated from the graph (so they always match what runs).

Named values (gates, states' next values) get one equation each; auto-named intermediates are
inlined into the expression that uses them.
"""
from __future__ import annotations

import re

from .ir import CellGraph
from .ops import OPS, needs_parens


def symbol(name: str, time: str | None = None) -> str:
    """W_hi -> W_{hi}; with time "t-1": h -> h_{t-1}, h_slow -> h_{slow,t-1} (one subscript, never two)."""
    head, _, tail = name.partition("_")
    head = {"sigma": r"\sigma"}.get(head, head)
    if tail == "tilde":                     # h_tilde -> \tilde{h}, the usual candidate notation
        head, tail = rf"\tilde{{{head}}}", ""
    parts = [tail.replace("_", r"\_")] if tail else []
    if time is not None:
        parts.append(time)
    if not parts:
        return head
    if parts == ["t"]:
        return f"{head}_t"
    return f"{head}_{{{','.join(parts)}}}"


def _is_inlined(graph: CellGraph, name: str) -> bool:
    node = graph[name]
    if node.is_leaf:
        return False
    if name in {s.next for s in graph.states}:
        return False
    # auto-generated names (from the DSL) carry a suffix of the op or "_pre"; those are inlined
    return bool(re.search(r"_(pre|add|sub|mul|neg|one_minus|scale|sigmoid|tanh|relu|hard_sigmoid|identity)(_\d+)?$",
                          name)) or node.op == "matmul"


def equations(graph: CellGraph) -> list[str]:
    state_next = {s.next: s.name for s in graph.states}
    state_names = set(graph.state_names)

    def ref(name: str) -> str:
        node = graph[name]
        if node.op == "input":
            return symbol(name) if name.endswith("_t") else symbol(name, "t")
        if node.op == "state":
            return symbol(name, "t-1")
        if node.op == "const":
            value = node.attr("value")
            return f"{value:g}"
        if name in state_next:
            return symbol(state_next[name], "t")
        if _is_inlined(graph, name):
            return expr(name)
        return symbol(name)

    def wrap(arg: str, parent: str, right: bool = False) -> str:
        text = ref(arg)
        node = graph[arg]
        if not node.is_leaf and _is_inlined(graph, arg) and needs_parens(node.op, parent, right):
            return rf"\left({text}\right)"
        return text

    def expr(name: str) -> str:
        node = graph[name]
        spec = OPS[node.op]
        if node.op == "matmul":
            return f"{symbol(node.args[0])}\\,{wrap(node.args[1], 'matmul')}"
        values = {port: wrap(a, node.op, right=k > 0) for k, (port, a) in enumerate(zip(spec.ports, node.args))}
        if node.op == "scale":
            values["factor"] = f"{node.attr('factor'):g}"
        return spec.latex.format(**values)

    lines = []
    for name in graph.topo_order:
        node = graph[name]
        if node.is_leaf or (_is_inlined(graph, name) and name not in state_next):
            continue
        lhs = symbol(state_next[name], "t") if name in state_next else symbol(name)
        lines.append(f"{lhs} &= {expr(name)}")
        _ = state_names
    return lines


def to_latex(graph: CellGraph) -> str:
    """One aligned block, ready for st.latex or a paper."""
    return "\\begin{aligned}\n" + " \\\\\n".join(equations(graph)) + "\n\\end{aligned}"
