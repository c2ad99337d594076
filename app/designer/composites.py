"""Composite blocks of the palette: the usual building blocks of a cell, one node each on the canvas.

    gate        act(W x + U h + b), act = sigmoid unless changed         (LSTM's i, f, o; GRU's r, z; identity:
                                                                         sLSTM's pre-activations, U of k heads)
    candidate   the same with tanh                                        (LSTM's g, a GRU-Cho candidate)
    lerp        z * a + (1 - z) * b                                       (GRU's h_t = lerp(z, h, n))
    layer norm  (x - mean) / sqrt(var + eps) * g + b over the H units     (engine.dsl.layer_norm with gain, bias)
    exp gates   sLSTM's stabilized exponential gates (presets/slstm.py): from i~, f~, m_{t-1} and n_{t-1}
                m_t = max(i~, log sigmoid(f~) + m_{t-1} - 1e30 (1 - 2 min(n_{t-1}, 1/2))),
                i = exp(i~ - m_t),  f = exp(log sigmoid(f~) + m_{t-1} - m_t)

In the cell JSON a composite is its primitive nodes (`expand`), named after the block: gate `f` gives the
weights `W_f` (H x the x-port's size) and `U_f` (H x H), the bias `b_f` and the values `f_wx`, `f_uh`, `f_sum`,
`f_pre` and `f`; lerp `h_next` gives `h_next_za`, `h_next_omz`, `h_next_omzb` and `h_next`; layer norm `ln`
gives the gain `g_ln`, the bias `b_ln`, the constant `ln_eps` and the values `ln_mean` ... `ln`. A block has one
output, its own value, named as the block; exp gates `s` has three, `m_next`, `i` and `f`, the values `s_m_next`,
`s_i` and `s_f` (`values`). So every backend, the equations and the kernels see only primitives. Drawing a design
collapses exactly these patterns back into one block (`collapse`), as long as nothing outside reads the inner
values (all but the outputs): a design built from composites comes back as composites, and nodes written any
other way (the gallery's presets) stay primitive.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

from engine.errors import Problem
from engine.ops import activations

GATE, CANDIDATE, LERP, LAYER_NORM, EXP_GATES = "gate", "candidate", "lerp", "layer norm", "exp gates"
TYPES = (GATE, CANDIDATE, LERP, LAYER_NORM, EXP_GATES)
OUTPUT = "value"          # the one output port of every value block but exp gates
EPS = 1e-5                # layer norm's default, engine.dsl.layer_norm's
# sLSTM's start term (presets/slstm.py): about -1e30 where n < 1/2 (the zero start), so m_t = i~ there
START_SCALE = 1e30

_PORTS = {GATE: ("x", "h"), CANDIDATE: ("x", "h"), LERP: ("z", "a", "b"), LAYER_NORM: ("x",),
          EXP_GATES: ("i_pre", "f_pre", "m", "n")}
_OUTPUTS = {EXP_GATES: ("m_next", "i", "f")}


@dataclass(frozen=True)
class Group:
    """A composite found in a design: its block type, its name, the values wired to its ports, its option values,
    the names of the nodes it stands for, and the values its outputs give (output port -> node name)."""

    type: str
    name: str
    args: dict[str, str]
    options: dict[str, object]
    members: frozenset[str]
    values: dict[str, str]

    @property
    def head(self) -> str:
        """The node at whose place the block is drawn: its first output's value."""
        return next(iter(self.values.values()))


def ports(block_type: str) -> tuple[str, ...]:
    return _PORTS[block_type]


def outputs(block_type: str) -> tuple[str, ...]:
    return _OUTPUTS.get(block_type, (OUTPUT,))


def values(block_type: str, name: str) -> dict[str, str]:
    """Output port -> the node that gives its value: the block's own name where it has one output, else
    `<name>_<port>`."""
    if block_type not in _OUTPUTS:
        return {OUTPUT: name}
    return {port: f"{name}_{port}" for port in _OUTPUTS[block_type]}


def whole(value):
    """A whole number from the canvas as an int (JSON may bring 4 back as 4.0); anything else unchanged, for
    engine.ir to refuse by name (a weight's heads)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _eps(options: dict) -> float:
    """The layer norm's eps as the cell holds it: the number given, else the default (`problems` says why)."""
    eps = options.get("eps", EPS)
    return float(eps) if isinstance(eps, Real) and not isinstance(eps, bool) else EPS


def problems(block_type: str, name: str, options: dict) -> list[Problem]:
    """What is wrong with a block's options that the cell graph cannot see (its nodes would be valid)."""
    eps = options.get("eps", EPS)
    if block_type == LAYER_NORM and not (isinstance(eps, Real) and not isinstance(eps, bool)
                                         and math.isfinite(eps) and eps > 0):
        return [Problem(f"layer norm eps must be a number > 0, got {eps!r}", node=name, field="eps",
                        hint="a small positive number such as 1e-5 keeps 1/sqrt(var + eps) finite")]
    return []


def expand(block_type: str, name: str, args: dict[str, str], options: dict) -> list[dict]:
    """The primitive nodes of one composite block, in dependency order (its outputs' values last). A gate's
    activation is one of engine.ops.activations()."""
    arg = {p: args.get(p, "") for p in ports(block_type)}
    if block_type == LERP:
        return [{"name": f"{name}_za", "op": "mul", "args": [arg["z"], arg["a"]]},
                {"name": f"{name}_omz", "op": "one_minus", "args": [arg["z"]]},
                {"name": f"{name}_omzb", "op": "mul", "args": [f"{name}_omz", arg["b"]]},
                {"name": name, "op": "add", "args": [f"{name}_za", f"{name}_omzb"]}]
    if block_type == LAYER_NORM:          # the nodes of engine.dsl.layer_norm(x, gain=v(g), bias=b(b)), in its order
        return [{"name": f"{name}_mean", "op": "mean_h", "args": [arg["x"]]},
                {"name": f"{name}_centred", "op": "sub", "args": [arg["x"], f"{name}_mean"]},
                {"name": f"{name}_square", "op": "mul", "args": [f"{name}_centred", f"{name}_centred"]},
                {"name": f"{name}_var", "op": "mean_h", "args": [f"{name}_square"]},
                {"name": f"{name}_eps", "op": "const", "attrs": {"value": _eps(options)}},
                {"name": f"{name}_var_eps", "op": "add", "args": [f"{name}_var", f"{name}_eps"]},
                {"name": f"{name}_rstd", "op": "rsqrt", "args": [f"{name}_var_eps"]},
                {"name": f"{name}_normed", "op": "mul", "args": [f"{name}_centred", f"{name}_rstd"]},
                {"name": f"g_{name}", "op": "vector", "attrs": {"dim": "H"}},
                {"name": f"{name}_gained", "op": "mul", "args": [f"{name}_normed", f"g_{name}"]},
                {"name": f"b_{name}", "op": "bias", "attrs": {"dim": "H"}},
                {"name": name, "op": "add", "args": [f"{name}_gained", f"b_{name}"]}]
    if block_type == EXP_GATES:           # the nodes of presets/slstm.py, in its order
        i_pre, f_pre, m, n = (arg[p] for p in ports(EXP_GATES))
        return [{"name": f"{name}_logsig_f", "op": "log_sigmoid", "args": [f_pre]},
                {"name": f"{name}_log_f_m", "op": "add", "args": [f"{name}_logsig_f", m]},
                {"name": f"{name}_half", "op": "const", "attrs": {"value": 0.5}},
                {"name": f"{name}_n_min", "op": "min", "args": [n, f"{name}_half"]},
                {"name": f"{name}_n_scale", "op": "scale", "args": [f"{name}_n_min"], "attrs": {"factor": 2.0}},
                {"name": f"{name}_start", "op": "one_minus", "args": [f"{name}_n_scale"]},
                {"name": f"{name}_start_big", "op": "scale", "args": [f"{name}_start"],
                 "attrs": {"factor": START_SCALE}},
                {"name": f"{name}_floor", "op": "sub", "args": [f"{name}_log_f_m", f"{name}_start_big"]},
                {"name": f"{name}_m_next", "op": "max", "args": [i_pre, f"{name}_floor"]},
                {"name": f"{name}_log_i", "op": "sub", "args": [i_pre, f"{name}_m_next"]},
                {"name": f"{name}_i", "op": "exp", "args": [f"{name}_log_i"]},
                {"name": f"{name}_log_f", "op": "sub", "args": [f"{name}_log_f_m", f"{name}_m_next"]},
                {"name": f"{name}_f", "op": "exp", "args": [f"{name}_log_f"]}]
    default = "tanh" if block_type == CANDIDATE else "sigmoid"
    activation = options.get("activation", default)
    activation = activation if activation in activations() else default
    x_size = options.get("x size", "I")
    x_size = x_size if x_size in ("I", "H") else "I"
    heads = whole(options.get("heads", 1))
    u_attrs = {"cols": "H", "heads": heads, "rows": "H"} if heads != 1 else {"cols": "H", "rows": "H"}
    return [{"name": f"W_{name}", "op": "weight", "attrs": {"cols": x_size, "rows": "H"}},
            {"name": f"{name}_wx", "op": "matmul", "args": [f"W_{name}", arg["x"]]},
            {"name": f"U_{name}", "op": "weight", "attrs": u_attrs},
            {"name": f"{name}_uh", "op": "matmul", "args": [f"U_{name}", arg["h"]]},
            {"name": f"{name}_sum", "op": "add", "args": [f"{name}_wx", f"{name}_uh"]},
            {"name": f"b_{name}", "op": "bias", "attrs": {"dim": "H"}},
            {"name": f"{name}_pre", "op": "add", "args": [f"{name}_sum", f"b_{name}"]},
            {"name": name, "op": activation, "args": [f"{name}_pre"]}]


def _args(node: dict) -> list:
    args = node.get("args")
    return args if isinstance(args, list) else []


def _attrs(node: dict | None) -> dict:
    attrs = (node or {}).get("attrs")
    return attrs if isinstance(attrs, dict) else {}


def _candidates(head: dict) -> list[tuple[str, str]]:
    """(block type, block name) of the composites whose first output `head` could be."""
    name, op = head["name"], head.get("op")
    if op == "add":
        return [(LERP, name), (LAYER_NORM, name)]
    if op in activations():
        return [(CANDIDATE if op == "tanh" else GATE, name)]
    suffix = "_" + outputs(EXP_GATES)[0]
    if op == "max" and name.endswith(suffix):
        return [(EXP_GATES, name.removesuffix(suffix))]
    return []


def _read(nodes: dict[str, dict], block_type: str, name: str) -> tuple[dict, dict]:
    """The values wired to the ports and the option values that an expansion named `name` would have, read from
    the nodes (to be checked against `expand`)."""
    def arg(node: str, i: int):
        args = _args(nodes.get(node) or {})
        return args[i] if i < len(args) else None

    if block_type == LERP:
        return {"z": arg(f"{name}_za", 0), "a": arg(f"{name}_za", 1), "b": arg(f"{name}_omzb", 1)}, {}
    if block_type == LAYER_NORM:
        return {"x": arg(f"{name}_mean", 0)}, {"eps": _attrs(nodes.get(f"{name}_eps")).get("value")}
    if block_type == EXP_GATES:
        return ({"i_pre": arg(f"{name}_m_next", 0), "f_pre": arg(f"{name}_logsig_f", 0),
                 "m": arg(f"{name}_log_f_m", 1), "n": arg(f"{name}_n_min", 0)}, {})
    options = {"activation": nodes[name].get("op"), "x size": _attrs(nodes.get(f"W_{name}")).get("cols"),
               "heads": _attrs(nodes.get(f"U_{name}")).get("heads", 1)}
    return {"x": arg(f"{name}_wx", 1), "h": arg(f"{name}_uh", 1)}, options


def _match(nodes: dict[str, dict], head: dict) -> Group | None:
    """The composite whose first output is `head`, if the nodes around it are exactly one expansion."""
    for block_type, name in _candidates(head):
        ports_of, options = _read(nodes, block_type, name)
        if not all(isinstance(v, str) for v in ports_of.values()):
            continue
        expected = expand(block_type, name, ports_of, options)
        if all(nodes.get(e["name"]) == e for e in expected):
            return Group(block_type, name, ports_of, options, frozenset(e["name"] for e in expected),
                         values(block_type, name))
    return None


def collapse(design: dict) -> list[Group]:
    """Every composite drawn as one block: exact expansions whose inner values (all but the block's outputs)
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
        inner = group.members - set(group.values.values())
        if all(readers.get(m, set()) <= group.members for m in inner):
            groups.append(group)
            taken |= group.members
    return groups
