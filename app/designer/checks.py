"""What is wrong with a design: the canvas's own problems plus the cell graph's, each said once."""
from __future__ import annotations

from dataclasses import dataclass, field

import engine
from engine.errors import Problem
from engine.ops import OPS


@dataclass
class Check:
    cell: engine.CellGraph | None                           # None while the design is invalid
    problems: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> list[str]:
        """The nodes named by a problem, in order, once each."""
        return list(dict.fromkeys(p.node for p in self.problems if p.node))


def unconnected_ports(design: dict) -> list[Problem]:
    """The canvas writes an unconnected port as an empty argument: say so in the canvas's words
    (also for a design restored from the autosave, where the canvas's own reading is gone)."""
    found = []
    nodes = design.get("nodes") if isinstance(design, dict) else None
    for entry in nodes if isinstance(nodes, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("args"), list):
            continue
        spec = OPS.get(entry.get("op"))
        for k, arg in enumerate(entry["args"]):
            if arg == "" and spec is not None and k < len(spec.ports):
                port = spec.ports[k]
                found.append(Problem(f"port '{port}' is not connected", node=str(entry.get("name")),
                                     field=f"args.{port}", hint="drag a wire from a value's output to this port"))
    return found


def check_design(design: dict, canvas_problems: list[Problem] = ()) -> Check:
    """Validate `design` with the engine; canvas problems come first, engine problems at the same
    node and field (e.g. the empty argument of an unconnected port) are left out as repeats."""
    said = {(p.node, p.field) for p in canvas_problems}
    canvas_problems = list(canvas_problems) + [p for p in unconnected_ports(design) if (p.node, p.field) not in said]
    try:
        cell = engine.from_dict(design)
    except engine.CellGraphError as e:
        said = {(p.node, p.field) for p in canvas_problems}
        # An unwired next-state block is the graph's state without a next value: said once, in the canvas's words.
        said |= {(node, "states.next") for node, field in said if field == "args.next"}
        problems = list(canvas_problems) + [p for p in e.problems if (p.node, p.field) not in said]
        return Check(cell=None, problems=problems)
    if canvas_problems:
        # The canvas has a problem the graph does not show (e.g. two wires into one port: the first won).
        return Check(cell=None, problems=list(canvas_problems))
    return Check(cell=cell, warnings=[str(w) for w in cell.warnings])
