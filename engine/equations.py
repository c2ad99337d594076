"""A cell's equations, generated from the graph (so they always say what runs): one walk, two spellings.

Named values (gates, states' next values) get one equation each; matmuls and auto-named intermediates
(the names the DSL gives on its own: `<value>_pre`, `<value>_<op>`, with an optional `_<k>`) are inlined
into the expression that uses them, in parentheses where OpDef.precedence needs them. Each op is written
with its OpDef template: `latex` for engine/latex.py, `text` for the header comment of generated CUDA
(engine/codegen/equations.py). A `Spelling` says how names, time indices and parentheses look.

May import: engine.ir, engine.ops.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from .ir import CellGraph
from .ops import OPS, needs_parens


@lru_cache(maxsize=8)
def _auto_name_pattern(op_names: tuple[str, ...]) -> re.Pattern:
    return re.compile(rf"_({'|'.join(('pre', *op_names))})(_\d+)?$")


def is_auto_name(name: str) -> bool:
    """Whether `name` is one the DSL gives a value on its own: `_pre` (an activation's operand) or the name of
    an elementwise op of the table as its suffix, then an optional `_<k>`."""
    return bool(_auto_name_pattern(tuple(op.name for op in OPS.values() if op.kind == "elementwise")).search(name))


@dataclass(frozen=True)
class Spelling:
    template: str                          # the OpDef attribute with each op's form: "latex", "text_template"
    name: Callable[[str], str]             # a named value or a parameter
    input: Callable[[str], str]            # the input at step t
    before: Callable[[str], str]           # a state at t-1
    after: Callable[[str], str]            # a state at t (its next value)
    parens: str                            # around an inlined operand that binds less tightly, "{}" for it
    equals: str                            # between the left- and right-hand side of an equation
    # True: the first state naming a value owns its equation, and every other state gets a line of its own
    # ("c[t] = h[t]", also for a next value that is a leaf). False: the last state owns it, no other line.
    state_lines: bool


# The deepest nesting of inlined values in one equation: a longer run of auto-named values (10,000 adds in a row)
# gets an equation every this many levels, so each line stays readable and the text grows linearly.
MAX_INLINE_DEPTH = 24


def equations(graph: CellGraph, spelling: Spelling) -> list[str]:
    """One equation per named value of one step, in topological order, spelled by `spelling`."""
    state_next: dict[str, str] = {}
    for s in graph.states:
        if spelling.state_lines:
            state_next.setdefault(s.next, s.name)
        else:
            state_next[s.next] = s.name
    uses = Counter(a for n in graph.nodes for a in n.args)

    # Which values are inlined, decided in topological order (arguments first, no recursion): matmuls and
    # auto-named values read once, unless the nesting below them is already MAX_INLINE_DEPTH deep. A value read
    # twice gets its own equation: inlined, it would be written twice, and a chain of such values 2^n times.
    inlined: set[str] = set()
    depth: dict[str, int] = {}
    for name in graph.topo_order:
        node = graph[name]
        if node.is_leaf:
            continue
        depth[name] = 1 + max((depth[a] for a in node.args if a in inlined), default=0)
        if (name not in state_next and (node.op == "matmul" or is_auto_name(name))
                and uses[name] <= 1 and depth[name] <= MAX_INLINE_DEPTH):
            inlined.add(name)

    texts: dict[str, str] = {}      # each op value's right-hand side, made once, arguments before consumers

    def ref(name: str) -> str:
        node = graph[name]
        if node.op == "input":
            return spelling.input(name)
        if node.op == "state":
            return spelling.before(name)
        if node.op == "const":
            return f"{node.attr('value'):g}"
        if name in state_next:
            return spelling.after(state_next[name])
        return texts[name] if name in inlined else spelling.name(name)

    def wrap(arg: str, parent: str, right: bool) -> str:
        text = ref(arg)
        grouped = spelling.template == "latex" and OPS[parent].latex_groups       # \frac{a}{b}: no parentheses
        return spelling.parens.format(text) if (arg in inlined and not grouped
                                                and needs_parens(graph[arg].op, parent, right)) else text

    def expr(name: str) -> str:
        node = graph[name]
        spec = OPS[node.op]
        values = {port: wrap(arg, node.op, right=k > 0) for k, (port, arg) in enumerate(zip(spec.ports, node.args))}
        if node.op == "scale":
            values["factor"] = f"{node.attr('factor'):g}"
        return getattr(spec, spelling.template).format(**values)

    lines = []
    for name in graph.topo_order:
        if graph[name].is_leaf:
            continue
        texts[name] = expr(name)
        if name in inlined:
            continue
        if uses[name] == 0 and name not in state_next and (graph[name].op == "matmul" or is_auto_name(name)):
            continue                # a dead auto-named value: no equation, as before
        lhs = spelling.after(state_next[name]) if name in state_next else spelling.name(name)
        lines.append(f"{lhs}{spelling.equals}{texts[name]}")
    if spelling.state_lines:
        for s in graph.states:     # a state whose next value is another state's, or a leaf
            if state_next.get(s.next) != s.name:
                lines.append(f"{spelling.after(s.name)}{spelling.equals}{ref(s.next)}")
    return lines
