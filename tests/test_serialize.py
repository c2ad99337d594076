"""The JSON form of a cell graph: exact round trips, files, the structural hash."""
from __future__ import annotations

import json

import pytest

import engine
from engine.serialize import SCHEMA, VERSION

NAMES = sorted(engine.presets())


@pytest.mark.parametrize("name", NAMES)
def test_save_and_load_round_trip(name, tmp_path):
    cell = engine.preset(name).cell
    path = tmp_path / f"{name}.json"
    engine.save(cell, path)
    assert engine.load(path) == cell
    assert path.read_text() == engine.to_json(cell)
    assert [p.name for p in tmp_path.iterdir()] == [path.name], "no temporary file is left behind"


def test_save_replaces_an_existing_file(tmp_path):
    path = tmp_path / "design.json"
    engine.save(engine.preset("lstm").cell, path)
    engine.save(engine.preset("gru").cell, path)
    assert engine.load(path) == engine.preset("gru").cell


def test_header_and_field_order():
    data = json.loads(engine.to_json(engine.preset("gru").cell))
    assert data["schema"] == SCHEMA and data["version"] == VERSION
    assert list(data) == ["schema", "version", "name", "doc", "output", "nodes", "states"]
    assert data["states"] == [{"name": "h", "next": "h_next"}]
    matmul = next(n for n in data["nodes"] if n["op"] == "matmul")
    weight = next(n for n in data["nodes"] if n["name"] == matmul["args"][0])
    assert weight["op"] == "weight", "matmul args are in port order: weight, operand"


def test_compact_json_is_the_same_graph():
    cell = engine.preset("lstm_fgr").cell
    assert engine.from_json(engine.to_json(cell, indent=None)) == cell


def test_doc_and_output_survive():
    data = engine.to_dict(engine.preset("mgu").cell)
    data["doc"] = "my variant\nwith two lines"
    graph = engine.from_dict(data)
    assert graph.doc == "my variant\nwith two lines" and graph.output == "h"
    assert engine.from_json(engine.to_json(graph)).doc == graph.doc


def test_optional_fields_take_defaults():
    data = engine.to_dict(engine.preset("indrnn").cell)
    del data["doc"], data["output"]
    graph = engine.from_dict(data)
    assert graph.doc == "" and graph.output == "h"


def test_structural_hash_ignores_name_and_doc_only():
    cell = engine.preset("lstm").cell
    renamed = cell.replace(name="my_lstm", doc="same structure")
    assert renamed.structural_hash == cell.structural_hash
    assert engine.preset("lstm_np").cell.structural_hash != cell.structural_hash
    data = engine.to_dict(cell)
    next(n for n in data["nodes"] if n["name"] == "g")["op"] = "relu"
    assert engine.from_dict(data).structural_hash != cell.structural_hash


def test_node_order_is_kept():
    cell = engine.preset("peephole_lstm").cell
    back = engine.from_json(engine.to_json(cell))
    assert [n.name for n in back.nodes] == [n.name for n in cell.nodes]
    assert [p.name for p in back.params] == [p.name for p in cell.params], "params initialize in this order"


def test_load_rejects_non_utf8(tmp_path):
    path = tmp_path / "binary.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(engine.CellGraphError) as info:
        engine.load(path)
    assert info.value.field == "(file)"
