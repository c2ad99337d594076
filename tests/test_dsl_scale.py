"""Large and deep cells through the DSL, validation, emitting and explain: linear time, no recursion limit.

The shapes: a value read twice at each of n levels (a = a + a; a memo-less walk costs 2^n), 10,000 nodes side by
side, and chains of 1,200 and 10,000 adds in a row (a recursive walk meets Python's recursion limit). Each step
runs under contract.call's deadline; the bounds are generous (CI has 2 shared cores): these tests assert that each
step completes, not how fast.
"""
from __future__ import annotations

import sys

import pytest
from contract import call

import engine
from engine.dsl import W, b, cell, tanh
from engine.dsl_emit import emit_dsl
from engine.ir import CellGraph
from engine.serialize import from_dict, to_dict


def doubling(levels: int):
    def doubled(x, h):
        a = W("W_x") @ x + h
        for _ in range(levels):
            a = a + a
        return {"h": tanh(W("W_a") @ a)}
    return doubled


def wide(branches: int):
    def side_by_side(x, h):
        terms = [tanh(W(f"W_{i}") @ x + b(f"b_{i}")) for i in range(branches)]
        while len(terms) > 1:
            terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
        return {"h": terms[0] * h}
    return side_by_side


def chain(length: int):
    def in_a_row(x, h):
        a = W("W_x") @ x
        for _ in range(length):
            a = a + h
        return {"h": tanh(a)}
    return in_a_row


def rebuilt(source: str) -> CellGraph:
    namespace: dict = {}
    exec(compile(source, "<emitted>", "exec"), namespace)  # noqa: S102 - the emitter's own output
    return next(v for v in namespace.values() if isinstance(v, CellGraph))


@pytest.fixture(autouse=True)
def default_recursion_limit():
    """The walks must not depend on a raised recursion limit."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    yield
    sys.setrecursionlimit(limit)


@pytest.mark.parametrize("levels", [24, 40])
def test_a_value_read_twice_at_every_level_builds_emits_and_explains(levels):
    graph = call(cell, doubling(levels), deadline_s=10).result
    assert len(graph.nodes) == levels + 8
    assert call(graph.replace, deadline_s=10).ok
    assert rebuilt(call(emit_dsl, graph, deadline_s=10).result).structure() == graph.structure()
    assert call(engine.explain, graph, deadline_s=20).ok


@pytest.mark.parametrize("shape, size, explained", [
    (wide, 2000, False),          # 12,002 nodes side by side
    (chain, 1200, True),
    (chain, 10_000, True),
], ids=["wide-12k", "chain-1200", "chain-10k"])
def test_large_cells_build_validate_and_emit(shape, size, explained):
    graph = call(cell, shape(size), deadline_s=20).result
    assert len(graph.nodes) > size
    assert call(lambda: from_dict(to_dict(graph)), deadline_s=20).result.structure() == graph.structure()
    assert rebuilt(call(emit_dsl, graph, deadline_s=20).result).structure() == graph.structure()
    if explained:
        assert "graph" in call(engine.explain, graph, deadline_s=40).result


def test_a_wide_cell_explains():
    graph = cell(wide(500))       # 3,002 nodes: 500 terms in one GEMM group
    assert "GEMM" in call(engine.explain, graph, deadline_s=40).result
