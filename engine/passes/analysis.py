"""Read-only analyses the passes share: stages of matmuls, and the step graph after grouping.

The *step graph* is the cell graph as the kernels see it: matmuls that a GEMM absorbed are gone,
each GEMM output block is a value of kind "term", and each flattened add-tree is one "sum" value
over its terms and remaining summands. Its values are what kernels load, compute and store.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..ir import SCALAR, CellGraph
from .lowering import Lowering


def graph_stages(cell: CellGraph, hoisted: frozenset) -> dict[str, int]:
    """Stage of every graph value: when, within a step, it can first be known.

    Leaves and hoisted matmuls are known at the start of the step (0). A matmul is computed by the
    GEMM of stage (stage of its operand) + 1; an elementwise value is known in the stage of its
    latest argument. So GRU-Cho's U_n (r * h) is stage 2: r needs the stage-1 GEMM first."""
    stage: dict[str, int] = {}
    for name in cell.topo_order:
        node = cell[name]
        if node.is_leaf:
            stage[name] = 0
        elif node.op == "matmul":
            stage[name] = 0 if name in hoisted else stage[node.args[1]] + 1
        else:
            stage[name] = max(stage[a] for a in node.args)
    return _defer_state_free(cell, hoisted, stage)


def _defer_state_free(cell: CellGraph, hoisted: frozenset, stage: dict[str, int]) -> dict[str, int]:
    """A matmul of a value that needs no state (the reductions of a LayerNorm of W x) runs in the latest stage that
    still serves its first reader, not the earliest: it delays nothing, and its operands' kernel then joins that
    stage's instead of making a stage of its own before the first GEMM (ln_lstm's LayerNorm of W x). Stages
    of values that need a state stay the earliest (the step's critical path)."""
    names = cell.topo_order
    free: set[str] = set()
    for name in names:
        node = cell[name]
        if (node.op != "state" and node.is_leaf) or name in hoisted or (
                not node.is_leaf and all(a in free for a in node.args)):
            free.add(name)
    users: dict[str, list[str]] = {name: [] for name in names}
    for name in names:
        for a in cell[name].args:
            users[a].append(name)
    last = max(stage.values(), default=0)
    nexts = {s.next for s in cell.states} | {cell.output}
    latest: dict[str, int] = {}
    for name in reversed(names):
        need = [latest[u] - 1 if cell[u].op == "matmul" and u not in hoisted else latest[u] for u in users[name]]
        bound = min(need + ([last] if name in nexts else []), default=stage[name])
        latest[name] = max(stage[name], bound) if name in free and not cell[name].is_leaf else stage[name]
    return {name: latest[name] if cell[name].op == "matmul" and name not in hoisted else stage[name]
            for name in names}


@dataclass(frozen=True)
class Value:
    name: str
    kind: str                          # "leaf", "term", "op" or "sum"
    op: str                            # leaf kind, op name, "term" or "sum"
    args: tuple[str, ...] = ()
    attrs: tuple[tuple[str, Any], ...] = ()
    dim: str = "H"                     # "I", "H" or "1" (a scalar, uniform across threads)
    covers: tuple[str, ...] = ()       # graph nodes this value stands for

    @property
    def computed(self) -> bool:
        return self.kind in ("op", "sum")

    @property
    def uniform(self) -> bool:
        return self.dim == SCALAR


def remaining_summands(low: Lowering, root: str, terms: list | None = None) -> list[str]:
    """Summands of a sum that no GEMM term took (neither as matmul nor as folded bias). terms: the GEMM terms
    whose output is `root`, where the caller has them (else found in low.terms)."""
    s = low.sum_of(root)
    left = Counter(s.summands)
    for term in (terms if terms is not None else [t for t in low.terms if t.output == root]):
        left.subtract(term.matmuls)
        left.subtract(term.biases)
    out = []
    for name in s.summands:            # keep the summands' order
        if left[name] > 0:
            out.append(name)
            left[name] -= 1
    return out


def step_graph(low: Lowering) -> dict[str, Value]:
    """Values in evaluation order: leaves, GEMM terms, then ops and sums topologically."""
    cell = low.cell
    dims = cell.dims
    values: dict[str, Value] = {}
    for node in cell.nodes:
        if node.is_leaf:
            values[node.name] = Value(node.name, "leaf", node.op, (), node.attrs, dims[node.name], (node.name,))
    term_of_matmul = {}
    terms_into: dict[str, list] = {}        # a sum's root -> the GEMM terms that write into it, in order
    for term in low.terms:
        terms_into.setdefault(term.output, []).append(term)
        values[term.name] = Value(term.name, "term", "term", (), (), term.dim, term.matmuls)
        for m in term.matmuls:
            term_of_matmul[m] = term
    roots = {s.root: s for s in low.sums}
    inside = {a for s in low.sums for a in s.absorbed if a != s.root}
    absorbed_matmuls = {m for s in low.sums for m in s.matmuls}
    for name in cell.topo_order:
        node = cell[name]
        if node.is_leaf or name in inside:
            continue
        if node.op == "matmul":
            if name in absorbed_matmuls:
                continue
            term = term_of_matmul[name]
            if term.name != name:       # a standalone matmul's term carries the matmul's name
                raise AssertionError(f"standalone matmul '{name}' has term '{term.name}'")
            continue
        if name in roots:
            terms = terms_into.get(name, [])
            args = [t.name for t in terms] + remaining_summands(low, name, terms)
            values[name] = Value(name, "sum", "sum", tuple(args), (), dims[name], roots[name].absorbed)
        else:
            values[name] = Value(name, "op", node.op, node.args, node.attrs, dims[name], (name,))
    return values


def value_stages(low: Lowering, values: dict[str, Value]) -> dict[str, int]:
    """Earliest stage of every step-graph value (terms: their GEMM's stage, hoisted = 0)."""
    terms = {t.name: t for t in low.terms}
    stage: dict[str, int] = {}
    for v in values.values():
        if v.kind == "leaf":
            stage[v.name] = 0
        elif v.kind == "term":
            t = terms[v.name]
            stage[v.name] = 0 if t.stage == "hoisted" else t.stage
        else:
            stage[v.name] = max((stage[a] for a in v.args), default=0)
    return stage


def consumers(values: dict[str, Value]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {name: [] for name in values}
    for v in values.values():
        for a in dict.fromkeys(v.args):
            out[a].append(v.name)
    return out


def num_stages(low: Lowering) -> int:
    return max((t.stage for t in low.terms if t.stage != "hoisted"), default=0)


def state_next_values(low: Lowering) -> dict[str, list[str]]:
    """value -> the states whose next value it is."""
    out: dict[str, list[str]] = {}
    for s in low.cell.states:
        out.setdefault(s.next, []).append(s.name)
    return out
