"""Composite blocks of the palette: the usual building blocks of a gated cell, one node each on the canvas.

    gate       act(W x + U h + b), act = sigmoid unless changed        (LSTM's i, f, o; GRU's r, z)
    candidate  the same with tanh                                       (LSTM's g, a GRU-Cho candidate)
    lerp       z * a + (1 - z) * b                                      (GRU's h_t = lerp(z, h, n))

In the cell JSON a composite is its primitive nodes (`expand`), named after the block: gate `f` gives the
weights `W_f` (H x the x-port's size) and `U_f` (H x H), the bias `b_f` and the values `f_wx`, `f_uh`, `f_sum`,
`f_pre` and `f`; lerp `h_next` gives `h_next_za`, `h_next_omz`, `h_next_omzb` and `h_next`. So every backend,
the equations and the kernels see only primitives. Drawing a design collapses exactly these patterns back into
one block (`collapse`), as long as nothing outside reads the inner values: a design built from composites comes
back as composites, and nodes written any other way (the gallery's presets) stay primitive.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.ops import activations

GATE, CANDIDATE, LERP = "gate", "candidate", "lerp"


@dataclass(frozen=True)
class Group:
    """A composite found in a design: its block type, its name (the value it computes), the values wired to
    its ports, its option values, and the names of the nodes it stands for."""

    type: str
    name: str
    args: dict[str, str]
    options: dict[str, object]
    members: frozenset[str]


def ports(block_type: str) -> tuple[str, ...]:
    return ("z", "a", "b") if block_type == LERP else ("x", "h")


def expand(block_type: str, name: str, args: dict[str, str], options: dict) -> list[dict]:
    """The primitive nodes of one composite block, in dependency order (the block's own value last). Its
    activation is one of engine.ops.activations()."""""
    if block_type == LERP:
        z, a, b = (args.get(p, "") for p in ports(LERP))
        return [{"name": f"{name}_za", "op": "mul", "args": [z, a]},
                {"name": f"{name}_omz", "op": "one_minus", "args": [z]},
                {"name": f"{name}_omzb", "op": "mul", "args": [f"{name}_omz", b]},
                {"name": name, "op": "add", "args": [f"{name}_za", f"{name}_omzb"]}]
    default = "tanh" if block_type == CANDIDATE else "sigmoid"
    activation = options.get("activation", default)
    activation = activation if activation in activations() else default
    x_size = options.get("x size", "I")
    x_size = x_size if x_size in ("I", "H") else "I"
    return [{"name": f"W_{name}", "op": "weight", "attrs": {"cols": x_size, "rows": "H"}},
            {"name": f"{name}_wx", "op": "matmul", "args": [f"W_{name}", args.get("x", "")]},
            {"name": f"U_{name}", "op": "weight", "attrs": {"cols": "H", "rows": "H"}},
            {"name": f"{name}_uh", "op": "matmul", "args": [f"U_{name}", args.get("h", "")]},
            {"name": f"{name}_sum", "op": "add", "args": [f"{name}_wx", f"{name}_uh"]},
            {"name": f"b_{name}", "op": "bias", "attrs": {"dim": "H"}},
            {"name": f"{name}_pre", "op": "add", "args": [f"{name}_sum", f"b_{name}"]},
            {"name": name, "op": activation, "args": [f"{name}_pre"]}]


def _args(node: dict) -> list:
    args = node.get("args")
    return args if isinstance(args, list) else []


def _match(nodes: dict[str, dict], head: dict) -> Group | None:
    """The composite whose value is `head`, if the nodes around it are exactly one expansion."""
    name, op = head["name"], head.get("op")

    def arg(node: str, i: int):
        args = _args(nodes.get(node) or {})
        return args[i] if i < len(args) else None

    if op == "add":
        block_type, options = LERP, {}
        ports_of = {"z": arg(f"{name}_za", 0), "a": arg(f"{name}_za", 1), "b": arg(f"{name}_omzb", 1)}
    elif op in activations():
        block_type = CANDIDATE if op == "tanh" else GATE
        attrs = (nodes.get(f"W_{name}") or {}).get("attrs")
        options = {"activation": op, "x size": attrs.get("cols") if isinstance(attrs, dict) else None}
        ports_of = {"x": arg(f"{name}_wx", 1), "h": arg(f"{name}_uh", 1)}
    else:
        return None
    if not all(isinstance(v, str) for v in ports_of.values()):
        return None
    expected = expand(block_type, name, ports_of, options)
    if any(nodes.get(e["name"]) != e for e in expected):
        return None
    return Group(block_type, name, ports_of, options, frozenset(e["name"] for e in expected))


def collapse(design: dict) -> list[Group]:
    """Every composite drawn as one block: exact expansions whose inner values (all but the block's own value)
    nothing else reads, neither another node nor a state. Never raises on a malformed design."""
    raw = design.get("nodes") if isinstance(design, dict) else None
    entries = [n for n in (raw if isinstance(raw, list) else [])
               if isinstance(n, dict) and isinstance(n.get("name"), str)]
    nodes: dict[str, dict] = {}
    for n in entries:
        nodes.setdefault(n["name"], n)
    readers: dict[str, set[str]] = {}
    for n in entries:
        for arg in _args(n):
            if isinstance(arg, str):
                readers.setdefault(arg, set()).add(n["name"])
    states = design.get("states") if isinstance(design, dict) and isinstance(design.get("states"), list) else []
    for s in states:
        if isinstance(s, dict) and isinstance(s.get("next"), str):
            readers.setdefault(s["next"], set()).add("(state)")
    groups, taken = [], set()
    for n in entries:
        group = _match(nodes, n)
        if group is None or group.members & taken:
            continue
        inner = group.members - {group.name}
        if all(readers.get(m, set()) <= group.members for m in inner):
            groups.append(group)
            taken |= group.members
    return groups
