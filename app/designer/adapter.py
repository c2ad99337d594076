"""Cell JSON (engine.to_dict form) <-> the canvas's editor schema (a dict; the form of barfi's FlowSchema.export(),
which the first designer used, kept for the project's own canvas in app/designer/canvas).

    schema = design_to_schema(design)                       # draw a design on the canvas
    reading = schema_to_design(schema, name="my_cell")      # read the edited canvas back
    reading.design, reading.problems                        # the cell JSON, and what is wrong on the canvas

Both directions are pure functions over plain dicts and never raise on bad input: a tampered or
half-edited canvas gives a design plus a list of engine.Problem naming the node and the field.
Problems the cell graph itself has (sizes, loops, unknown names) are engine.ir's to report.

On the canvas a node is a block whose type is its op (see palette); its IR name is the block's
`name` option. A block just added from the palette has an empty name and the label the canvas gave it
("sigmoid-2"); it is named after that label ("sigmoid_2"), so wiring up new blocks needs no typing.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

from engine.errors import Problem

from . import composites
from .composites import collapse, expand, whole
from .layout import layout
from .palette import COMPOSITE_TYPES, NEXT_PORT, NEXT_STATE, OUTPUT, SPECS, interface_type

SCHEMA_VERSION = "1.0"      # of the editor schema
COLUMN_WIDTH = 130        # px between columns on the canvas: a block is as wide as its label ("W_hi_h · matmul": 110)
ROW_HEIGHT = 62           # px between rows: a block is a header and a line per port (50 px for two ports)
WARNING_MARK = "⚠ "


@dataclass
class Reading:
    """A canvas read back: the cell JSON, the canvas's own problems, and where each node was drawn."""

    design: dict
    problems: list[Problem] = field(default_factory=list)
    positions: dict[str, tuple[float, float]] = field(default_factory=dict)   # IR name, or sink_key(state) -> (x, y)
    labels: dict[str, str] = field(default_factory=dict)                      # IR name -> canvas label


# ---- design -> canvas ------------------------------------------------------------------------------

def sink_key(state: str) -> str:
    """The key of a next-state block in Reading.positions (IR names cannot contain a space)."""
    return f"{NEXT_STATE} {state}"


def node_label(name: str, op: str) -> str:
    return f"{name} · {op}"


def _interfaces(names) -> list[dict]:
    return [{"name": n, "itype": interface_type()} for n in names]


def _options(spec, values: dict) -> list[dict]:
    return [{"name": o.name, "value": values.get(o.name, o.default)} for o in spec.options]


def design_to_schema(design: dict, marked: set[str] | frozenset = frozenset(),
                     blocks: bool = True, positions: dict | None = None) -> tuple[dict, list[str]]:
    """The editor schema drawing `design` with the automatic layout.

    marked: node names to flag with a warning sign in their label (nodes with problems).
    blocks: draw composite building blocks (app/designer/composites.py) as one block each, else every primitive.
    positions: where the researcher had put blocks (Reading.positions); those keep their place, the others
    take the automatic layout's.
    Returns (schema, skipped): skipped lists nodes that have no block (unknown op, malformed entry).
    """
    grid = layout(design)
    positions = positions or {}

    def place(key: str, column: int, row: int) -> dict:
        x, y = positions.get(key, (column * COLUMN_WIDTH, row * ROW_HEIGHT))
        return {"x": x, "y": y}
    nodes: list[dict] = []
    connections: list[dict] = []
    skipped: list[str] = []
    ids: dict[str, tuple[str, str]] = {}             # a value's name -> (the block drawing it, its output port)
    raw_nodes = design.get("nodes") if isinstance(design, dict) else None
    raw_nodes = raw_nodes if isinstance(raw_nodes, list) else []
    # Composites drawn as one block (at the place of their first output's value); their other nodes are not drawn.
    groups = {g.head: g for g in collapse(design)} if blocks else {}
    inner = {m for g in groups.values() for m in g.members if m != g.head}

    drawn: list[tuple[int, dict]] = []
    for i, entry in enumerate(raw_nodes):
        op = entry.get("op") if isinstance(entry, dict) else None
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str) and name in inner:
            continue
        if not isinstance(name, str) or op not in SPECS or op == NEXT_STATE or op in COMPOSITE_TYPES:
            skipped.append(f"{name!r} ({op!r})" if isinstance(entry, dict) else f"nodes[{i}]")
            continue
        node_id = f"node-{i}"
        for port, value in (groups[name].values if name in groups else {OUTPUT: name}).items():
            ids.setdefault(value, (node_id, port))
        drawn.append((i, entry))

    for i, entry in drawn:
        group = groups.get(entry["name"])
        name = group.name if group else entry["name"]
        spec = SPECS[group.type if group else entry["op"]]
        attrs = entry.get("attrs") if isinstance(entry.get("attrs"), dict) else {}
        values = {"name": name}
        values.update({o.name: attrs[o.attr] for o in spec.options if o.attr and o.attr in attrs})
        if group:
            values.update(group.options)
            entry = {**entry, "args": [group.args[p] for p in spec.inputs]}
        label = node_label(name, spec.type)
        column, row = grid.nodes[i]
        nodes.append({
            "id": f"node-{i}", "type": spec.type, "name": spec.type,
            "label": (WARNING_MARK + label) if name in marked else label,
            "inputs": _interfaces(spec.inputs), "outputs": _interfaces(spec.outputs),
            "options": _options(spec, values),
            "position": place(name, column, row),
            "measured": {"width": 0, "height": 0},
        })
        args = entry.get("args") if isinstance(entry.get("args"), list) else []
        for port, arg in zip(spec.inputs, args):
            if isinstance(arg, str) and arg in ids:
                source, out_port = ids[arg]
                connections.append({"id": f"edge-{i}-{port}", "outputNode": source, "outputNodeInterface": out_port,
                                    "inputNode": f"node-{i}", "inputNodeInterface": port})

    states = design.get("states") if isinstance(design, dict) else None
    output = design.get("output") if isinstance(design, dict) else None
    spec = SPECS[NEXT_STATE]
    for k, entry in enumerate(states if isinstance(states, list) else []):
        if not isinstance(entry, dict):
            skipped.append(f"states[{k}]")
            continue
        state, nxt = entry.get("name"), entry.get("next")
        column, row = grid.sinks[k]
        node_id = f"next-{k}"
        nodes.append({
            "id": node_id, "type": NEXT_STATE, "name": NEXT_STATE,
            "label": f"{state} at t" if isinstance(state, str) else NEXT_STATE,
            "inputs": _interfaces(spec.inputs), "outputs": [],
            "options": _options(spec, {"state": state if isinstance(state, str) else "",
                                       "layer output": state == output}),
            "position": place(sink_key(state) if isinstance(state, str) else "", column, row),
            "measured": {"width": 0, "height": 0},
        })
        if isinstance(nxt, str) and nxt in ids:
            source, out_port = ids[nxt]
            connections.append({"id": f"edge-next-{k}", "outputNode": source, "outputNodeInterface": out_port,
                                "inputNode": node_id, "inputNodeInterface": NEXT_PORT})

    schema = {"version": SCHEMA_VERSION, "nodes": nodes, "connections": connections,
              "viewport": {"x": 0, "y": 0, "zoom": 1}}
    return schema, skipped


# ---- canvas -> design ------------------------------------------------------------------------------

def _new_block_name(label: str, block_type: str) -> str | None:
    """'sigmoid-2' (the canvas's label for a freshly added block) -> 'sigmoid_2'; None for any other label."""
    match = re.fullmatch(re.escape(block_type) + r"-(\d+)", label)
    if not match:
        return None
    return re.sub(r"\W", "_", block_type) + "_" + match.group(1)


def _number(value):
    """Numbers from the canvas as floats (JSON may bring 1.0 back as 1); anything else unchanged."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


class _Reader:
    def __init__(self, schema):
        self.problems: list[Problem] = []
        self.schema = schema if isinstance(schema, dict) else {}
        if not isinstance(schema, dict):
            self.problem(None, "(canvas)", f"the editor sent {type(schema).__name__}, not a schema object")

    def problem(self, node: str | None, where: str, message: str, hint: str | None = None) -> None:
        self.problems.append(Problem(message, node=node, field=where, hint=hint))

    def items(self, key: str) -> list[dict]:
        raw = self.schema.get(key, [])
        if not isinstance(raw, list):
            self.problem(None, key, f"'{key}' must be a list")
            return []
        good = [r for r in raw if isinstance(r, dict)]
        if len(good) != len(raw):
            self.problem(None, key, f"{len(raw) - len(good)} entr(y/ies) of '{key}' are not objects")
        return good


def _options_of(raw: dict) -> dict:
    options = raw.get("options")
    if not isinstance(options, list):
        return {}
    return {o["name"]: o.get("value") for o in options if isinstance(o, dict) and isinstance(o.get("name"), str)}


def _name_of(reader: _Reader, raw: dict, label: str, block_type: str) -> str | None:
    value = _options_of(raw).get("name", "")
    if value is None or value == "":
        named = _new_block_name(label, block_type)
        if named is None:
            reader.problem(label, "name", "the name is empty",
                           hint="type a name (letters, digits and '_') in the block's name field")
        return named
    if not isinstance(value, str):
        reader.problem(label, "name", f"the name must be text, got {value!r}")
        return None
    if not value.strip():
        reader.problem(label, "name", "the name is blank (only spaces)",
                       hint="type a name (letters, digits and '_') in the block's name field")
        return None
    return value


def _drawing_order(raw_nodes: list[dict]) -> list[dict]:
    """Blocks drawn from the design first, in the design's order (their ids say it), then new ones.

    The editor may list a block added from the palette before the others; keeping the design's order
    means that reading back an unchanged canvas gives back the same design, node for node.
    """
    def key(k_raw):
        k, raw = k_raw
        match = re.fullmatch(r"(node|next)-(\d+)", str(raw.get("id")))
        return (0, match.group(1) == "next", int(match.group(2)), k) if match else (1, 0, 0, k)
    return [raw for _, raw in sorted(enumerate(raw_nodes), key=key)]


def schema_to_design(schema: dict, *, name: str, doc: str = "", input_is_hidden: bool = False) -> Reading:
    """Read an edited canvas back into cell JSON. Never raises; see Reading. name, doc and input_is_hidden belong
    to the cell, not to the canvas: the caller keeps them."""
    reader = _Reader(schema)
    raw_nodes = _drawing_order(reader.items("nodes"))
    raw_connections = reader.items("connections")

    # id -> (IR name or None, block type, label, options)
    blocks: dict[str, tuple[str | None, str, str, dict]] = {}
    positions: dict[str, tuple[float, float]] = {}
    labels: dict[str, str] = {}
    for raw in raw_nodes:
        node_id = raw.get("id")
        block_type = raw.get("type", raw.get("name"))
        label = raw.get("label") if isinstance(raw.get("label"), str) else str(node_id)
        label = label.removeprefix(WARNING_MARK)
        if not isinstance(node_id, str) or node_id in blocks:
            reader.problem(label, "id", f"block id {node_id!r} is missing or used twice")
            continue
        if block_type not in SPECS:
            reader.problem(label, "type", f"unknown block type {block_type!r}",
                           hint="use the blocks of the palette (right-click the canvas)")
            continue
        ir_name = None if block_type == NEXT_STATE else _name_of(reader, raw, label, block_type)
        blocks[node_id] = (ir_name, block_type, label, _options_of(raw))
        key = ir_name
        if block_type == NEXT_STATE and isinstance(blocks[node_id][3].get("state"), str):
            key = sink_key(blocks[node_id][3]["state"])
        if ir_name is not None:
            labels.setdefault(ir_name, label)
        position = raw.get("position")
        if key is not None and isinstance(position, dict) and all(
                isinstance(position.get(k), (int, float)) for k in "xy"):
            positions.setdefault(key, (float(position["x"]), float(position["y"])))

    # (target id, port) -> (source id, its output port) of each wire
    wires: dict[tuple[str, str], list[tuple[str, str]]] = {}
    refused: set[tuple[str, str]] = set()           # ports whose only wire came from their own block: said once
    for raw in raw_connections:
        source, target = raw.get("outputNode"), raw.get("inputNode")
        port = raw.get("inputNodeInterface")
        if source not in blocks or target not in blocks:
            reader.problem(None, "connections", f"a wire joins unknown blocks {source!r} -> {target!r}")
            continue
        target_label = blocks[target][2]
        if port not in SPECS[blocks[target][1]].inputs:
            reader.problem(target_label, "port", f"a wire ends on unknown port {port!r}")
            continue
        out_port = raw.get("outputNodeInterface", OUTPUT)
        source_outputs = SPECS[blocks[source][1]].outputs
        if not source_outputs:
            reader.problem(blocks[source][2], "port", "a wire starts from a block without an output")
            continue
        if out_port not in source_outputs:
            reader.problem(blocks[source][0] or blocks[source][2], "port",
                           f"a wire starts from unknown output {out_port!r}",
                           hint=f"draw it from one of the block's outputs: {', '.join(source_outputs)}")
            continue
        if source == target:
            who = blocks[target][0] or target_label
            reader.problem(who, f"args.{port}", f"the wire from '{who}' to its own port '{port}' is refused: a value "
                           "cannot be computed from itself within one step",
                           hint="feed a value back through a state (its value at t-1): wire the state's block to "
                                "this port, and this block to the state's next-state block")
            refused.add((target, port))
            continue
        wires.setdefault((target, port), []).append((source, out_port))

    def value(source: str, out_port: str) -> str:
        ir_name, block_type = blocks[source][:2]
        if not ir_name or block_type not in COMPOSITE_TYPES:
            return ir_name or ""
        return composites.values(block_type, ir_name)[out_port]

    def argument(node_id: str, port: str, who: str) -> str:
        sources = wires.get((node_id, port), [])
        if not sources and (node_id, port) in refused:
            return ""
        if not sources:
            reader.problem(who, f"args.{port}", f"port '{port}' is not connected",
                           hint="drag a wire from a value's output to this port")
            return ""
        if len(sources) > 1:
            names = ", ".join(repr(value(*s) or blocks[s[0]][2]) for s in sources)
            reader.problem(who, f"args.{port}", f"port '{port}' has {len(sources)} wires ({names})",
                           hint="a port takes one value: delete the extra wires")
        return value(*sources[0])

    nodes: list[dict] = []
    states: list[dict] = []
    outputs: list[str] = []
    for node_id, (ir_name, block_type, label, options) in blocks.items():
        spec = SPECS[block_type]
        if block_type == NEXT_STATE:
            state = options.get("state", "")
            who = label
            if not isinstance(state, str) or not state.strip():
                reader.problem(who, "state", "the next-state block does not say which state it sets",
                               hint="type the state's name (e.g. h) in its 'state' field")
                state = state if isinstance(state, str) else ""
            states.append({"name": state, "next": argument(node_id, NEXT_PORT, state or who)})
            if options.get("layer output") is True:
                outputs.append(state)
            continue
        if ir_name is None:
            continue
        if block_type in COMPOSITE_TYPES:             # its primitives, its outputs' values last
            values = {o.name: options.get(o.name, o.default) for o in spec.options}
            nodes += expand(block_type, ir_name, {p: argument(node_id, p, ir_name) for p in spec.inputs}, values)
            reader.problems += composites.problems(block_type, ir_name, values)
            continue
        entry: dict = {"name": ir_name, "op": block_type}
        if spec.inputs:
            entry["args"] = [argument(node_id, port, ir_name) for port in spec.inputs]
        attrs = {}
        for o in (o for o in spec.options if o.attr):
            attr_value = _number(options.get(o.name, o.default))
            attr_value = whole(attr_value) if o.whole else attr_value
            if o.implicit is None or attr_value != o.implicit:    # a state of size H: the cell JSON says nothing
                attrs[o.attr] = attr_value
        attrs = dict(sorted(attrs.items()))          # engine.to_dict's order, so equal designs read equal
        if attrs:
            entry["attrs"] = attrs
        nodes.append(entry)

    output = _output(reader, outputs, states)
    design = {"schema": "rnn-cell-graph", "version": 1, "name": name, "doc": doc, "output": output,
              "nodes": nodes, "states": states}
    if input_is_hidden:
        design["input_is_hidden"] = True
    return Reading(design=design, problems=reader.problems, positions=positions, labels=labels)


def _output(reader: _Reader, outputs: list[str], states: list[dict]) -> str:
    if len(outputs) == 1:
        return outputs[0]
    if len(outputs) > 1:
        reader.problem(None, "output", f"{len(outputs)} next-state blocks are ticked as the layer output "
                       f"({', '.join(map(repr, outputs))})", hint="tick 'layer output' on one of them only")
        return outputs[0]
    names = [s["name"] for s in states]
    if "h" in names:
        return "h"
    reader.problem(None, "output", "no next-state block is ticked as the layer output",
                   hint="tick 'layer output' on the next-state block of h_t")
    return names[0] if names else "h"


def block_ids(schema: dict) -> dict[str, str]:
    """Which block of a canvas draws which value: IR name (or sink_key(state) for a next-state block) -> block id.
    A composite block is found under its own name, and then under each node it expands into (its weights, its
    outputs' values: a problem there marks the block); every block's own name comes before those."""
    ids: dict[str, str] = {}
    members: list[tuple[str, str]] = []
    nodes = schema.get("nodes") if isinstance(schema, dict) else None
    for raw in nodes if isinstance(nodes, list) else []:
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            continue
        block_type = raw.get("type", raw.get("name"))
        options = _options_of(raw)
        if block_type == NEXT_STATE:
            if isinstance(options.get("state"), str):
                ids.setdefault(sink_key(options["state"]), raw["id"])
            continue
        name = options.get("name")
        if not isinstance(name, str) or not name:
            label = raw.get("label") if isinstance(raw.get("label"), str) else ""
            name = _new_block_name(label.removeprefix(WARNING_MARK), str(block_type))
        if name:
            ids.setdefault(name, raw["id"])
        if name and block_type in COMPOSITE_TYPES:
            members += [(n["name"], raw["id"]) for n in expand(block_type, name, {}, options)]
    for member, block in members:
        ids.setdefault(member, block)
    return ids


def block_names(schema: dict) -> dict[str, tuple[str, str]]:
    """Block id -> (its type, the name it stands for): a value block's `name` field, a next-state block's `state`."""
    out = {}
    nodes = schema.get("nodes") if isinstance(schema, dict) else None
    for raw in nodes if isinstance(nodes, list) else []:
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            continue
        block_type = str(raw.get("type", raw.get("name")))
        value = _options_of(raw).get("state" if block_type == NEXT_STATE else "name")
        if isinstance(value, str) and value:
            out[raw["id"]] = (block_type, value)
    return out


def stale_labels(schema: dict) -> bool:
    """True when a block's label no longer says its name (the canvas draws the label the app gave it): a named block
    whose label is of another name, or a next-state block whose label is of another state. A block just added from
    the palette keeps its label ("relu-1") until it is named."""
    nodes = schema.get("nodes") if isinstance(schema, dict) else None
    for raw in nodes if isinstance(nodes, list) else []:
        if not isinstance(raw, dict):
            continue
        block_type = str(raw.get("type", raw.get("name")))
        label = str(raw.get("label", "")).removeprefix(WARNING_MARK)
        if block_type == NEXT_STATE:
            state = _options_of(raw).get("state")
            if isinstance(state, str) and state and label != f"{state} at t":
                return True
            continue
        name = _options_of(raw).get("name")
        if isinstance(name, str) and name and not label.startswith(f"{name} · "):
            return True
    return False


def carry_renames(previous: dict[str, tuple[str, str]], schema: dict) -> tuple[dict, dict[str, str]]:
    """Carry a rename made on the canvas through everything that names the old name. `previous`: block_names() of
    the canvas before the edit. Wires join blocks, not names, so arguments follow by themselves; a state is named
    twice, by its state block and by its next-state block's `state` field (which also carries the layer output):
    renaming either renames the other. Returns (schema, {old: new} of the renamed blocks); the schema is a new
    dict when a rename was carried, else the one given."""
    now = block_names(schema)
    renames = {old: now[block][1] for block, (_, old) in previous.items()
               if block in now and now[block][1] != old}
    still = {name for _, name in now.values()}
    carry: dict[tuple[str, str], str] = {}       # (the other side's type, old name) -> new name
    for block, (block_type, old) in previous.items():
        new = renames.get(old) if block in now and now[block][1] != old else None
        if new is None or old in {n for b, (t, n) in now.items() if t == block_type}:
            continue                                 # not renamed, or the old name is still drawn by another block
        if block_type == "state":
            carry[(NEXT_STATE, old)] = new
        elif block_type == NEXT_STATE:
            carry[("state", old)] = new
    carry = {k: v for k, v in carry.items() if (k[0], v) not in {(t, n) for t, n in now.values()}}
    if not carry:
        return schema, {k: v for k, v in renames.items() if k not in still}
    schema = json.loads(json.dumps(schema))
    for raw in schema["nodes"]:
        if not isinstance(raw, dict) or not isinstance(raw.get("options"), list):
            continue
        block_type = str(raw.get("type", raw.get("name")))
        field_name = "state" if block_type == NEXT_STATE else "name"
        for option in raw["options"]:
            if isinstance(option, dict) and option.get("name") == field_name and (block_type, option.get("value")) in carry:
                option["value"] = carry[(block_type, option["value"])]
    return schema, {k: v for k, v in renames.items() if k not in still} | {old: new for (_, old), new in carry.items()}


SINK_FIELDS = ("args.next", "states.next", "state")      # a state's problems that belong to its next-state block


def marks(problems, ids: dict[str, str]) -> dict[str, str]:
    """Block id -> what is wrong there, for the canvas to draw: each problem goes to the block of its node (a state's
    next value to its next-state block; a node inside a composite block to that block)."""
    out: dict[str, list[str]] = {}
    composites = sorted((n for n in ids if " " not in n), key=len, reverse=True)
    for p in problems:
        if not p.node:
            continue
        order = (sink_key(p.node), p.node) if p.field in SINK_FIELDS else (p.node, sink_key(p.node))
        targets = [ids[k] for k in order if k in ids][:1]
        if not targets:
            owner = next((n for n in composites if p.node.startswith(n + "_")), None)
            targets = [ids[owner]] if owner else []
        text = p.message + (f" (field '{p.field}')" if p.field and p.field not in p.message else "")
        for target in targets:
            out.setdefault(target, [])
            if text not in out[target]:
                out[target].append(text)
    return {k: "; ".join(v) for k, v in out.items()}


def canvas_fingerprint(schema: dict) -> str:
    """What identifies an edit: the graph without positions, sizes and viewport (moving blocks is no edit)."""
    if not isinstance(schema, dict):
        return "invalid"
    nodes = schema.get("nodes") if isinstance(schema.get("nodes"), list) else []
    body = {
        "nodes": [{k: v for k, v in n.items() if k not in ("position", "measured")} if isinstance(n, dict) else n
                  for n in nodes],
        "connections": schema.get("connections"),
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]
