"""The Designer's pure parts, without a browser: palette, canvas adapter, layout, figure, files, checks."""
from __future__ import annotations

import copy
import json
import random

import numpy as np
import pytest

import engine
from app.designer import adapter, checks, figures, files, palette
from app.designer.layout import layout
from engine.ops import LEAF_KINDS, OPS

PRESETS = sorted(engine.presets())


def preset_design(name: str = "lstm") -> dict:
    return copy.deepcopy(engine.to_dict(engine.preset(name).cell))


def canvas_of(design: dict) -> dict:
    """The schema the canvas would send back unchanged: through JSON, as the browser does."""
    schema, skipped = adapter.design_to_schema(design)
    assert skipped == []
    return json.loads(json.dumps(schema))


def block(schema: dict, name: str) -> dict:
    return next(n for n in schema["nodes"] if any(o["name"] == "name" and o["value"] == name for o in n["options"]))


def set_option(node: dict, option: str, value) -> None:
    next(o for o in node["options"] if o["name"] == option)["value"] = value


def new_block(schema: dict, block_type: str, number: int) -> dict:
    """A block as the canvas adds it from the palette: label '<type>-<n>', options at their defaults."""
    spec = palette.SPECS[block_type]
    node = {"id": f"node__{block_type}{number}", "type": block_type, "name": block_type,
            "label": f"{block_type}-{number}",
            "inputs": [{"name": p, "itype": palette.interface_type()} for p in spec.inputs],
            "outputs": [{"name": p, "itype": palette.interface_type()} for p in spec.outputs],
            "options": [{"name": o.name, "value": o.default} for o in spec.options],
            "position": {"x": 10.0, "y": 20.0}, "measured": {"width": 160, "height": 120}}
    schema["nodes"].append(node)
    return node


def wire(schema: dict, source: dict, target: dict, port: str) -> None:
    schema["connections"].append({"id": f"edge__{len(schema['connections'])}", "outputNode": source["id"],
                                  "outputNodeInterface": palette.OUTPUT, "inputNode": target["id"],
                                  "inputNodeInterface": port})


def read(schema: dict, name: str = "lstm") -> adapter.Reading:
    return adapter.schema_to_design(schema, name=name, doc="")


# ---- palette -------------------------------------------------------------------------------------

def test_palette_has_every_op_and_leaf_kind_in_its_category():
    specs = palette.SPECS
    assert set(OPS) | set(LEAF_KINDS) | {palette.NEXT_STATE} | palette.COMPOSITE_TYPES == set(specs)
    assert palette.COMPOSITE_TYPES == {"gate", "candidate", "lerp", "layer norm", "exp gates"}
    assert all(specs[t].category == "building blocks" for t in palette.COMPOSITE_TYPES)
    for op, definition in OPS.items():
        assert specs[op].category == "ops" and specs[op].inputs == definition.ports
    assert specs["matmul"].inputs == ("weight", "operand")
    assert {specs[k].category for k in ("weight", "bias", "vector", "const")} == {"parameters"}
    assert specs["input"].category == "inputs" and specs["state"].category == "states"
    assert specs[palette.NEXT_STATE].inputs == (palette.NEXT_PORT,) and specs[palette.NEXT_STATE].category == "states"
    assert specs["scale"].option("factor").attr == "factor"
    assert specs["weight"].option("rows").items == ("H", "I", "P") and specs["const"].option("value").kind == "number"
    assert specs["state"].option("dim").items == ("H", "P") and specs["state"].option("dim").default == "H"


def test_the_canvas_palette_carries_the_specs_ports_and_fields():
    from app.designer.canvas import palette_args
    categories = palette_args()
    assert [c["name"] for c in categories] == list(palette.CATEGORIES)
    blocks = {b["type"]: b for c in categories for b in c["blocks"]}
    assert set(blocks) == set(palette.SPECS)
    for name, spec in palette.SPECS.items():
        assert blocks[name]["inputs"] == list(spec.inputs) and blocks[name]["outputs"] == list(spec.outputs)
        assert [(o["name"], o["kind"], o["default"]) for o in blocks[name]["options"]] == [
            (o.name, o.kind, o.default) for o in spec.options]
        assert blocks[name]["description"] == spec.description
    assert json.loads(json.dumps(categories)) == categories               # it travels as JSON


# ---- design -> canvas -> design ---------------------------------------------------------------------

@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_round_trips_through_the_canvas(name):
    design = preset_design(name)
    schema = canvas_of(design)
    assert json.loads(json.dumps(schema)) == schema                      # it travels as JSON
    reading = read(schema, name=design["name"])
    assert reading.problems == []
    assert json.dumps(reading.design, sort_keys=True) == json.dumps(design, sort_keys=True)
    assert engine.from_dict(reading.design) == engine.preset(name).cell


def gru_cho_from_building_blocks() -> tuple[dict, adapter.Reading]:
    """GRU-Cho drawn from scratch with composite blocks: x, h, r, z, r*h, n, h_next and one sink."""
    schema = {"version": canvas_of(preset_design())["version"], "nodes": [], "connections": [],
              "viewport": {"x": 0, "y": 0, "zoom": 1}}
    x, h = new_block(schema, "input", 1), new_block(schema, "state", 1)
    set_option(x, "name", "x")
    set_option(h, "name", "h")
    r, z = new_block(schema, "gate", 1), new_block(schema, "gate", 2)
    rh, n = new_block(schema, "mul", 1), new_block(schema, "candidate", 1)
    h_next, sink = new_block(schema, "lerp", 1), new_block(schema, palette.NEXT_STATE, 1)
    for node, name in ((r, "r"), (z, "z"), (rh, "rh"), (n, "n"), (h_next, "h_next")):
        set_option(node, "name", name)
    set_option(sink, "state", "h")
    set_option(sink, "layer output", True)
    for gate in (r, z):
        wire(schema, x, gate, "x")
        wire(schema, h, gate, "h")
    wire(schema, r, rh, "a")
    wire(schema, h, rh, "b")
    wire(schema, x, n, "x")
    wire(schema, rh, n, "h")
    wire(schema, z, h_next, "z")
    wire(schema, h, h_next, "a")
    wire(schema, n, h_next, "b")
    wire(schema, h_next, sink, palette.NEXT_PORT)
    return schema, read(schema, name="gru_cho_blocks")


def test_a_gru_is_seven_blocks_that_expand_into_primitives():
    schema, reading = gru_cho_from_building_blocks()
    assert reading.problems == []
    nodes = {n["name"]: n for n in reading.design["nodes"]}
    assert all(n["op"] not in palette.COMPOSITE_TYPES for n in nodes.values())       # primitives only in the IR
    assert nodes["r"]["op"] == "sigmoid" and nodes["n"]["op"] == "tanh" and nodes["h_next"]["op"] == "add"
    assert nodes["W_r"]["attrs"] == {"cols": "I", "rows": "H"} and nodes["U_n"]["attrs"] == {"cols": "H", "rows": "H"}
    assert nodes["n_uh"]["args"] == ["U_n", "rh"] and nodes["h_next_za"]["args"] == ["z", "h"]
    cell = engine.from_dict(reading.design)                    # a valid cell: the engine checks sizes and names
    network = engine.Network(cell, input_size=3, hidden_size=4, num_layers=1)
    params = engine.init_params(network, seed=0)
    x = np.random.default_rng(0).standard_normal((5, 2, 3))
    out = engine.run(network, params, x, backend="reference", dtype=np.float64).outputs
    # h_t = z * h + (1 - z) * tanh(W_n x + U_n (r * h) + b_n): GRU-Cho, step by step in NumPy
    sig = lambda v: 1 / (1 + np.exp(-v))                                                   # noqa: E731
    h = np.zeros((2, 4))
    for t in range(5):
        def pre(g, operand, t=t):
            return x[t] @ params[0][f"W_{g}"].T + operand @ params[0][f"U_{g}"].T + params[0][f"b_{g}"]
        r, z = sig(pre("r", h)), sig(pre("z", h))
        h = z * h + (1 - z) * np.tanh(pre("n", r * h))
        assert np.allclose(out[t], h, atol=1e-12)


def test_composites_draw_as_one_block_and_round_trip():
    _, reading = gru_cho_from_building_blocks()
    schema = canvas_of(reading.design)
    types = sorted(n["type"] for n in schema["nodes"])
    assert types == sorted(["input", "state", "gate", "gate", "mul", "candidate", "lerp", palette.NEXT_STATE])
    assert json.loads(json.dumps(schema)) == schema
    again = read(schema, name="gru_cho_blocks")
    assert again.problems == []
    assert json.dumps(again.design, sort_keys=True) == json.dumps(reading.design, sort_keys=True)
    gate = block(schema, "n")
    assert {o["name"]: o["value"] for o in gate["options"]} == {"name": "n", "activation": "tanh", "x size": "I",
                                                               "heads": 1}
    primitive, skipped = adapter.design_to_schema(reading.design, blocks=False)      # the toggle off
    assert skipped == [] and not {n["type"] for n in primitive["nodes"]} & palette.COMPOSITE_TYPES
    assert len(primitive["nodes"]) == len(reading.design["nodes"]) + len(reading.design["states"])
    assert read(json.loads(json.dumps(primitive)), name="gru_cho_blocks").design == reading.design


def test_a_composite_whose_inner_value_is_read_elsewhere_stays_primitive():
    _, reading = gru_cho_from_building_blocks()
    design = copy.deepcopy(reading.design)
    design["nodes"].append({"name": "peek", "op": "tanh", "args": ["r_pre"]})        # reads inside gate r
    types = [n["type"] for n in canvas_of(design)["nodes"]]
    assert types.count("gate") == 1 and "sigmoid" in types                           # z still collapses, r not
    changed = copy.deepcopy(reading.design)
    next(n for n in changed["nodes"] if n["name"] == "b_z")["attrs"] = {"dim": "I"}  # not the expansion any more
    assert [n["type"] for n in canvas_of(changed)["nodes"]].count("gate") == 1


def test_an_unwired_composite_port_is_a_problem_naming_the_block():
    schema, _ = gru_cho_from_building_blocks()
    n = block(schema, "n")
    schema["connections"] = [c for c in schema["connections"]
                             if not (c["inputNode"] == n["id"] and c["inputNodeInterface"] == "h")]
    problems = read(schema).problems
    assert any(p.node == "n" and p.field == "args.h" for p in problems), problems


def test_canvas_draws_named_ports_and_one_sink_per_state():
    design = preset_design("lstm")
    schema = canvas_of(design)
    matmul = block(schema, "W_ii_x")
    ports = {c["inputNodeInterface"]: c["outputNode"] for c in schema["connections"] if c["inputNode"] == matmul["id"]}
    assert ports == {"weight": block(schema, "W_ii")["id"], "operand": block(schema, "x")["id"]}
    sinks = [n for n in schema["nodes"] if n["type"] == palette.NEXT_STATE]
    assert sorted(dict((o["name"], o["value"]) for o in s["options"])["state"] for s in sinks) == ["c", "h"]
    ticked = [s for s in sinks if dict((o["name"], o["value"]) for o in s["options"])["layer output"]]
    assert len(ticked) == 1 and "h" in ticked[0]["label"]
    assert block(schema, "i")["label"] == "i · sigmoid"
    marked, _ = adapter.design_to_schema(design, marked={"i"})
    assert block(marked, "i")["label"].startswith(adapter.WARNING_MARK)


def test_a_new_block_is_named_after_its_label_and_wired_by_port():
    schema = canvas_of(preset_design("lstm"))
    relu = new_block(schema, "relu", 1)
    reading = read(schema)
    assert [(p.node, p.field) for p in reading.problems] == [("relu_1", "args.x")]
    assert "not connected" in reading.problems[0].message and reading.problems[0].hint
    entry = next(n for n in reading.design["nodes"] if n["name"] == "relu_1")
    assert entry == {"name": "relu_1", "op": "relu", "args": [""]}
    assert reading.positions["relu_1"] == (10.0, 20.0)

    wire(schema, block(schema, "g"), relu, "x")
    reading = read(schema)
    assert reading.problems == []
    cell = engine.from_dict(reading.design)
    assert cell["relu_1"].args == ("g",)
    assert any("relu_1" in str(w) for w in cell.warnings)          # computed, never used


def test_design_order_is_kept_when_the_editor_lists_a_new_block_first():
    design = preset_design("gru")
    schema = canvas_of(design)
    new_block(schema, "sigmoid", 1)
    schema["nodes"].insert(0, schema["nodes"].pop())                # an editor may list it first
    random.Random().shuffle(schema["nodes"])
    names = [n["name"] for n in read(schema, name="gru").design["nodes"]]
    assert names == [n["name"] for n in design["nodes"]] + ["sigmoid_1"]


def test_rewiring_changes_the_graph():
    schema = canvas_of(preset_design("gru"))
    # feed the candidate n from relu instead of tanh: swap the op of node n
    n = block(schema, "n")
    n["type"] = n["name"] = "relu"
    reading = read(schema, name="gru")
    assert engine.from_dict(reading.design)["n"].op == "relu"


def test_matmul_ports_are_distinct_and_checked_by_the_ir():
    schema = canvas_of(preset_design("lstm"))
    matmul = block(schema, "W_ii_x")
    for c in schema["connections"]:                 # swap the weight and operand wires
        if c["inputNode"] == matmul["id"]:
            c["inputNodeInterface"] = "operand" if c["inputNodeInterface"] == "weight" else "weight"
    check = checks.check_design(read(schema).design)
    assert check.cell is None
    assert any(p.node == "W_ii_x" and p.field == "args.weight" for p in check.problems)


def test_absurd_canvas_payloads_become_problems_naming_the_node():
    schema = canvas_of(preset_design("lstm"))
    set_option(block(schema, "i"), "name", "")                      # a loaded block's name erased
    set_option(block(schema, "f"), "name", "   ")
    schema["nodes"].append({**block(schema, "o"), "id": "forged", "type": "conv2d", "label": "conv"})
    const = new_block(schema, "const", 1)
    set_option(const, "value", float("nan"))
    twice = block(schema, "h_next_tanh")
    wire(schema, block(schema, "g"), twice, "x")                    # a second wire into port x
    schema["connections"].append({"id": "e1", "outputNode": "nowhere", "outputNodeInterface": "value",
                                  "inputNode": twice["id"], "inputNodeInterface": "x"})
    reading = read(schema)
    said = {(p.node, p.field) for p in reading.problems}
    assert ("i · sigmoid", "name") in said and ("f · sigmoid", "name") in said
    assert ("conv", "type") in said and ("h_next_tanh", "args.x") in said and (None, "connections") in said
    check = checks.check_design(reading.design, reading.problems)
    assert check.cell is None
    assert any(p.node == "const_1" and p.field == "attrs.value" for p in check.problems)   # NaN, from the IR


@pytest.mark.parametrize("payload", [None, "text", [], {"nodes": "x"}, {"nodes": [1, None], "connections": {}}])
def test_garbage_payload_never_raises(payload):
    reading = adapter.schema_to_design(payload, name="c")
    assert reading.problems
    assert checks.check_design(reading.design, reading.problems).cell is None


def test_layer_output_is_the_ticked_sink():
    schema = canvas_of(preset_design("lstm"))
    sinks = {dict((o["name"], o["value"]) for o in n["options"])["state"]: n
             for n in schema["nodes"] if n["type"] == palette.NEXT_STATE}
    set_option(sinks["h"], "layer output", False)
    set_option(sinks["c"], "layer output", True)
    assert read(schema).design["output"] == "c"
    set_option(sinks["h"], "layer output", True)
    assert any(p.field == "output" for p in read(schema).problems)
    set_option(sinks["h"], "state", "")
    assert any(p.field == "state" for p in read(schema).problems)


def test_fingerprint_ignores_moves_but_not_edits():
    schema = canvas_of(preset_design("gru"))
    moved = copy.deepcopy(schema)
    moved["nodes"][0]["position"] = {"x": 999.0, "y": -5.0}
    assert adapter.canvas_fingerprint(moved) == adapter.canvas_fingerprint(schema)
    moved["connections"].pop()
    assert adapter.canvas_fingerprint(moved) != adapter.canvas_fingerprint(schema)


def test_unknown_ops_in_a_design_are_not_drawn():
    design = preset_design("gru")
    design["nodes"].append({"name": "mystery", "op": "conv2d"})
    schema, skipped = adapter.design_to_schema(design)
    assert skipped == ["'mystery' ('conv2d')"]
    assert len(schema["nodes"]) == len(design["nodes"]) - 1 + len(design["states"])


# ---- layout ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", PRESETS)
def test_layout_flows_left_to_right_without_overlaps(name):
    design = preset_design(name)
    grid = layout(design)
    names = [n["name"] for n in design["nodes"]]
    column = {names[i]: c for i, (c, _) in grid.nodes.items()}
    spots = list(grid.nodes.values()) + list(grid.sinks.values())
    assert len(spots) == len(set(spots)) == len(design["nodes"]) + len(design["states"])
    for entry in design["nodes"]:
        for a in entry.get("args", []):
            assert column[a] < column[entry["name"]], (a, entry["name"])
        if entry["op"] in ("input", "state"):
            assert column[entry["name"]] == 0
    last = max(c for c, _ in grid.nodes.values())
    for k, state in enumerate(design["states"]):
        assert grid.sinks[k][0] == last + 1
        assert grid.sinks[k][1] == grid.nodes[names.index(state["next"])][1]


def test_lstm_gates_sit_in_rows_in_the_order_they_are_written():
    design = preset_design("lstm")
    grid = layout(design)
    names = [n["name"] for n in design["nodes"]]
    at = {names[i]: spot for i, spot in grid.nodes.items()}
    gates = ["i", "f", "g", "o"]
    assert len({at[g][0] for g in gates}) == 1                    # same column: computed alike
    assert [at[g][1] for g in gates] == sorted(at[g][1] for g in gates)
    for g in gates:                                               # each gate's chain of adds on its row
        assert at[f"{g}_pre"][1] == at[f"{g}_add"][1] == at[g][1]
        assert grid.bands[names.index(f"W_i{g}")] == g and grid.bands[names.index(f"b_h{g}")] == g
    assert at["c_next"][1] > at["o"][1] and at["h_next"][1] > at["c_next"][1]


def test_layout_of_a_broken_design_still_places_every_node():
    design = preset_design("gru")
    design["nodes"].append({"name": "loop_a", "op": "add", "args": ["loop_b", "h"]})
    design["nodes"].append({"name": "loop_b", "op": "tanh", "args": ["loop_a"]})
    design["nodes"].append({"name": "dangling", "op": "sigmoid", "args": ["nowhere"]})
    design["nodes"].append("not a node")
    design["nodes"].append({"name": "h", "op": "state"})           # a duplicate name
    design["states"].append({"name": "ghost", "next": "nothing"})
    grid = layout(design)
    assert set(grid.nodes) == set(range(len(design["nodes"])))
    assert set(grid.sinks) == set(range(len(design["states"])))
    a, b = (grid.nodes[len(design["nodes"]) - k][0] for k in (5, 4))
    assert a == b                                                 # a loop shares one column
    assert layout({"nodes": "nope"}).nodes == {} and layout(None).nodes == {}


# ---- figure ---------------------------------------------------------------------------------------

def test_plan_figure_colours_nodes_by_group_and_rings_problems():
    design = preset_design("lstm")
    rng = random.Random()
    names = [n["name"] for n in design["nodes"] if n["op"] not in ("input", "state", "weight", "bias")]
    groups = {n: rng.choice(["x_proj", "h_gemm", "stage1", "stage2"]) for n in names}
    flagged = rng.sample(names, 3)
    fig = figures.plan_figure(design, groups, flagged)
    colour_of = {}
    for trace in fig.data:
        if trace.mode == "markers+text" and trace.customdata is not None:
            for name, _, group in trace.customdata:
                colour_of[name] = (group, trace.marker.color)
    for name, group in groups.items():
        assert colour_of[name][0] == group
    by_group = {}
    for group, colour in colour_of.values():
        by_group.setdefault(group, set()).add(colour)
    assert all(len(c) == 1 for c in by_group.values())
    used = [c.pop() for g, c in by_group.items() if g != "-"]
    assert len(used) == len(set(used))                              # one colour per group
    ring = next(t for t in fig.data if t.name == "has a problem")
    assert sorted(ring.text) == sorted(flagged)


# ---- files and checks -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, field", [
    ("{not json", "(file)"),
    (b"\xff\xfe", "(file)"),
    ('[1, 2]', "(root)"),
    ('{"schema": "rnn-cell-graph", "version": 99}', "version"),
    ('{"schema": "other"}', "schema"),
])
def test_bad_files_name_the_field(text, field):
    design, problems = files.read_design(text)
    assert design is None and problems[0].field == field


def test_an_invalid_cell_file_names_the_node():
    design = preset_design("lstm")
    design["nodes"][5]["op"] = "conv2d"
    loaded, problems = files.read_design(json.dumps(design))
    assert loaded is None and problems[0].node == design["nodes"][5]["name"] and problems[0].field == "op"


def test_save_list_and_load_designs(tmp_path):
    cell = engine.preset("mgu").cell
    path = files.save_design(tmp_path, "my-mgu.v1", cell)
    assert path.name == "my-mgu.v1.json" and not list(tmp_path.glob("*.tmp"))
    (tmp_path / "autosave.json").write_text("{}")
    assert files.list_designs(tmp_path) == ["my-mgu.v1"]
    design, problems = files.load_design(tmp_path, "my-mgu.v1")
    assert problems == [] and engine.from_dict(design) == cell
    for bad in ("../etc", "autosave", "", ".hidden", "a" * 80):
        assert files.name_problem(bad)
        with pytest.raises(ValueError):
            files.save_design(tmp_path, bad, cell)
    assert files.load_design(tmp_path, "missing")[1][0].field == "(file)"


def test_check_reports_each_problem_once():
    schema = canvas_of(preset_design("lstm"))
    new_block(schema, "tanh", 3)
    reading = read(schema)
    check = checks.check_design(reading.design, reading.problems)
    assert [(p.node, p.field) for p in check.problems] == [("tanh_3", "args.x")]
    assert check.nodes == ["tanh_3"]
    ok = checks.check_design(preset_design("lstm"))
    assert ok.cell == engine.preset("lstm").cell and ok.problems == [] and ok.warnings == []


def test_positions_read_back_keep_blocks_and_sinks_where_they_were_on_a_redraw():
    schema = canvas_of(preset_design("gru"))
    for n in schema["nodes"]:
        n["position"] = {"x": float(len(n["id"])), "y": float(hash(n["id"]) % 1000)}
    reading = read(schema, "gru")
    sink = next(n for n in schema["nodes"] if n["type"] == palette.NEXT_STATE)
    assert reading.positions[adapter.sink_key("h")] == (sink["position"]["x"], sink["position"]["y"])
    again, _ = adapter.design_to_schema(reading.design, positions=reading.positions)
    before = {n["label"]: n["position"] for n in schema["nodes"]}
    after = {n["label"]: n["position"] for n in again["nodes"]}
    assert after == before
    moved_one, _ = adapter.design_to_schema(reading.design, positions={"h": (5.0, 6.0)})
    assert block(moved_one, "h")["position"] == {"x": 5.0, "y": 6.0}
    assert block(moved_one, "x")["position"] == block(canvas_of(preset_design("gru")), "x")["position"]


def test_a_projected_state_round_trips_through_the_canvas():
    from test_projection import lstm_proj
    design = engine.to_dict(lstm_proj())
    schema = canvas_of(design)
    h = block(schema, "h")
    assert {o["name"]: o["value"] for o in h["options"]}["dim"] == "P"
    assert {o["name"]: o["value"] for o in block(schema, "c")["options"]}["dim"] == "H"
    reading = read(schema, name="lstm_proj")
    assert reading.problems == [] and engine.from_dict(reading.design) == lstm_proj().replace(doc="")
    set_option(h, "dim", "H")                        # h of size H no longer fits the P-column weights: named
    problems = checks.check_design(read(schema, name="lstm_proj").design).problems
    assert problems and all("P columns but operand 'h' has size H" in p.message for p in problems)
    assert {p.node for p in problems} == {"W_hi_h", "W_hf_h", "W_hg_h", "W_ho_h"}


def test_a_self_loop_wire_is_refused_in_words_once():
    design = {"schema": "rnn-cell-graph", "version": 1, "name": "c", "doc": "", "output": "h",
              "nodes": [{"name": "x", "op": "input"}, {"name": "h", "op": "state"},
                        {"name": "r", "op": "relu", "args": ["h"]}], "states": [{"name": "h", "next": "r"}]}
    schema, _ = adapter.design_to_schema(design)
    schema["connections"] = [c for c in schema["connections"] if c["inputNode"] != "node-2"] + [
        {"id": "loop", "outputNode": "node-2", "outputNodeInterface": "value", "inputNode": "node-2",
         "inputNodeInterface": "x"}]
    reading = adapter.schema_to_design(schema, name="c")
    problems = checks.check_design(reading.design, reading.problems).problems
    assert [(p.node, p.field) for p in problems] == [("r", "args.x")]
    assert "the wire from 'r' to its own port 'x' is refused" in problems[0].message and problems[0].hint


def test_renames_carry_between_a_state_and_its_next_state_block_and_labels_go_stale():
    schema, _ = adapter.design_to_schema(engine.to_dict(engine.preset("lstm").cell))
    before = adapter.block_names(schema)
    assert not adapter.stale_labels(schema)
    sink = adapter.block_ids(schema)[adapter.sink_key("c")]
    for raw in schema["nodes"]:
        if raw["id"] == sink:
            raw["options"] = [{**o, "value": "cell"} if o["name"] == "state" else o for o in raw["options"]]
    carried, renames = adapter.carry_renames(before, schema)
    assert renames == {"c": "cell"} and adapter.stale_labels(carried)
    reading = adapter.schema_to_design(carried, name="lstm")
    cell = engine.from_dict(reading.design)                  # valid: the state block followed its sink
    assert set(cell.state_names) == {"h", "cell"}
