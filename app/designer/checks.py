"""What is wrong with a design: the canvas's own problems plus the cell graph's, each said once."""
from __future__ import annotations

from dataclasses import dataclass, field

import engine
from engine.errors import Problem
from engine.ops import OPS

from .composites import collapse


@dataclass
class Check:
    cell: engine.CellGraph | None                           # None while the design is invalid
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        """The nodes named by a problem, in order, once each."""
        return list(dict.fromkeys(p.node for p in self.problems if p.node))


def _empty_ports(design: dict) -> list[tuple[str, str]]:
    """(node, port) of every argument left empty: the canvas writes an unconnected port so."""
    found = []
    nodes = design.get("nodes") if isinstance(design, dict) else None
    for entry in nodes if isinstance(nodes, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("args"), list):
            continue
        spec = OPS.get(entry.get("op"))
        for k, arg in enumerate(entry["args"]):
            if arg == "" and spec is not None and k < len(spec.ports):
                found.append((str(entry.get("name")), spec.ports[k]))
    return found


def unconnected_ports(design: dict, said: set[tuple[str, str]] | frozenset = frozenset()) -> list[Problem]:
    """Each unconnected port, in the canvas's words (also for a design restored from the autosave, where the
    canvas's own reading is gone). A port left empty inside a composite building block is said once, as the
    block's port, unless the canvas already said it of the inner node (`said`: its (node, field) pairs; the canvas
    then draws every primitive)."""
    inside = {member: group for group in collapse(design) for member in group.members}
    found, places = [], set()
    for node, port in _empty_ports(design):
        group = inside.get(node)
        if group is None or (node, f"args.{port}") in said:
            where = [(node, port)]
        else:
            where = [(group.name, p) for p, arg in group.args.items() if arg == ""]
        for place in where:
            if place not in places:
                places.add(place)
                found.append(Problem(f"port '{place[1]}' is not connected", node=place[0], field=f"args.{place[1]}",
                                     hint="drag a wire from a value's output to this port"))
    return found


def check_design(design: dict, canvas_problems: list[Problem] = ()) -> Check:
    """Validate `design` with the engine; canvas problems come first, engine problems at the same
    node and field (e.g. the empty argument of an unconnected port) are left out as repeats."""
    said = {(p.node, p.field) for p in canvas_problems}
    canvas_problems = list(canvas_problems) + [p for p in unconnected_ports(design, said)
                                               if (p.node, p.field) not in said]
    try:
        cell = engine.from_dict(design)
    except engine.CellGraphError as e:
        # the graph's "unknown node ''" at an empty argument repeats an unconnected port said above
        said = {(p.node, p.field) for p in canvas_problems} | {(n, f"args.{port}") for n, port in _empty_ports(design)}
        # An unwired next-state block is the graph's state without a next value: said once, in the canvas's words.
        said |= {(node, "states.next") for node, field in said if field == "args.next"}
        problems = list(canvas_problems) + [p for p in e.problems if (p.node, p.field) not in said]
        return Check(cell=None, problems=problems)
    if canvas_problems:
        # The canvas has a problem the graph does not show (e.g. two wires into one port: the first won).
        return Check(cell=None, problems=list(canvas_problems))
    return Check(cell=cell, warnings=[str(w) for w in cell.warnings])
