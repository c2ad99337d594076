"""JSON form of a cell graph, with a versioned schema. Round-trips exactly.

    {"schema": "rnn-cell-graph", "version": 1, "name": ..., "doc": ..., "output": "h",
     "nodes": [{"name": "W_ii", "op": "weight", "attrs": {"rows": "H", "cols": "I"}},
               {"name": "i_pre", "op": "add", "args": ["a_node", "b_node"]}, ...],
     "states": [{"name": "h", "next": "h_next"}, ...]}

`args` lists the op's ports in the order engine.ops gives (matmul: weight, operand).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .arguments import shown
from .errors import CellGraphError, Problem
from .files import check_destination, parse_json, read_text, write_text
from .ir import SCHEMA, VERSION, CellGraph, Node, StateSpec

TOP_KEYS = ("schema", "version", "name", "doc", "output", "nodes", "states", "input_is_hidden")


def check_graph(graph, what: str = "graph") -> CellGraph:
    """A CellGraph as it is; anything else refused naming the argument, with the spelling that makes one."""
    if isinstance(graph, CellGraph):
        return graph
    hint = (f"pass engine.preset({shown(graph)}).cell" if isinstance(graph, str) else
            "pass its .cell" if isinstance(getattr(graph, "cell", None), CellGraph) else
            "a cell from engine.preset(name).cell, engine.load(path) or the @engine.cell DSL")
    raise _err(f"argument '{what}' must be a CellGraph, got {type(graph).__name__}", "(argument)", hint=hint)


def to_dict(graph: CellGraph) -> dict[str, Any]:
    graph = check_graph(graph)
    structure = graph.structure()
    out = {"schema": structure.pop("schema"), "version": structure.pop("version"), "name": graph.name,
           "doc": graph.doc}
    out.update(structure)              # output, nodes, states (and input_is_hidden), in the files' key order
    return out


def to_json(graph: CellGraph, indent: int | None = 2) -> str:
    return json.dumps(to_dict(graph), indent=indent)


# Attributes only engine/dense.py sets on the cells it derives: what each marks, and what to write instead.
ENGINE_ATTRS = {"fixed": ("the dense form of a reduction", "write sum_h(v) or mean_h(v) for a reduction over the "
                          "hidden units"),
                "diagonal": ("the dense form of a weight of heads", 'write "heads": k for a weight of k independent '
                             "blocks")}


def _err(msg: str, field: str, hint: str | None = None, node: str | None = None) -> CellGraphError:
    return CellGraphError(Problem(msg, field=field, hint=hint, node=node))


def from_dict(data: Any) -> CellGraph:
    if not isinstance(data, dict):
        raise _err(f"a cell graph is a JSON object, got {type(data).__name__}", "(root)",
                   hint='the file should start with {"schema": "rnn-cell-graph", ...}')
    if data.get("schema") != SCHEMA:
        raise _err(f"'schema' must be '{SCHEMA}', got {shown(data.get('schema'))}", "schema",
                   hint="is this a cell-graph file? export one with `python -m engine show --json`")
    version = data.get("version")
    if type(version) is not int or version != VERSION:   # True == 1 and 1.0 == 1 in Python; neither is a version
        raise _err(f"unsupported version {shown(version)}; this engine reads version {VERSION}", "version",
                   hint="re-export the design with this version of the engine")
    unknown = sorted(str(k) for k in set(data) - set(TOP_KEYS))
    if unknown:
        raise _err(f"unknown key(s) {unknown} in the cell graph", unknown[0],
                   hint="a cell graph has only: " + ", ".join(TOP_KEYS))
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise _err("'name' must be a non-empty string", "name", hint="e.g. \"name\": \"my_lstm\"")
    doc = data.get("doc", "")
    if not isinstance(doc, str):
        raise _err("'doc' must be a string", "doc", hint="the cell's description, or leave it out")
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list):
        raise _err("'nodes' must be a list of node objects", "nodes",
                   hint='e.g. "nodes": [{"name": "x", "op": "input"}, ...]')
    nodes = []
    for i, raw in enumerate(raw_nodes):
        where = f"nodes[{i}]"
        if not isinstance(raw, dict):
            raise _err(f"each node is an object, got {type(raw).__name__}", where,
                       hint='e.g. {"name": "i", "op": "sigmoid", "args": ["i_pre"]}')
        unknown = sorted(str(k) for k in set(raw) - {"name", "op", "args", "attrs"})
        if unknown:
            raise _err(f"unknown key(s) {unknown}", where, node=raw.get("name"),
                       hint="a node has only name, op, args and attrs")
        nname, op = raw.get("name"), raw.get("op")
        if not isinstance(nname, str):
            raise _err("'name' must be a string", f"{where}.name", hint="every node needs a unique name")
        if not isinstance(op, str):
            raise _err("'op' must be a string", f"{where}.op", node=nname,
                       hint="an op from engine.ops (add, mul, sigmoid, ...) or a leaf kind (input, weight, ...)")
        args = raw.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise _err("'args' must be a list of node names", f"{where}.args", node=nname,
                       hint='e.g. "args": ["W_ii", "x"]')
        attrs = raw.get("attrs", {})
        if not isinstance(attrs, dict):
            raise _err("'attrs' must be an object", f"{where}.attrs", node=nname,
                       hint='e.g. "attrs": {"rows": "H", "cols": "I"}')
        for key, (what, hint) in ENGINE_ATTRS.items():
            if key in attrs:
                raise _err(f"attribute '{key}' is the engine's own ({what})", f"{where}.attrs.{key}", node=nname,
                           hint=f"remove it; {hint}")
        nodes.append(Node(nname, op, tuple(args), tuple(sorted(attrs.items()))))
    raw_states = data.get("states")
    if not isinstance(raw_states, list):
        raise _err("'states' must be a list of {name, next} objects", "states",
                   hint='e.g. "states": [{"name": "h", "next": "h_next"}]')
    states = []
    for i, raw in enumerate(raw_states):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not isinstance(raw.get("next"), str):
            raise _err("each state is an object with string 'name' and 'next'", f"states[{i}]",
                       hint='e.g. {"name": "h", "next": "h_next"}')
        unknown = sorted(str(k) for k in set(raw) - {"name", "next"})
        if unknown:
            raise _err(f"unknown key(s) {unknown}", f"states[{i}]", node=raw["name"],
                       hint="a state has only name and next")
        states.append(StateSpec(raw["name"], raw["next"]))
    output = data.get("output", "h")
    if not isinstance(output, str):
        raise _err("'output' must be a state name", "output", hint='usually "h"')
    tied = data.get("input_is_hidden", False)
    if not isinstance(tied, bool):
        raise _err(f"'input_is_hidden' must be true or false, got {shown(tied)}", "input_is_hidden",
                   hint="true when the cell combines x with hidden-sized values (it then needs input size == "
                        "hidden size)")
    return CellGraph(name=name, nodes=tuple(nodes), states=tuple(states), output=output, doc=doc,
                     input_is_hidden=tied)


def file_error(message: str, hint: str) -> CellGraphError:
    return _err(message, "(file)", hint=hint)


def from_json(text: str) -> CellGraph:
    return from_dict(parse_json(text, "cell-graph JSON", error=file_error,
                                hint="check the file is a cell-graph JSON export"))


def load(path: str | Path) -> CellGraph:
    text = read_text(path, "cell-graph file", error=file_error,
                     hint="check the path, and that the file is a UTF-8 cell-graph JSON export")
    return from_json(text)


def save(graph: CellGraph, path: str | Path) -> Path:
    """Atomic write (engine.files): a crash mid-save never leaves a truncated design, a failed one no temporary."""
    check_destination(path, "cell-graph file", example=f"{getattr(graph, 'name', 'cell')}.json")
    return write_text(path, to_json(graph), "cell-graph file")
