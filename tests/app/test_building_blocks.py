"""The Designer's blocks for the xLSTM and LayerNorm cells, without a browser: a weight's heads field, the layer
norm and exp gates building blocks (each the same function as the engine's own spelling of it), and the ops'
grouping in the palette."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from test_adapter import block, canvas_of, new_block, preset_design, read, set_option, wire

import engine
from app.designer import adapter, checks, composites, palette
from engine.dsl import W, b, cell, layer_norm, v
from engine.ops import OPS


def options(node: dict) -> dict:
    return {o["name"]: o["value"] for o in node["options"]}


def empty_canvas() -> dict:
    return {"version": adapter.SCHEMA_VERSION, "nodes": [], "connections": [], "viewport": {"x": 0, "y": 0, "zoom": 1}}


def named(schema: dict, block_type: str, name: str, number: int = 1, **fields) -> dict:
    node = new_block(schema, block_type, number)
    set_option(node, "name", name)
    for field, value in fields.items():
        set_option(node, field.replace("_", " "), value)
    return node


def sink(schema: dict, state: str, number: int, output: bool = False) -> dict:
    node = new_block(schema, palette.NEXT_STATE, number)
    set_option(node, "state", state)
    set_option(node, "layer output", output)
    return node


def run_reference(graph: engine.CellGraph, params: list[dict], x: np.ndarray, hidden_size: int,
                  initial_states: dict | None = None) -> engine.RunResult:
    network = engine.Network(graph, input_size=x.shape[-1], hidden_size=hidden_size, num_layers=1)
    return engine.run(network, engine.Params(params), x, initial_states, backend="reference", dtype=np.float64)


def random_params(graph: engine.CellGraph, hidden_size: int, input_size: int, seed: int) -> list[dict]:
    network = engine.Network(graph, input_size=input_size, hidden_size=hidden_size, num_layers=1)
    return [dict(engine.init_params(network, seed=seed)[0])]


# ---- a weight's heads ------------------------------------------------------------------------------

def test_a_weight_shows_its_heads_and_the_field_reads_back_as_a_whole_number():
    schema = canvas_of(preset_design("slstm"))
    assert options(block(schema, "R_i"))["heads"] == 4 and options(block(schema, "W_i"))["heads"] == 1
    set_option(block(schema, "R_f"), "heads", 2.0)                  # the canvas's number field sends floats
    set_option(block(schema, "R_z"), "heads", 1)
    nodes = {n["name"]: n for n in read(schema, name="slstm").design["nodes"]}
    assert nodes["R_f"]["attrs"] == {"cols": "H", "heads": 2, "rows": "H"}
    assert type(nodes["R_f"]["attrs"]["heads"]) is int
    assert nodes["R_z"]["attrs"] == {"cols": "H", "rows": "H"}                  # one head: the cell JSON says nothing
    assert nodes["W_i"]["attrs"] == {"cols": "I", "rows": "H"}
    graph = engine.from_dict(read(schema, name="slstm").design)
    assert graph["R_f"].attr("heads") == 2 and graph["R_i"].attr("heads") == 4


@pytest.mark.parametrize("heads", [2.5, 0, -3, "four"])
def test_a_heads_value_that_is_not_a_whole_number_from_1_is_named_with_a_hint(heads):
    schema = canvas_of(preset_design("slstm"))
    set_option(block(schema, "R_o"), "heads", heads)
    reading = read(schema, name="slstm")
    check = checks.check_design(reading.design, reading.problems)
    assert check.cell is None
    (problem,) = [p for p in check.problems if p.node == "R_o"]
    assert problem.field == "attrs.heads" and "whole number" in problem.message and problem.hint
    kept = next(n for n in reading.design["nodes"] if n["name"] == "R_o")
    assert kept["attrs"]["heads"] == heads                            # the design keeps what was typed
    ids = adapter.block_ids(schema)
    assert set(adapter.marks(check.problems, ids)) == {ids["R_o"]}


# ---- layer norm ------------------------------------------------------------------------------------

def layer_norm_canvas(eps: float | None = None) -> dict:
    """h_t = layer_norm(W x + U h) with its gain g_ln and bias b_ln: x, h, two weights, two matmuls, an add, one
    layer norm block and h's sink."""
    schema = empty_canvas()
    x, h = named(schema, "input", "x"), named(schema, "state", "h")
    w, u = named(schema, "weight", "W", 1, cols="I"), named(schema, "weight", "U", 2)
    wx, uh = named(schema, "matmul", "W_x", 1), named(schema, "matmul", "U_h", 2)
    total, ln = named(schema, "add", "pre"), named(schema, "layer norm", "ln")
    if eps is not None:
        set_option(ln, "eps", eps)
    for source, target, port in ((w, wx, "weight"), (x, wx, "operand"), (u, uh, "weight"), (h, uh, "operand"),
                                 (wx, total, "a"), (uh, total, "b"), (total, ln, "x"),
                                 (ln, sink(schema, "h", 1, output=True), palette.NEXT_PORT)):
        wire(schema, source, target, port)
    return schema


@pytest.mark.parametrize("eps", [None, 1e-3])
def test_the_layer_norm_block_computes_what_engine_dsl_layer_norm_computes(eps):
    reading = read(layer_norm_canvas(eps), name="ln_cell")
    assert reading.problems == []
    drawn = engine.from_dict(reading.design)

    @cell
    def ln_cell(x, h):
        pre = W("W") @ x + W("U") @ h
        return {"h": layer_norm(pre, gain=v("g_ln"), bias=b("b_ln"), **({} if eps is None else {"eps": eps}))}

    assert sorted(p.name for p in drawn.params) == sorted(p.name for p in ln_cell.params)
    params = random_params(drawn, hidden_size=6, input_size=3, seed=1)
    for p in ("g_ln", "b_ln"):              # away from the initial 1 and 0 a gain and bias would start at
        params[0][p] = np.random.default_rng(2).uniform(-2, 2, params[0][p].shape)
    x = np.random.default_rng(3).standard_normal((5, 2, 3))
    ours, theirs = (run_reference(graph, params, x, 6) for graph in (drawn, ln_cell))
    np.testing.assert_allclose(ours.outputs, theirs.outputs, rtol=0, atol=1e-12)
    # and by hand: one step of LayerNorm over the H units
    pre = x[0] @ params[0]["W"].T
    ln = (pre - pre.mean(-1, keepdims=True)) / np.sqrt(pre.var(-1, keepdims=True) + (eps or 1e-5))
    np.testing.assert_allclose(ours.outputs[0], ln * params[0]["g_ln"] + params[0]["b_ln"], rtol=0, atol=1e-12)


def test_a_layer_norm_block_draws_back_as_one_block_with_its_eps():
    reading = read(layer_norm_canvas(1e-3), name="ln_cell")
    schema = canvas_of(reading.design)
    assert sorted(n["type"] for n in schema["nodes"]).count("layer norm") == 1
    assert options(block(schema, "ln")) == {"name": "ln", "eps": 1e-3}
    again = read(schema, name="ln_cell")
    assert again.problems == [] and again.design == reading.design


@pytest.mark.parametrize("eps", [0, -1e-5])
def test_a_layer_norm_eps_that_is_not_positive_is_named_with_a_hint(eps):
    reading = read(layer_norm_canvas(eps), name="ln_cell")
    check = checks.check_design(reading.design, reading.problems)
    assert check.cell is None
    assert [(p.node, p.field) for p in check.problems] == [("ln", "eps")] and check.problems[0].hint
    assert next(n for n in reading.design["nodes"] if n["name"] == "ln_eps")["attrs"]["value"] == eps


# ---- exp gates: sLSTM from building blocks -----------------------------------------------------------

# the slstm preset's parameters -> those of the sLSTM drawn below (gates i_pre, f_pre, o and candidate z)
SLSTM_PARAMS = {f"{kind}_{gate}": f"{'U' if kind == 'R' else kind}_{block_name}"
                for gate, block_name in (("i", "i_pre"), ("f", "f_pre"), ("z", "z"), ("o", "o"))
                for kind in ("W", "R", "b")}


def slstm_canvas() -> dict:
    """sLSTM with 4 heads as a handful of blocks: x and the states h, c, n, m; the pre-activations i_pre, f_pre
    (gates with the identity), the candidate z and the gate o, their U of 4 heads; one exp gates block s; then
    c_t = f c + i z, n_t = max(f n + i, 1), h_t = o c_t / n_t and four sinks."""
    schema = empty_canvas()
    x = named(schema, "input", "x")
    h, c, n, m = (named(schema, "state", s, k) for k, s in enumerate("hcnm", 1))
    i_pre = named(schema, "gate", "i_pre", 1, activation="identity", heads=4)
    f_pre = named(schema, "gate", "f_pre", 2, activation="identity", heads=4)
    o = named(schema, "gate", "o", 3, heads=4)
    z = named(schema, "candidate", "z", 1, heads=4)
    s = named(schema, "exp gates", "s")
    fc, iz, c_next = named(schema, "mul", "fc", 1), named(schema, "mul", "iz", 2), named(schema, "add", "c_next", 1)
    fn, n_sum = named(schema, "mul", "fn", 3), named(schema, "add", "n_sum", 2)
    one, n_next = named(schema, "const", "one", value=1.0), named(schema, "max", "n_next")
    oc, h_next = named(schema, "mul", "oc", 4), named(schema, "div", "h_next")
    for gate in (i_pre, f_pre, o, z):
        wire(schema, x, gate, "x")
        wire(schema, h, gate, "h")
    for source, port in ((i_pre, "i_pre"), (f_pre, "f_pre"), (m, "m"), (n, "n")):
        wire(schema, source, s, port)
    wired = [("f", fc, "a"), (c, fc, "b"), ("i", iz, "a"), (z, iz, "b"), (fc, c_next, "a"), (iz, c_next, "b"),
             ("f", fn, "a"), (n, fn, "b"), (fn, n_sum, "a"), ("i", n_sum, "b"), (n_sum, n_next, "a"),
             (one, n_next, "b"), (o, oc, "a"), (c_next, oc, "b"), (oc, h_next, "a"), (n_next, h_next, "b"),
             (h_next, sink(schema, "h", 1, output=True), palette.NEXT_PORT),
             (c_next, sink(schema, "c", 2), palette.NEXT_PORT), (n_next, sink(schema, "n", 3), palette.NEXT_PORT),
             ("m_next", sink(schema, "m", 4), palette.NEXT_PORT)]
    for source, target, port in wired:
        if isinstance(source, str):          # an output of the exp gates block
            schema["connections"].append({"id": f"edge__s{len(schema['connections'])}", "outputNode": s["id"],
                                          "outputNodeInterface": source, "inputNode": target["id"],
                                          "inputNodeInterface": port})
        else:
            wire(schema, source, target, port)
    return schema


def test_the_exp_gates_block_expands_into_the_slstm_presets_nodes():
    reading = read(slstm_canvas(), name="slstm_blocks")
    assert reading.problems == []
    nodes = {n["name"]: n for n in reading.design["nodes"]}
    assert nodes["s_m_next"] == {"name": "s_m_next", "op": "max", "args": ["i_pre", "s_floor"]}
    assert nodes["s_i"]["op"] == nodes["s_f"]["op"] == "exp"
    assert nodes["fc"]["args"] == ["s_f", "c"] and nodes["n_sum"]["args"] == ["fn", "s_i"]
    assert {s["name"]: s["next"] for s in reading.design["states"]}["m"] == "s_m_next"
    assert nodes["U_z"]["attrs"] == {"cols": "H", "heads": 4, "rows": "H"}
    preset = engine.to_dict(engine.preset("slstm").cell)["nodes"]      # the same ops on the same kinds of values
    assert [n["op"] for n in preset if n["name"].startswith(("log_f_m", "start", "m_next", "c_0_5"))] + [
        "sub", "exp", "sub", "exp"] == [n["op"] for n in reading.design["nodes"] if n["name"].startswith("s_")]


@pytest.mark.parametrize("start", ["zero", "random"])
def test_an_slstm_from_building_blocks_is_the_slstm_preset(start):
    drawn = engine.from_dict(read(slstm_canvas(), name="slstm_blocks").design)
    preset = engine.preset("slstm").cell
    hidden_size, input_size = 8, 5
    params = random_params(preset, hidden_size, input_size, seed=4)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 3, input_size)) * 2
    initial = None
    if start == "random":                  # a state carried over from earlier steps: n >= 1, any m
        initial = {s: rng.uniform(-1, 1, (1, 3, hidden_size)) for s in "hcm"}
        initial["n"] = 1 + rng.uniform(0, 2, (1, 3, hidden_size))
    ours = run_reference(drawn, [{SLSTM_PARAMS[k]: a for k, a in params[0].items()}], x, hidden_size, initial)
    theirs = run_reference(preset, params, x, hidden_size, initial)
    np.testing.assert_allclose(ours.outputs, theirs.outputs, rtol=0, atol=1e-12)
    for state in "hcnm":
        np.testing.assert_allclose(ours.final_states[state], theirs.final_states[state], rtol=0, atol=1e-12)


def test_an_slstm_from_building_blocks_draws_back_as_those_blocks():
    reading = read(slstm_canvas(), name="slstm_blocks")
    schema = canvas_of(reading.design)
    types = [n["type"] for n in schema["nodes"]]
    assert types.count("exp gates") == 1 and types.count("gate") == 3 and types.count("candidate") == 1
    s = block(schema, "s")
    assert [p["name"] for p in s["outputs"]] == ["m_next", "i", "f"]
    from_s = {(c["outputNodeInterface"], c["inputNodeInterface"]) for c in schema["connections"]
              if c["outputNode"] == s["id"]}
    assert from_s == {("f", "a"), ("i", "a"), ("i", "b"), ("m_next", palette.NEXT_PORT)}
    assert options(block(schema, "i_pre")) == {"name": "i_pre", "activation": "identity", "x size": "I", "heads": 4}
    again = read(schema, name="slstm_blocks")
    assert again.problems == [] and again.design == reading.design


def test_wires_from_exp_gates_outputs_are_checked_and_inner_problems_mark_the_block():
    schema = slstm_canvas()
    s = block(schema, "s")
    bad = next(c for c in schema["connections"] if c["outputNode"] == s["id"] and c["outputNodeInterface"] == "i")
    bad["outputNodeInterface"] = "value"                       # the exp gates block has no output 'value'
    problems = read(schema, name="slstm_blocks").problems
    assert any(p.node == "s" and p.field == "port" and "unknown output 'value'" in p.message
               and "m_next, i, f" in p.hint for p in problems), problems
    schema = slstm_canvas()
    set_option(block(schema, "z"), "heads", 1.5)                # inside the candidate: its U_z
    reading = read(schema, name="slstm_blocks")
    check = checks.check_design(reading.design, reading.problems)
    assert [(p.node, p.field) for p in check.problems] == [("U_z", "attrs.heads")] and check.problems[0].hint
    ids = adapter.block_ids(schema)
    assert adapter.marks(check.problems, ids) == {block(schema, "z")["id"]: check.problems[0].message
                                                  + " (field 'attrs.heads')"}
    assert ids["s"] == ids["s_i"] == block(schema, "s")["id"] and ids["U_z"] == block(schema, "z")["id"]


def test_an_unwired_building_block_is_said_once_per_port_in_the_blocks_words():
    schema = layer_norm_canvas()
    named(schema, "exp gates", "s")
    ln = block(schema, "ln")
    schema["connections"] = [c for c in schema["connections"] if c["inputNode"] != ln["id"]]
    reading = read(schema, name="ln_cell")
    said = [(p.node, p.field) for p in checks.check_design(reading.design, reading.problems).problems]
    expected = [("ln", "args.x"), ("s", "args.i_pre"), ("s", "args.f_pre"), ("s", "args.m"), ("s", "args.n")]
    assert said == expected
    assert [(p.node, p.field) for p in checks.check_design(reading.design).problems] == expected   # from the autosave
    primitive, _ = adapter.design_to_schema(reading.design, blocks=False)      # drawn as primitives: their ports
    again = read(json.loads(json.dumps(primitive)), name="ln_cell")
    said = [(p.node, p.field) for p in checks.check_design(again.design, again.problems).problems]
    assert ("ln_mean", "args.x") in said and ("s_logsig_f", "args.x") in said and len(said) == len(set(said))
    assert not {"ln", "s"} & {node for node, _ in said}


def test_heads_that_do_not_divide_the_hidden_size_are_refused_naming_the_weight(app):
    at = app
    at.session_state["designer_payload"] = copy.deepcopy(canvas_of(preset_design("slstm")))
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    schema = canvas_of(preset_design("slstm"))
    set_option(block(schema, "R_o"), "heads", 3.0)              # 256 hidden units are not 3 blocks
    at.session_state["designer_payload"] = schema
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    errors = "\n".join(str(e.value) for e in at.error)
    assert "weight 'R_o'" in errors and "heads=3" in errors and "hint:" in errors


# ---- the palette -----------------------------------------------------------------------------------

def test_the_ops_of_the_palette_are_grouped_by_category_reductions_last():
    ops = [s for s in palette.SPECS.values() if s.category == "ops"]
    categories = [s.extra["op_category"] for s in ops]
    assert categories == sorted(categories, key=categories.index)          # each category in one run
    assert categories[-2:] == ["reduction", "reduction"] and [s.type for s in ops[-2:]] == ["sum_h", "mean_h"]
    assert [s.type for s in ops if s.extra["op_category"] == "arithmetic"][-3:] == ["div", "max", "min"]
    assert palette.SPECS["mean_h"].description == OPS["mean_h"].description
    assert palette.SPECS["sum_h"].group == "ops · reduction" and palette.SPECS["gate"].group == "building blocks"
    assert palette.SPECS["mean_h"].inputs == ("x",) and palette.SPECS["mean_h"].outputs == (palette.OUTPUT,)
    assert composites.outputs("exp gates") == palette.SPECS["exp gates"].outputs == ("m_next", "i", "f")
    assert json.loads(json.dumps([s.description for s in palette.SPECS.values()]))
