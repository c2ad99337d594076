"""Bad cell graphs are rejected with a CellGraphError that names the node or JSON field and gives a hint.

Each bad graph is the JSON dict of a valid preset (the LSTM unless said otherwise) with one edit, read
back through engine.from_dict: the same path a hand-edited or app-exported design takes.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import engine
from engine import CellGraphError
from engine.dsl import W, b, cell, tanh


def node(data: dict, name: str) -> dict:
    return next(n for n in data["nodes"] if n["name"] == name)


def set_op(name, op):
    def edit(d):
        node(d, name)["op"] = op
    return edit


def set_args(name, args):
    def edit(d):
        node(d, name)["args"] = list(args)
    return edit


def add_node(entry):
    def edit(d):
        d["nodes"].append(entry)
    return edit


def drop_state(name):
    def edit(d):
        d["states"] = [s for s in d["states"] if s["name"] != name]
    return edit


def add_state(name, next_):
    def edit(d):
        d["states"].append({"name": name, "next": next_})
    return edit


def add_state_next(name, next_):
    def edit(d):
        next(s for s in d["states"] if s["name"] == name)["next"] = next_
    return edit


def set_attrs(name, **attrs):
    def edit(d):
        node(d, name).setdefault("attrs", {}).update(attrs)
    return edit


def set_key(key, value):
    def edit(d):
        d[key] = value
    return edit


# (id, edit of the LSTM's JSON dict, expected err.node, expected err.field, a phrase of the message)
CASES = [
    ("unknown_op", set_op("c_next", "addd"), "c_next", "op", "unknown op 'addd'"),
    ("wrong_arity", set_args("c_next", ["c_next_mul"]), "c_next", "args", "takes 2 argument"),
    ("too_many_args", set_args("h_next_tanh", ["c_next", "c"]), "h_next_tanh", "args", "takes 1 argument"),
    ("unknown_arg", set_args("c_next", ["c_next_mul", "c_nxt"]), "c_next", "args.b", "unknown node 'c_nxt'"),
    ("shape_mismatch_I_vs_H", set_args("i_add", ["i_add_1", "x"]), "i_add", "args", "shape mismatch"),
    ("cycle_without_state", set_args("i_pre", ["i_add", "h_next"]), None, None, "instantaneous loop"),
    ("next_has_input_size", lambda d: (add_node({"name": "x_copy", "op": "identity", "args": ["x"]})(d),
                                       add_state_next("c", "x_copy")(d)), "c", "states.next", "has size I"),
    ("next_is_a_scalar", lambda d: (add_node({"name": "one", "op": "const", "attrs": {"value": 1.0}})(d),
                                    add_node({"name": "one_copy", "op": "identity", "args": ["one"]})(d),
                                    add_state_next("c", "one_copy")(d)), "c", "states.next", "is a scalar"),
    ("state_without_next", drop_state("c"), "c", "states", "no next value"),
    ("next_for_unknown_state", add_state("m", "h_next"), "m", "states", "unknown state"),
    ("state_listed_twice", add_state("c", "c_next"), "c", "states", "listed twice"),
    ("next_is_not_a_node", set_key("states", [{"name": "h", "next": "h_next"}, {"name": "c", "next": "c_nxt"}]),
     "c", "states.next", "'c_nxt' is not a node"),
    ("next_not_wired_yet", set_key("states", [{"name": "h", "next": "h_next"}, {"name": "c", "next": ""}]),
     "c", "states.next", "state 'c' has no next value yet"),
    ("next_is_a_parameter", set_key("states", [{"name": "h", "next": "h_next"}, {"name": "c", "next": "b_ii"}]),
     "c", "states.next", "not a computed value"),
    ("duplicate_name", add_node({"name": "b_ii", "op": "bias", "attrs": {"dim": "H"}}), "b_ii", "name",
     "duplicate name"),
    ("weight_on_I_and_H", set_args("W_hi_h", ["W_ii", "h"]), "W_hi_h", "args.operand", "W_ii"),
    ("weight_in_elementwise_op", set_args("c_next", ["c_next_mul", "W_ii"]), "c_next", "args.b",
     "only be used through matmul"),
    ("matmul_without_weight", set_args("W_ii_x", ["b_ii", "x"]), "W_ii_x", "args.weight", "must be a weight"),
    ("bad_weight_dim", set_attrs("W_ii", cols="K"), "W_ii", "attrs.cols", "must be one of"),
    ("bad_bias_dim", set_attrs("b_ii", dim="J"), "b_ii", "attrs.dim", "must be one of"),
    ("unknown_attribute", set_attrs("b_ii", dimm="H"), "b_ii", "attrs.dimm", "unknown attribute 'dimm'"),
    ("attribute_on_an_op", set_attrs("c_next", factor=2.0), "c_next", "attrs.factor", "unknown attribute"),
    ("scale_without_factor", set_op("h_next_tanh", "scale"), "h_next_tanh", "attrs.factor", "factor"),
    ("scale_by_infinity", lambda d: (set_op("h_next_tanh", "scale")(d),
                                     set_attrs("h_next_tanh", factor=float("inf"))(d)),
     "h_next_tanh", "attrs.factor", "finite number"),
    ("const_not_a_number", add_node({"name": "k", "op": "const", "attrs": {"value": "one"}}), "k", "attrs.value",
     "finite number"),
    ("leaf_with_args", set_args("b_ii", ["x"]), "b_ii", "args", "takes no arguments"),
    ("bad_identifier", add_node({"name": "2x", "op": "bias"}), "2x", "name", "not a valid identifier"),
    ("second_input", add_node({"name": "x2", "op": "input"}), None, "nodes", "exactly one input"),
    ("output_not_a_state", set_key("output", "y"), None, "output", "output 'y'"),
    ("no_states", set_key("states", []), None, "states", "at least one state"),
]


@pytest.mark.parametrize("edit,want_node,want_field,phrase", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_graph_is_rejected_with_its_location(edit, want_node, want_field, phrase, preset_dict):
    data = preset_dict("lstm")
    edit(data)
    with pytest.raises(CellGraphError) as info:
        engine.from_dict(data)
    err = info.value
    text = str(err)
    assert phrase in text
    assert "hint:" in text, "every message says what to do next"
    if want_node is not None:
        assert err.node == want_node
        assert f"'{want_node}'" in text
    if want_field is not None:
        assert err.field == want_field
        assert f"'{want_field}'" in text


def test_cycle_names_the_loop(preset_dict):
    data = preset_dict("lstm")
    set_args("i_pre", ["i_add", "h_next"])(data)
    with pytest.raises(CellGraphError) as info:
        engine.from_dict(data)
    loop = {"i_pre", "i", "c_next_mul", "c_next", "h_next_tanh", "h_next"}
    assert info.value.node in loop
    for name in ("i_pre", "h_next", "c_next"):
        assert name in str(info.value)
    assert "through a state" in str(info.value)


def test_a_shape_mismatch_is_reported_once_not_downstream(preset_dict):
    data = preset_dict("lstm")
    set_args("i_add", ["i_add_1", "x"])(data)
    with pytest.raises(CellGraphError) as info:
        engine.from_dict(data)
    assert [p.node for p in info.value.problems] == ["i_add"]
    assert "'x' is I" in str(info.value) and "'i_add_1' is H" in str(info.value)


def test_every_problem_is_reported_at_once(preset_dict):
    data = preset_dict("lstm")
    set_op("c_next", "addd")(data)
    set_op("h_next", "mull")(data)
    with pytest.raises(CellGraphError) as info:
        engine.from_dict(data)
    assert {p.node for p in info.value.problems} >= {"c_next", "h_next"}
    assert "mull" in str(info.value)


# ---- the JSON layer --------------------------------------------------------------------------

@pytest.mark.parametrize("text,field,phrase", [
    ('{"schema": "rnn-cell-graph", "version": 1,', "(file)", "not valid JSON"),
    ("", "(file)", "not valid JSON"),
    ("[1, 2]", "(root)", "JSON object"),
    ("null", "(root)", "JSON object"),
], ids=["truncated", "empty", "a_list", "null"])
def test_malformed_json(text, field, phrase):
    with pytest.raises(CellGraphError) as info:
        engine.from_json(text)
    assert info.value.field == field and phrase in str(info.value) and "hint:" in str(info.value)


@pytest.mark.parametrize("key,value,field", [
    ("schema", "other-schema", "schema"),
    ("schema", None, "schema"),
    ("version", 2, "version"),
    ("version", "1", "version"),
    ("version", True, "version"),
    ("version", 1.0, "version"),
    ("name", "", "name"),
    ("nodes", {}, "nodes"),
    ("states", "h", "states"),
    ("output", 3, "output"),
    ("doc", 3, "doc"),
], ids=lambda v: repr(v))
def test_wrong_schema_version_and_top_level_types(key, value, field, preset_dict):
    data = preset_dict("lstm")
    data[key] = value
    with pytest.raises(CellGraphError) as info:
        engine.from_dict(data)
    assert info.value.field == field
    assert f"'{field}'" in str(info.value)
    assert "hint:" in str(info.value)


def test_unknown_top_level_key(preset_dict):
    data = preset_dict("lstm")
    data["nodez"] = []
    with pytest.raises(CellGraphError) as info:
        engine.from_dict(data)
    assert info.value.field == "nodez" and "nodez" in str(info.value) and "nodes" in info.value.hint


def test_unknown_node_key(preset_dict):
    data = preset_dict("lstm")
    node(data, "b_ii")["colour"] = "red"
    index = next(i for i, n in enumerate(data["nodes"]) if n["name"] == "b_ii")
    with pytest.raises(CellGraphError) as info:
        engine.from_dict(data)
    assert info.value.node == "b_ii" and info.value.field == f"nodes[{index}]"
    assert "colour" in str(info.value)


def test_unknown_state_key(preset_dict):
    data = preset_dict("lstm")
    data["states"][1]["init"] = 0.0
    with pytest.raises(CellGraphError) as info:
        engine.from_dict(data)
    assert info.value.node == "c" and info.value.field == "states[1]" and "init" in str(info.value)


@pytest.mark.parametrize("entry,field", [
    ("not a node", "nodes[0]"),
    ({"name": 3, "op": "input"}, "nodes[0].name"),
    ({"name": "x", "op": ["input"]}, "nodes[0].op"),
    ({"name": "x", "op": "input", "args": "h"}, "nodes[0].args"),
    ({"name": "x", "op": "input", "attrs": ["H"]}, "nodes[0].attrs"),
], ids=["string", "name", "op", "args", "attrs"])
def test_malformed_node_entries(entry, field, preset_dict):
    data = preset_dict("lstm")
    data["nodes"][0] = entry
    with pytest.raises(CellGraphError) as info:
        engine.from_dict(data)
    assert info.value.field == field and f"'{field}'" in str(info.value)


def test_malformed_state_entry(preset_dict):
    data = preset_dict("lstm")
    data["states"][0] = {"name": "h"}
    with pytest.raises(CellGraphError) as info:
        engine.from_dict(data)
    assert info.value.field == "states[0]"


def test_load_of_a_missing_file_is_a_cell_graph_error(tmp_path):
    with pytest.raises(CellGraphError) as info:
        engine.load(tmp_path / "nope.json")
    assert info.value.field == "(file)" and "nope.json" in str(info.value)


def test_from_dict_does_not_edit_its_argument(preset_dict):
    data = preset_dict("gru")
    before = json.dumps(data, sort_keys=True)
    engine.from_dict(data)
    assert json.dumps(data, sort_keys=True) == before


# ---- warnings, not errors --------------------------------------------------------------------

def test_unused_parameter_is_a_warning(preset_dict):
    data = preset_dict("lstm")
    add_node({"name": "b_extra", "op": "bias", "attrs": {"dim": "H"}})(data)
    add_node({"name": "W_extra", "op": "weight", "attrs": {"rows": "H", "cols": "I"}})(data)
    graph = engine.from_dict(data)
    warned = {w.node: str(w) for w in graph.warnings}
    assert set(warned) == {"b_extra", "W_extra"}
    assert "not used" in warned["b_extra"]
    # an unused parameter still needs a value (the graph declares it), but it changes nothing
    assert "b_extra" in {p.name for p in graph.params}


def test_unused_input_and_unread_state_are_warnings():
    @cell
    def no_input(x, h, c):
        return {"h": tanh(W("W_hh") @ h + b("b_h")), "c": tanh(W("W_hc") @ h)}

    warned = {w.node: str(w) for w in no_input.warnings}
    assert set(warned) == {"x", "c"}
    assert "input is not used" in warned["x"] and "never read" in warned["c"]


def test_dead_computation_is_a_warning(preset_dict):
    data = preset_dict("gru")
    add_node({"name": "unused_gate", "op": "sigmoid", "args": ["n"]})(data)
    graph = engine.from_dict(data)
    assert [w.node for w in graph.warnings] == ["unused_gate"]
    assert "never used" in str(graph.warnings[0])


def test_a_loop_through_a_state_is_fine(preset_dict):
    """The recurrence itself: h feeds the gates that compute h's next value."""
    graph = engine.from_dict(preset_dict("lstm"))
    assert graph.warnings == ()


# ---- NaN and Inf, when the run is asked to look (engine.run(..., check_finite=True)) ------------------

def _finite_case():
    network = engine.Network(engine.preset("gru").cell, input_size=4, hidden_size=3, num_layers=2)
    params = engine.init_params(network, seed=0)
    x = np.random.default_rng(0).standard_normal((5, 2, 4))
    return network, params, x


@pytest.mark.parametrize("where,expected", [
    ("x", "x has 1 NaN or Inf value(s), the first at index (2, 1, 3)"),
    ("state", "initial_states['h'] has 2 NaN or Inf value(s), the first at index (1, 0, 0)"),
    ("param", "params layer 1 'W_hr' has 1 NaN or Inf value(s), the first at index (0, 2)"),
])
def test_check_finite_names_the_first_bad_value(where, expected):
    from engine.errors import BackendError
    network, params, x = _finite_case()
    states = None
    if where == "x":
        x[2, 1, 3] = np.nan
    elif where == "state":
        states = {"h": np.zeros((2, 2, 3))}
        states["h"][1, 0, 0] = np.inf
        states["h"][1, 1, 2] = -np.inf
    else:
        params.layers[1]["W_hr"] = params.layers[1]["W_hr"].copy()          # (H, H): a recurrent weight
        params.layers[1]["W_hr"][0, 2] = np.nan
    with pytest.raises(BackendError) as err:
        engine.run(network, params, x, states, backend="reference", check_finite=True)
    assert expected in str(err.value) and "hint:" in str(err.value)
    # Without the check the run goes ahead (and the NaN spreads): the check is what names it.
    with np.errstate(invalid="ignore"):
        out = engine.run(network, params, x, states, backend="reference").outputs
    assert not np.isfinite(out).all()


def test_check_finite_passes_clean_inputs_and_the_cli_flag_works(tmp_path, capsys):
    network, params, x = _finite_case()
    clean = engine.run(network, params, x, backend="reference", check_finite=True).outputs
    assert np.array_equal(clean, engine.run(network, params, x, backend="reference").outputs)
    from engine.cli import main
    bad = np.random.default_rng(0).standard_normal((3, 2, 4))
    bad[0, 0, 0] = np.inf
    np.save(tmp_path / "x.npy", bad)
    assert main(["run", "gru", "-H", "3", "--input", str(tmp_path / "x.npy"), "--check-finite",
                 "-o", str(tmp_path / "o.npz")]) != 0
    assert "x has 1 NaN or Inf value(s), the first at index (0, 0, 0)" in capsys.readouterr().err


def test_gpu_status_says_when_the_driver_is_missing(monkeypatch):
    import sys
    import types

    from engine import backends

    def no_driver():
        raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version")
    fake = types.ModuleType("cupy")
    fake.__version__ = "14.2.0"
    fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=no_driver))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    backends.gpu_status.cache_clear()
    try:
        ok, why = backends.gpu_status()
    finally:
        backends.gpu_status.cache_clear()
    assert not ok and why.startswith("no NVIDIA driver on this machine, or one too old") and "Insufficient" in why
