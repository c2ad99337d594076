"""Pass group_gemms: decide which matmuls run together as one GEMM, and in which stage of the step.

A matmul's stage is 0 ("hoisted") when it reads the layer input and the hoisting pass took it out
of the loop, else one more than the stage of its operand (see analysis.graph_stages). Then:

1. Terms. Within one sum, the matmuls of the same stage add into one output block, a *term*:
   LSTM's W_hi h (stage 1) is a term of i_pre; FGR's R_i h + R_ii i + R_fi f + R_oi o is one term
   over four operands. A matmul outside any sum is a term by itself.
2. GEMMs. Within a stage, terms that share an operand are joined (union-find) into one GEMM whose
   operands are the union (K = the sum of their sizes) and whose output blocks are the terms; a
   term that does not read an operand gets zeros there. LSTM: the four gates' W_h* h are one GEMM.

Matmuls of different stages never merge (GRU-Cho's U_n (r*h) waits for r), and matmuls of one
stage that share nothing stay apart: nothing is merged wrongly or split needlessly.
"""
from __future__ import annotations

import dataclasses

from ..c_names import c_identifier
from ..plan import Gemm, Operand, Term
from .analysis import graph_stages
from .lowering import Lowering

_MAX_NAME = 24


def group_gemms(low: Lowering) -> tuple[Lowering, str]:
    """Matmuls that read the same value or add into the same value become one larger GEMM per stage."""
    terms = _terms(low, grouped=True)
    gemms, notes = _gemms(low, terms, grouped=True)
    return dataclasses.replace(low, terms=terms, gemms=gemms), _summary(gemms, notes)


def one_gemm_per_matmul(low: Lowering) -> tuple[Lowering, str]:
    terms = _terms(low, grouped=False)
    gemms, notes = _gemms(low, terms, grouped=False)
    return dataclasses.replace(low, terms=terms, gemms=gemms), _summary(gemms, notes)


def _stage_key(stage):
    return (0, 0) if stage == "hoisted" else (1, stage)


def _terms(low: Lowering, grouped: bool) -> tuple[Term, ...]:
    cell = low.cell
    stage = graph_stages(cell, low.hoisted)
    order = {name: i for i, name in enumerate(cell.topo_order)}
    taken = {n.name for n in cell.nodes}

    def key(m: str):
        return "hoisted" if m in low.hoisted else stage[m]

    def fixed(m: str) -> bool:           # a reduction's matmul (engine/dense.py): GEMMs of its own
        return cell[cell[m].args[0]].attr("fixed") is not None

    def fresh(base: str) -> str:
        name = base
        while name in taken:
            name += "_t"
        taken.add(name)
        return name

    terms: list[Term] = []
    in_sum: set[str] = set()
    for s in low.sums:
        groups: dict = {}
        for m in s.matmuls:
            groups.setdefault((key(m), fixed(m)), []).append(m)
            in_sum.add(m)
        for k, reduction in sorted(groups, key=lambda g: (_stage_key(g[0]), g[1])):
            matmuls = groups[k, reduction]
            dim = cell.dims[s.root]
            if grouped:
                operands = list(dict.fromkeys(cell[m].args[1] for m in matmuls))
                base = f"{s.root}_{operands[0]}" if len(operands) == 1 else f"{s.root}_s{k}"
                terms.append(Term(fresh(base), s.root, tuple(matmuls), dim, k))
            else:
                for m in dict.fromkeys(matmuls):
                    terms.append(Term(m, s.root, (m,) * matmuls.count(m), dim, k))
    for name in cell.topo_order:
        node = cell[name]
        if node.op == "matmul" and name not in in_sum:
            terms.append(Term(name, name, (name,), cell.dims[name], key(name)))
    terms.sort(key=lambda t: (order[t.output], _stage_key(t.stage)))
    return tuple(terms)


def _gemms(low: Lowering, terms: tuple[Term, ...], grouped: bool) -> tuple[tuple[Gemm, ...], list[str]]:
    cell = low.cell
    definition = {n.name: i for i, n in enumerate(cell.nodes)}
    notes: list[str] = []
    by_stage: dict = {}
    for t in terms:
        by_stage.setdefault(t.stage, []).append(t)
    gemms: list[Gemm] = []
    names: set[str] = set()
    for stage in sorted(by_stage, key=_stage_key):
        stage_terms = by_stage[stage]
        components = _components(cell, stage_terms) if grouped else [[t] for t in stage_terms]
        for component in components:
            operands = sorted({cell[m].args[1] for t in component for m in t.matmuls}, key=definition.get)
            layout = low.layout
            if layout == "interleaved" and len({t.dim for t in component}) > 1:
                layout = "blocked"
                notes.append(f"blocked layout for the GEMM over {', '.join(operands)}: its blocks differ in size")
            name = _gemm_name(component, operands, stage, grouped, names)
            gemms.append(Gemm(name, stage, tuple(Operand(o, cell.dims[o]) for o in operands), tuple(component),
                              layout))
    return tuple(gemms), notes


def _components(cell, terms: list[Term]) -> list[list[Term]]:
    """Union-find over terms: two terms are joined when their matmuls share an operand."""
    parent = list(range(len(terms)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict = {}
    for i, t in enumerate(terms):
        for m in t.matmuls:
            weight, value = cell[m].args
            operand = (value, cell[weight].attr("fixed") is not None)   # reductions' matmuls group among themselves
            if operand in owner:
                parent[find(i)] = find(owner[operand])
            else:
                owner[operand] = i
    groups: dict[int, list[Term]] = {}
    for i, t in enumerate(terms):
        groups.setdefault(find(i), []).append(t)
    return sorted(groups.values(), key=lambda g: terms.index(g[0]))


def _gemm_name(component: list[Term], operands: list[str], stage, grouped: bool, names: set[str]) -> str:
    if not grouped:
        base = f"{component[0].name}_gemm"
    else:
        joined = "_".join(operands)
        if len(joined) > _MAX_NAME:
            joined = "input" if stage == "hoisted" else f"stage{stage}"
        base = joined + ("_proj" if stage == "hoisted" else "_gemm")
    base = c_identifier(base)                  # GEMM names become C names (K_<gemm>, <gemm>_in, ...)
    name, k = base, 2
    while name in names or c_identifier(name) != name:
        name = f"{base}{k}"
        k += 1
    names.add(name)
    return name


def _summary(gemms: tuple[Gemm, ...], notes: list[str]) -> str:
    if not gemms:
        return "no matmuls"
    parts = []
    for g in gemms:
        where = "hoisted" if g.hoisted else f"stage {g.stage}"
        matmuls = sum(len(t.matmuls) for t in g.terms)
        parts.append(f"{g.name} ({where}): {matmuls} matmul(s) in {len(g.terms)} block(s) over "
                     f"[{', '.join(o.name for o in g.operands)}]")
    return "; ".join(parts + notes)
