"""LaTeX equations of a cell, generated from the graph (so they always match what runs).

Named values (gates, states' next values) get one equation each; auto-named intermediates are
inlined into the expression that uses them.
"""
from __future__ import annotations

import re

from .ir import CellGraph
from .ops import OPS

_PRECEDENCE = {"add": 1, "sub": 1, "neg": 2, "one_minus": 1, "mul": 2, "scale": 2, "matmul": 3}


def symbol(name: str) -> str:
    """x -> x_t, h -> h_{t-1} is done by the caller; here W_hi -> W_{hi}, b_ii -> b_{ii}."""
    head, _, tail = name.partition("_")
    head = {"sigma": r"\sigma"}.get(head, head)
    if not tail:
        return head
    tail = tail.replace("_", r"\_")
    return f"{head}_{{{tail}}}"


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
            return f"{symbol(name)}_t" if "_" not in name else symbol(name)
        if node.op == "state":
            return f"{symbol(name)}_{{t-1}}"
        if node.op == "const":
            value = node.attr("value")
            return f"{value:g}"
        if name in state_next:
            return f"{symbol(state_next[name])}_t"
        if _is_inlined(graph, name):
            return expr(name)
        return symbol(name)

    def wrap(arg: str, parent: str) -> str:
        text = ref(arg)
        node = graph[arg]
        if not node.is_leaf and _is_inlined(graph, arg) and node.op in _PRECEDENCE and parent in _PRECEDENCE:
            if _PRECEDENCE[node.op] < _PRECEDENCE[parent]:
                return rf"\left({text}\right)"
        return text

    def expr(name: str) -> str:
        node = graph[name]
        spec = OPS[node.op]
        if node.op == "matmul":
            return f"{symbol(node.args[0])}\\,{wrap(node.args[1], 'matmul')}"
        values = {port: wrap(a, node.op) for port, a in zip(spec.ports, node.args)}
        if node.op == "scale":
            values["factor"] = f"{node.attr('factor'):g}"
        if node.op == "sub":
            values["b"] = rf"\left({ref(node.args[1])}\right)" if (
                _is_inlined(graph, node.args[1]) and graph[node.args[1]].op in ("add", "sub")) else values["b"]
        return spec.latex.format(**values)

    lines = []
    for name in graph.topo_order:
        node = graph[name]
        if node.is_leaf or (_is_inlined(graph, name) and name not in state_next):
            continue
        lhs = f"{symbol(state_next[name])}_t" if name in state_next else symbol(name)
        lines.append(f"{lhs} &= {expr(name)}")
        _ = state_names
    return lines


def to_latex(graph: CellGraph) -> str:
    """One aligned block, ready for st.latex or a paper."""
    return "\\begin{aligned}\n" + " \\\\\n".join(equations(graph)) + "\n\\end{aligned}"
