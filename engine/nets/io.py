"""A Net as JSON (schema "rnn-network", version 1): a block names its cell by preset or embeds the cell's JSON."""
from __future__ import annotations

import json

from ..arguments import shown
from ..errors import BackendError, CellGraphError, Problem
from ..files import error_of, load_json, parse_json
from ..gallery import presets
from ..serialize import from_dict, to_dict
from .data import NET_SCHEMA, NET_VERSION, Layers, Net, Pool, check_net, resolve_cell

NET_HINT = ('a network file looks like {"schema": "rnn-network", "version": 1, "input_size": 64, "blocks": '
            '[{"kind": "layers", "cell": "lstm", "hidden_size": 256}]} (engine.net_to_json writes one)')
TOP_KEYS = {"schema", "version", "name", "doc", "input_size", "blocks"}


def net_to_dict(net: Net) -> dict:
    check_net(net)
    blocks = []
    for block in net.blocks:
        if isinstance(block, Pool):
            entry = {"kind": "pool", "op": block.op, "window": block.window, "stride": block.stride}
        else:
            known = presets().get(block.cell.name)
            cell = block.cell.name if known is not None and known.cell == block.cell else to_dict(block.cell)
            entry = {"kind": "layers", "cell": cell, "hidden_size": block.hidden_size, "num_layers": block.num_layers,
                     "direction": block.direction}
            if block.bidirectional:
                entry["merge"] = block.merge
            for key in ("proj_size", "input_size"):
                if getattr(block, key) is not None:
                    entry[key] = getattr(block, key)
        if block.name:
            entry["name"] = block.name
        blocks.append(entry)
    return {"schema": NET_SCHEMA, "version": NET_VERSION, "name": net.name, "doc": net.doc,
            "input_size": net.input_size, "blocks": blocks}


NET_HINT = "start from a preset's JSON: `python -m engine net deepspeech --json > net.json`"


def net_from_dict(data) -> Net:
    """A Net from its JSON dict. Errors are BackendError / CellGraphError naming the block and field."""
    if not isinstance(data, dict):
        raise BackendError(f"a network is a JSON object, got {type(data).__name__}; hint: {NET_HINT}")
    if data.get("schema") != NET_SCHEMA:
        raise BackendError(f"field 'schema' must be {shown(NET_SCHEMA)}, got {shown(data.get('schema'))}; hint: a cell's JSON "
                           "(schema 'rnn-cell-graph') goes in a block's 'cell' field")
    if type(data.get("version")) is not int or data["version"] != NET_VERSION:    # not True, not 1.0
        raise BackendError(f"field 'version': this engine reads version {NET_VERSION}, got "
                           f"{shown(data.get('version'))}; hint: re-export the network with this engine")
    raw_blocks = data.get("blocks")
    if not isinstance(raw_blocks, list) or not raw_blocks:
        raise BackendError("field 'blocks' must be a non-empty list of {\"kind\": \"layers\" | \"pool\", ...}; "
                           f"hint: {NET_HINT}")
    blocks = []
    allowed = {"layers": {"kind", "cell", "hidden_size", "num_layers", "direction", "merge", "proj_size",
                          "input_size", "name"},
               "pool": {"kind", "op", "window", "stride", "name"}}
    for k, raw in enumerate(raw_blocks):
        where = f"blocks[{k}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("kind"), str) or raw["kind"] not in allowed:
            got = raw.get("kind") if isinstance(raw, dict) else raw
            raise BackendError(f"field '{where}.kind' must be 'layers' or 'pool', got {shown(got)}; hint: e.g. "
                               '{"kind": "layers", "cell": "lstm", "hidden_size": 256}')
        unknown = sorted(str(key) for key in set(raw) - allowed[raw["kind"]])
        if unknown:
            raise BackendError(f"field '{where}.{unknown[0]}' is not a field of a {raw['kind']} block; hint: "
                               f"{raw['kind']} blocks take {', '.join(sorted(allowed[raw['kind']] - {'kind'}))}")
        if raw["kind"] == "pool":
            blocks.append(Pool(raw.get("op", "max"), raw.get("window", 2), raw.get("stride", 2), raw.get("name", "")))
            continue
        cell = raw.get("cell")
        try:
            cell = from_dict(cell) if isinstance(cell, dict) else resolve_cell(cell)
        except CellGraphError as e:      # the same findings, placed inside this block's 'cell' field
            raise CellGraphError([Problem(p.message, node=p.node, hint=p.hint,
                                          field=f"{where}.cell" + (f".{p.field}" if p.field and p.field != "preset"
                                                                   else ""))
                                  for p in e.problems]) from None
        if "hidden_size" not in raw:
            raise BackendError(f"field '{where}.hidden_size' is missing; hint: e.g. \"hidden_size\": 512")
        blocks.append(Layers(cell, raw["hidden_size"], raw.get("num_layers", 1), raw.get("direction", "forward"),
                             raw.get("merge", "concat"), raw.get("proj_size"), raw.get("input_size"),
                             raw.get("name", "")))
    for key in ("name", "doc"):
        if not isinstance(data.get(key, ""), str):
            raise BackendError(f"field '{key}' must be a string, got {type(data[key]).__name__}; hint: e.g. "
                               f'"{key}": "my_net", or leave it out')
    unknown = sorted(str(key) for key in set(data) - TOP_KEYS)
    if unknown:
        raise BackendError(f"field '{unknown[0]}' is not a field of a network; hint: a network has "
                           f"{', '.join(sorted(TOP_KEYS))}")
    return Net(data.get("input_size"), tuple(blocks), data.get("name", "net"), data.get("doc", ""))


def net_to_json(net: Net) -> str:
    return json.dumps(net_to_dict(net), indent=1)


def net_from_json(text: str) -> Net:
    return net_from_dict(parse_json(text, "network JSON", error=error_of(BackendError), hint=NET_HINT))


def load_net(path) -> Net:
    data = load_json(path, "network file", error=error_of(BackendError), hint="check the path; " + NET_HINT)
    try:
        return net_from_dict(data)
    except (BackendError, CellGraphError) as e:
        raise type(e)(f"{path}: {e}") from None
