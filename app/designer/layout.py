"""Automatic layout of a cell for the canvas: data flows left to right, one band of rows per gate.

Columns: the input and the states in column 0; a named value (a gate such as `i`, a next state such
as `c_next`) one column right of its latest argument, so gates computed alike line up; the values
the DSL names on its own (`i_pre`, `W_ii_x`, ...) and the parameters as late as possible, just
before the value they feed. The next-state sinks take a last column on the right.

Rows: every node joins the band of the named value it feeds; bands come in the order the values
were defined (the order the researcher wrote the gates in). Inside a band a node takes its
consumer's row when that cell is free, so a chain of adds reads along one row and the terms it adds
sit below. The input and each state sit at the middle row of the nodes that read them.

Works on any design dict, also an invalid one being edited (unknown names, loops, duplicates):
positions are keyed by the index of the node in design["nodes"] and of the state in design["states"].
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import networkx as nx

from engine.ops import OPS

_SOURCES = ("input", "state")
_PARAMETERS = ("weight", "bias", "vector", "const")
# Names the DSL gives values the researcher did not name (see engine.dsl._choose_names).
_AUTOMATIC = re.compile(r"_(pre|" + "|".join(sorted(OPS, key=len, reverse=True)) + r")(_\d+)?$")
SOURCES_BAND = "(sources)"         # not a valid node name, so no band of a node can be called this


@dataclass(frozen=True)
class Layout:
    nodes: dict[int, tuple[int, int]]      # index in design["nodes"] -> (column, row)
    sinks: dict[int, tuple[int, int]]      # index in design["states"] -> (column, row)
    bands: dict[int, str]                  # index in design["nodes"] -> name of its band


@dataclass(frozen=True)
class _Entry:
    name: str
    op: str
    args: tuple[str, ...]


def _entries(design: dict) -> list[_Entry]:
    """Each node's name, op and args; a malformed entry keeps its index, with empty fields."""
    raw = design.get("nodes") if isinstance(design, dict) else None
    out = []
    for entry in raw if isinstance(raw, list) else []:
        entry = entry if isinstance(entry, dict) else {}
        name, op, args = entry.get("name"), entry.get("op"), entry.get("args", [])
        args = tuple(a for a in args if isinstance(a, str)) if isinstance(args, list) else ()
        out.append(_Entry(name if isinstance(name, str) else "", op if isinstance(op, str) else "", args))
    return out


def _state_nexts(design: dict) -> list[str]:
    raw = design.get("states") if isinstance(design, dict) else None
    return [e.get("next") if isinstance(e, dict) and isinstance(e.get("next"), str) else ""
            for e in (raw if isinstance(raw, list) else [])]


def is_automatic_name(name: str, op: str) -> bool:
    """True for names the DSL makes up (every matmul, `i_pre`, `h_next_mul_1`)."""
    return op == "matmul" or bool(_AUTOMATIC.search(name))


def _is_named(entry: _Entry, nexts: set[str]) -> bool:
    """A value the researcher named: it gets its own band and is placed as early as possible."""
    if entry.op in _SOURCES or entry.op in _PARAMETERS:
        return False
    return entry.name in nexts or not is_automatic_name(entry.name, entry.op)


def dependency_graph(entries: list[_Entry]) -> nx.DiGraph:
    """Edges argument -> consumer between node indices (where a name is used twice, the first wins)."""
    first: dict[str, int] = {}
    for i, e in enumerate(entries):
        first.setdefault(e.name, i)
    g = nx.DiGraph()
    g.add_nodes_from(range(len(entries)))
    for i, e in enumerate(entries):
        for a in e.args:
            if a in first and first[a] != i:
                g.add_edge(first[a], i)
    return g


def _columns(entries: list[_Entry], g: nx.DiGraph, nexts: set[str]) -> dict[int, int]:
    # A loop (an invalid design) collapses into one strongly connected component: one column for all.
    dag = nx.condensation(g)
    component_of = dag.graph["mapping"]
    members: dict[int, list[int]] = {}
    for i, c in component_of.items():
        members.setdefault(c, []).append(i)
    order = list(nx.topological_sort(dag))
    earliest: dict[int, int] = {}
    for c in order:
        earliest[c] = 1 + max((earliest[p] for p in dag.predecessors(c)), default=0)
    columns = {i: 0 if entries[i].op in _SOURCES else earliest[component_of[i]] for i in g.nodes}
    for c in reversed(order):                      # right to left: pull unnamed values up to their use
        movable = [i for i in members[c] if entries[i].op not in _SOURCES and not _is_named(entries[i], nexts)]
        used_at = [columns[j] for i in movable for j in g.successors(i) if component_of[j] != c]
        if movable and used_at:
            for i in movable:
                columns[i] = max(columns[i], min(used_at) - 1)
    return columns


def _bands(entries: list[_Entry], g: nx.DiGraph, nexts: set[str]) -> dict[int, str]:
    dag = nx.condensation(g)
    members: dict[int, list[int]] = {}
    for i, c in dag.graph["mapping"].items():
        members.setdefault(c, []).append(i)
    band: dict[int, str] = {}
    for c in reversed(list(nx.topological_sort(dag))):        # consumers before their arguments
        for i in sorted(members[c]):
            e = entries[i]
            if e.op in _SOURCES:
                band[i] = SOURCES_BAND
            elif _is_named(e, nexts):
                band[i] = e.name or f"#{i}"
            else:
                consumers = sorted(j for j in g.successors(i) if j in band)
                band[i] = band[consumers[0]] if consumers else (e.name or f"#{i}")
    return band


def _pack(members: set[int], entries: list[_Entry], g: nx.DiGraph, columns: dict[int, int],
          top: int) -> dict[int, int]:
    """Rows of one band, from its named value back through the arguments (in port order): each node
    in its consumer's row when that cell is free, else the next free row below. A parameter may also
    take the column left of its own, where its wire stays short. Updates `columns` for those."""
    first: dict[str, int] = {}
    for i, e in enumerate(entries):
        first.setdefault(e.name, i)
    rows: dict[int, int] = {}
    taken: set[tuple[int, int]] = set()
    roots = sorted((i for i in members if not any(j in members for j in g.successors(i))),
                   key=lambda i: (columns[i], i))
    for start in roots + sorted(members):
        stack = [(start, top)]                     # depth first, without recursion (cells can be long)
        while stack:
            i, wanted = stack.pop()
            if i in rows:
                continue
            choices = [columns[i]] + ([columns[i] - 1] if entries[i].op in _PARAMETERS and columns[i] > 1 else [])
            row = wanted
            while all((c, row) in taken for c in choices):
                row += 1
            columns[i] = next(c for c in choices if (c, row) not in taken)
            rows[i] = row
            taken.add((columns[i], row))
            arguments = [first[a] for a in entries[i].args if first.get(a) in members]
            stack += [(j, row) for j in reversed(arguments) if j not in rows]
    return rows


def layout(design: dict) -> Layout:
    """Grid positions (column, row) for every node and next-state sink of `design`."""
    entries = _entries(design)
    state_nexts = _state_nexts(design)
    nexts = set(state_nexts)
    g = dependency_graph(entries)
    columns = _columns(entries, g, nexts)
    bands = _bands(entries, g, nexts)

    band_order = list(dict.fromkeys(bands[i] for i in sorted(range(len(entries)),
                                                             key=lambda i: (bands[i] != entries[i].name, i))))
    rows: dict[int, int] = {}
    top = 0
    for band in band_order:
        if band == SOURCES_BAND:
            continue
        members = {i for i in range(len(entries)) if bands[i] == band}
        rows.update(_pack(members, entries, g, columns, top))
        top = 1 + max(rows[i] for i in members)

    taken: set[int] = set()
    for i in (i for i in range(len(entries)) if bands[i] == SOURCES_BAND):
        readers = sorted(rows[j] for j in g.successors(i) if j in rows)
        row = readers[len(readers) // 2] if readers else 0
        while row in taken:
            row += 1
        taken.add(row)
        rows[i] = row

    first: dict[str, int] = {}
    for i, e in enumerate(entries):
        first.setdefault(e.name, i)
    last = 1 + max(columns.values(), default=0)
    sinks: dict[int, tuple[int, int]] = {}
    taken = set()
    for k, nxt in enumerate(state_nexts):
        row = rows[first[nxt]] if nxt in first else top + k
        while row in taken:
            row += 1
        taken.add(row)
        sinks[k] = (last, row)
    return Layout(nodes={i: (columns[i], rows[i]) for i in range(len(entries))}, sinks=sinks, bands=bands)
