"""The state that flows through the passes (engine.passes.pass_list): the cell graph plus what each pass decided.

Every field is frozen; a pass returns a new Lowering (dataclasses.replace) and never edits its input.
`describe` prints the state after any pass, which is what explain() shows as "the graph after each pass".
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..ir import CellGraph
from ..plan import Gemm, Term


@dataclass(frozen=True)
class Sum:
    """A flattened add-tree: root = summand_1 + summand_2 + ... (repeats kept).

    `matmuls` are the summands that are matmuls used nowhere else: a GEMM can absorb them.
    `absorbed` are the add nodes the sum replaces, the root first."""

    root: str
    summands: tuple[str, ...]
    matmuls: tuple[str, ...]
    absorbed: tuple[str, ...]


@dataclass(frozen=True)
class Region:
    """One generated kernel: values it computes (in order) and values it only copies to memory."""

    name: str
    stage: int
    dim: str
    values: tuple[str, ...]
    passthrough: tuple[str, ...] = ()


@dataclass(frozen=True)
class Lowering:
    cell: CellGraph
    source_cell: CellGraph
    layout: str = "blocked"
    precision: str = "float32"
    sums: tuple[Sum, ...] = ()
    hoisted: frozenset = frozenset()
    terms: tuple[Term, ...] = ()
    gemms: tuple[Gemm, ...] = ()
    regions: tuple[Region, ...] = ()
    schedule: str = ""                         # set by the wavefront pass (or its "off" fallback)

    def sum_of(self, root: str) -> Sum | None:
        return self._sums_by_root.get(root)

    @cached_property
    def _sums_by_root(self) -> dict[str, Sum]:
        by_root: dict[str, Sum] = {}
        for s in self.sums:
            by_root.setdefault(s.root, s)
        return by_root


def describe(low: Lowering) -> str:
    """The lowering as text: the graph, then whatever the passes so far have decided."""
    cell = low.cell
    lines = [f"graph '{cell.name}' ({len(cell.nodes)} nodes):"]
    absorbed = {a for s in low.sums for a in s.absorbed}
    roots = {s.root: s for s in low.sums}
    for name in cell.topo_order:
        node = cell[name]
        if node.is_leaf:
            continue
        if name in roots:
            hoisted = [m for m in roots[name].matmuls if m in low.hoisted]
            lines.append(f"  {name} = sum({', '.join(roots[name].summands)})"
                         + (f"  [hoisted: {', '.join(hoisted)}]" if hoisted else ""))
            continue
        if name in absorbed:
            continue
        args = ", ".join(node.args)
        attrs = "".join(f", {k}={v!r}" for k, v in node.attrs)
        marks = " [hoisted]" if name in low.hoisted else ""
        lines.append(f"  {name} = {node.op}({args}{attrs}){marks}")
    leaves = [n for n in cell.nodes if n.is_leaf]
    lines.append("  leaves: " + ", ".join(f"{n.name}:{n.op}" + (f"={n.attr('value')!r}" if n.op == "const" else "")
                                          for n in leaves))
    if low.gemms:
        lines.append("GEMMs:")
        for g in low.gemms:
            stage = "hoisted" if g.hoisted else f"stage {g.stage}"
            lines.append(f"  {g.name} [{stage}] Y = [{', '.join(o.name for o in g.operands)}] @ P^T, K = {g.k}, "
                         f"N = {g.n}")
            for t in g.terms:
                extra = (" + " + " + ".join(t.biases)) if t.biases else ""
                lines.append(f"    {t.name} ({t.dim}) -> {t.output}: " + " + ".join(t.matmuls) + extra)
    if low.regions:
        lines.append("kernels:")
        for r in low.regions:
            body = ", ".join(r.values) if r.values else "-"
            copies = f"; copies {', '.join(r.passthrough)}" if r.passthrough else ""
            lines.append(f"  {r.name} [stage {r.stage}, (B, {r.dim})]: {body}{copies}")
    lines.append(f"schedule: {low.schedule or 'not chosen yet'}")
    return "\n".join(lines)
