"""Pass fold_biases: constant summands of a sum that has a hoisted term are added inside the hoisted GEMM."""
from __future__ import annotations

import dataclasses

from ..plan import Gemm
from .lowering import Lowering

FOLDABLE = ("bias", "vector", "const")


def fold_biases(low: Lowering) -> tuple[Lowering, str]:
    """Biases summed with a hoisted projection are added once per sequence there, not every step in a kernel."""
    cell = low.cell
    terms = list(low.terms)
    folded: list[str] = []
    hoisted_into: dict[str, int] = {}         # a sum's root -> the index of the first hoisted term writing it
    for i, t in enumerate(terms):
        if t.stage == "hoisted":
            hoisted_into.setdefault(t.output, i)
    for s in low.sums:
        target = hoisted_into.get(s.root)
        if target is None:
            continue
        biases = tuple(a for a in s.summands if cell[a].op in FOLDABLE)
        if biases:
            terms[target] = dataclasses.replace(terms[target], biases=terms[target].biases + biases)
            folded.append(f"{' + '.join(biases)} into {terms[target].name}")
    if not folded:
        return low, "no bias is summed with a hoisted projection"
    by_name = {t.name: t for t in terms}
    gemms = tuple(_with_terms(g, by_name) for g in low.gemms)
    return dataclasses.replace(low, terms=tuple(terms), gemms=gemms), "; ".join(folded)


def _with_terms(gemm: Gemm, by_name: dict) -> Gemm:
    return dataclasses.replace(gemm, terms=tuple(by_name[t.name] for t in gemm.terms))
