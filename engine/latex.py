"""LaTeX equations of a cell, generated from the graph (so they always match what runs).

The walk is engine/equations.py's (named values get one equation each, auto-named intermediates are
inlined); this module gives it the LaTeX spelling: symbols with subscripts, each op's OpDef.latex.
"""
from __future__ import annotations

from .equations import Spelling
from .equations import equations as render_equations
from .errors import CellGraphError
from .ir import CellGraph


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


LATEX = Spelling(
    template="latex",
    name=symbol,
    input=lambda name: symbol(name) if name.endswith("_t") else symbol(name, "t"),
    before=lambda name: symbol(name, "t-1"),
    after=lambda name: symbol(name, "t"),
    parens=r"\left({}\right)",
    equals=" &= ",
    state_lines=False,
)


def equations(graph: CellGraph) -> list[str]:
    """One LaTeX equation per named value (engine/equations.py), each `lhs &= rhs`."""
    return render_equations(graph, LATEX)


def to_latex(graph: CellGraph) -> str:
    """One aligned block, ready for st.latex or a paper."""
    if not isinstance(graph, CellGraph):
        raise CellGraphError(f"argument 'graph' must be a CellGraph, got {type(graph).__name__}", field="(argument)",
                             hint="e.g. engine.to_latex(engine.preset('lstm').cell)")
    return "\\begin{aligned}\n" + " \\\\\n".join(equations(graph)) + "\n\\end{aligned}"
