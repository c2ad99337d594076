"""The cell's equations as plain text, for the header comment of generated CUDA.

Generated from the graph, so the comment always says what the code computes:

    i = sigmoid(W_ii x[t] + b_ii + W_hi h[t-1] + b_hi)
    c[t] = f * c[t-1] + i * g

Values the user named get a line each; matmuls and auto-named intermediates (the DSL's "_pre",
"_mul", ... suffixes) are written inline where they are used. The walk is engine/equations.py's;
this module gives it the plain-text spelling: x[t], h[t-1], each op's OpDef text template.
"""
from __future__ import annotations

from ..equations import Spelling, equations
from ..ir import CellGraph

TEXT = Spelling(
    template="text_template",
    name=lambda name: name,
    input=lambda name: f"{name}[t]",
    before=lambda name: f"{name}[t-1]",
    after=lambda name: f"{name}[t]",
    parens="({})",
    equals=" = ",
    state_lines=True,
)


def text_equations(cell: CellGraph) -> list[str]:
    """One plain-text equation per named value (engine/equations.py), each `lhs = rhs`."""
    return equations(cell, TEXT)
