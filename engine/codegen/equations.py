"""The cell's equations as plain text, for the header comment of generated CUDA.

Generated from the graph, so the comment always says what the code computes:

    i = sigmoid(W_ii x[t] + b_ii + W_hi h[t-1] + b_hi)
    c[t] = f * c[t-1] + i * g

Values the user named get a line each; matmuls and auto-named intermediates (the DSL's "_pre",
"_mul", ... suffixes) are written inline where they are used.
"""
from __future__ import annotations

import re

from ..ir import CellGraph
from ..ops import needs_parens

_AUTO_NAME = re.compile(r"_(pre|add|sub|mul|neg|one_minus|scale|sigmoid|tanh|relu|hard_sigmoid|identity)(_\d+)?$")
_FUNCTIONS = ("sigmoid", "tanh", "relu", "hard_sigmoid", "identity")


def text_equations(cell: CellGraph) -> list[str]:
    state_next = {}
    for s in cell.states:
        state_next.setdefault(s.next, s.name)

    def inlined(name: str) -> bool:
        node = cell[name]
        if node.is_leaf or name in state_next:
            return False
        return node.op == "matmul" or bool(_AUTO_NAME.search(name))

    def ref(name: str) -> str:
        node = cell[name]
        if node.op == "input":
            return f"{name}[t]"
        if node.op == "state":
            return f"{name}[t-1]"
        if node.op == "const":
            return f"{node.attr('value'):g}"
        if name in state_next:
            return f"{state_next[name]}[t]"
        return expr(name) if inlined(name) else name

    def wrap(arg: str, parent: str, right: bool = False) -> str:
        text = ref(arg)
        return f"({text})" if inlined(arg) and needs_parens(cell[arg].op, parent, right) else text

    def expr(name: str) -> str:
        node = cell[name]
        a = node.args
        if node.op == "matmul":
            return f"{a[0]} {wrap(a[1], 'matmul')}"
        if node.op == "add":
            return f"{wrap(a[0], 'add')} + {wrap(a[1], 'add')}"
        if node.op == "sub":
            return f"{wrap(a[0], 'sub')} - {wrap(a[1], 'sub', right=True)}"
        if node.op == "mul":
            return f"{wrap(a[0], 'mul')} * {wrap(a[1], 'mul')}"
        if node.op == "neg":
            return f"-{wrap(a[0], 'neg')}"
        if node.op == "one_minus":
            return f"1 - {wrap(a[0], 'one_minus')}"
        if node.op == "scale":
            return f"{node.attr('factor'):g} * {wrap(a[0], 'scale')}"
        if node.op in _FUNCTIONS:
            return f"{node.op}({ref(a[0])})"
        return f"{node.op}({', '.join(ref(x) for x in a)})"

    lines = []
    for name in cell.topo_order:
        node = cell[name]
        if node.is_leaf or (inlined(name) and name not in state_next):
            continue
        lhs = f"{state_next[name]}[t]" if name in state_next else name
        lines.append(f"{lhs} = {expr(name)}")
    for s in cell.states:     # a state whose next value is another state's, or a leaf
        if state_next.get(s.next) != s.name:
            lines.append(f"{s.name}[t] = {ref(s.next)}")
    return lines
