"""The Designer page run through Streamlit's AppTest: the canvas's read-back is fed an editor schema
through st.session_state["designer_payload"], exactly as the canvas component sends an edit."""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

import engine
from app.designer import adapter, palette

PAGE = Path(__file__).resolve().parents[2] / "app" / "views" / "designer.py"


@pytest.fixture
def designs(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "designs"
    monkeypatch.setenv("RNN_DESIGNS_DIR", str(folder))
    return folder


@pytest.fixture
def designer(designs) -> AppTest:
    at = AppTest.from_file(str(PAGE), default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


TOKEN = "0123456789abcdef0123456789abcdef"          # a working-design id of the kind app.state makes


def working_file(designs: Path) -> Path:
    """The one session's working design (a test runs one session unless it says otherwise)."""
    (path,) = (designs / "sessions").glob("*.json")
    return path


def session_with(token: str | None = None) -> AppTest:
    """A new session of the designer page, opened with ?design=<token> when given."""
    at = AppTest.from_file(str(PAGE), default_timeout=60)
    if token is not None:
        at.query_params["design"] = token
    return at.run()


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def latex(at: AppTest) -> str:
    """The LaTeX of the page's st.latex (AppTest shows it inside $$ ... $$)."""
    return at.latex[0].value.strip().removeprefix("$$").removesuffix("$$").strip()


def lstm_canvas() -> dict:
    schema, _ = adapter.design_to_schema(engine.to_dict(engine.preset("lstm").cell))
    return json.loads(json.dumps(schema))


def add_block(schema: dict, block_type: str, number: int) -> dict:
    spec = palette.SPECS[block_type]
    node = {"id": f"node__new{number}", "type": block_type, "name": block_type, "label": f"{block_type}-{number}",
            "inputs": [{"name": p, "itype": palette.interface_type()} for p in spec.inputs],
            "outputs": [{"name": p, "itype": palette.interface_type()} for p in spec.outputs],
            "options": [{"name": o.name, "value": o.default} for o in spec.options],
            "position": {"x": 0.0, "y": 0.0}, "measured": {"width": 160, "height": 100}}
    schema["nodes"].append(node)
    return node


def node_id(schema: dict, name: str) -> str:
    return next(n["id"] for n in schema["nodes"]
                if any(o["name"] == "name" and o["value"] == name for o in n["options"]))


def send(at: AppTest, schema: dict) -> AppTest:
    at.session_state["designer_payload"] = copy.deepcopy(schema)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_opens_on_the_lstm_with_equations_code_and_plan(designer):
    at = designer
    assert [t.value for t in at.title] == ["Designer"]
    assert not at.error, texts(at.error)
    assert "lstm" in texts(at.success)
    assert latex(at) == engine.to_latex(engine.preset("lstm").cell)
    assert "def lstm(x, h, c):" in at.code[0].value
    assert at.button(key="designer.undo").disabled and at.button(key="designer.redo").disabled


def test_an_incomplete_canvas_shows_the_error_then_completing_it_updates_everything(designer, designs):
    at = designer
    schema = lstm_canvas()
    relu = add_block(schema, "relu", 1)
    send(at, schema)
    errors = texts(at.error)
    assert "node 'relu_1', field 'args.x': port 'x' is not connected" in errors
    assert "hint: drag a wire" in errors
    assert "The equations appear when the cell is valid." in texts(at.info)
    assert not at.button(key="designer.undo").disabled
    saved = json.loads(working_file(designs).read_text())
    assert any(n["name"] == "relu_1" for n in saved["nodes"])

    schema["connections"].append({"id": "edge__new", "outputNode": node_id(schema, "g"), "outputNodeInterface": "value",
                                  "inputNode": relu["id"], "inputNodeInterface": "x"})
    send(at, schema)
    assert not at.error, texts(at.error)
    assert r"\mathrm{relu}(g)" in latex(at)
    assert "relu_1 = relu(g)" in at.code[0].value
    assert "node 'relu_1': value is computed but never used" in texts(at.warning)


def test_the_same_payload_is_applied_once(designer):
    at = designer
    schema = lstm_canvas()
    add_block(schema, "tanh", 4)
    send(at, schema)
    at.button(key="designer.undo").click().run()
    assert not at.error, texts(at.error)            # back to the LSTM
    at.run()                                        # a rerun does not re-apply the old edit
    assert not at.error and not at.button(key="designer.redo").disabled


def test_undo_and_redo_walk_the_history(designer):
    at = designer
    schema = lstm_canvas()
    add_block(schema, "sigmoid", 1)
    send(at, schema)
    assert "sigmoid_1" in texts(at.error)
    at.button(key="designer.undo").click().run()
    assert not at.error and at.button(key="designer.undo").disabled
    at.button(key="designer.redo").click().run()
    assert "sigmoid_1" in texts(at.error)
    assert at.button(key="designer.redo").disabled


def test_loading_a_preset_and_renaming_the_cell(designer):
    at = designer
    at.selectbox(key="designer.preset").set_value("gru").run()
    at.button(key="designer.load_preset").click().run()
    assert latex(at) == engine.to_latex(engine.preset("gru").cell)
    assert at.text_input(key="designer.name").value == "gru"
    at.text_input(key="designer.name").set_value("my_gru").run()
    assert "def my_gru(x, h):" in at.code[0].value
    assert "my_gru" in texts(at.success)
    at.text_input(key="designer.name").set_value("").run()            # a cleared field keeps the name
    assert "field 'Cell name': a cell needs a name; kept 'my_gru'" in texts(at.warning)
    assert at.text_input(key="designer.name").value == "my_gru"
    assert "def my_gru(x, h):" in at.code[0].value
    assert not at.error


@pytest.mark.parametrize("content, expected", [
    (b"{ not json", "field '(file)': cell-graph JSON is not valid JSON"),
    (b'{"schema": "rnn-cell-graph", "version": 7}', "field 'version': unsupported version 7"),
    (b'{"schema": "rnn-cell-graph", "version": 1, "name": "x", "nodes": [{"name": "x", "op": "input", '
     b'"colour": 3}], "states": []}', "unknown key(s) ['colour']"),
])
def test_a_bad_upload_is_an_error_and_the_design_is_kept(designer, content, expected):
    at = designer
    at.file_uploader(key="designer.upload").set_value(("bad.json", content, "application/json")).run()
    assert not at.exception
    errors = texts(at.error)
    assert "Could not open bad.json; the current design is kept." in errors and expected in errors
    assert latex(at) == engine.to_latex(engine.preset("lstm").cell)


def test_an_upload_with_an_absurd_node_names_it(designer):
    at = designer
    design = engine.to_dict(engine.preset("lstm").cell)
    design["nodes"][3]["op"] = "fft"
    at.file_uploader(key="designer.upload").set_value(("t.json", json.dumps(design).encode(), "application/json"))
    at.run()
    assert f"node '{design['nodes'][3]['name']}', field 'op': unknown op 'fft'" in texts(at.error)


def test_a_good_upload_replaces_the_design(designer):
    at = designer
    text = engine.to_json(engine.preset("mgu").cell).encode()
    at.file_uploader(key="designer.upload").set_value(("mgu.json", text, "application/json")).run()
    assert "Opened mgu.json" in texts(at.success)
    assert latex(at) == engine.to_latex(engine.preset("mgu").cell)


def test_tampered_payloads_name_the_node(designer):
    at = designer
    schema = lstm_canvas()
    const = add_block(schema, "const", 1)
    next(o for o in const["options"] if o["name"] == "value")["value"] = float("nan")
    next(o for o in schema["nodes"][5]["options"] if o["name"] == "name")["value"] = ""
    schema["nodes"].append({**schema["nodes"][6], "id": "evil", "type": "rm -rf", "label": "evil"})
    send(at, schema)
    errors = texts(at.error)
    assert "node 'evil', field 'type': unknown block type 'rm -rf'" in errors
    assert f"node '{schema['nodes'][5]['label']}', field 'name': the name is empty" in errors


def test_save_and_open_designs_in_the_folder(designer, designs):
    at = designer
    at.text_input(key="designer.save_name").set_value("../escape").run()
    at.button(key="designer.save").click().run()
    assert "field 'Save as'" in texts(at.error)
    at.text_input(key="designer.save_name").set_value("first").run()
    at.button(key="designer.save").click().run()
    assert (designs / "first.json").exists()
    at.selectbox(key="designer.preset").set_value("indrnn").run()
    at.button(key="designer.load_preset").click().run()
    at.selectbox(key="designer.saved").set_value("first").run()
    at.button(key="designer.open_saved").click().run()
    assert "Opened the saved design 'first'" in texts(at.success)
    assert latex(at) == engine.to_latex(engine.preset("lstm").cell)


def test_duplicate_and_delete_saved_designs(designer, designs):
    at = designer
    at.text_input(key="designer.save_name").set_value("mine").run()
    at.button(key="designer.save").click().run()
    at.selectbox(key="designer.saved").set_value("mine").run()
    at.button(key="designer.duplicate_saved").click().run()
    assert "Saved a copy of 'mine' as 'mine-copy'" in texts(at.success)
    at.selectbox(key="designer.saved").set_value("mine").run()
    at.button(key="designer.duplicate_saved").click().run()
    assert at.selectbox(key="designer.saved").options == ["mine", "mine-copy", "mine-copy2"]
    assert json.loads((designs / "mine-copy2.json").read_text()) == json.loads((designs / "mine.json").read_text())
    at.selectbox(key="designer.saved").set_value("mine-copy").run()
    at.button(key="designer.delete_saved").click().run()
    assert "Deleted 'mine-copy' from the list" in texts(at.success)
    assert at.selectbox(key="designer.saved").options == ["mine", "mine-copy2"]
    (kept,) = (designs / ".deleted").glob("mine-copy-*.json")              # moved aside, not destroyed
    assert json.loads(kept.read_text())["name"] == "lstm"


def test_a_corrupt_saved_design_is_reported_with_its_path_and_never_overwritten(designer, designs):
    at = designer
    designs.mkdir(parents=True, exist_ok=True)
    (designs / "broken.json").write_text('{"nodes": [')
    at.run()                                                                 # the list now shows it
    at.selectbox(key="designer.saved").set_value("broken").run()
    at.button(key="designer.open_saved").click().run()
    assert f"{designs / 'broken.json'} is not a valid cell" in texts(at.error)
    assert at.text_input(key="designer.name").value == "lstm"                # the current design is kept
    at.text_input(key="designer.save_name").set_value("broken").run()
    at.button(key="designer.save").click().run()
    assert "is not overwritten" in texts(at.error) and str(designs / "broken.json") in texts(at.error)
    assert (designs / "broken.json").read_text() == '{"nodes": ['


def test_the_working_design_comes_back_with_its_url(designs):
    design = engine.to_dict(engine.preset("gru").cell)
    design["nodes"].append({"name": "half_done", "op": "tanh", "args": [""]})
    (designs / "sessions").mkdir(parents=True)
    (designs / "sessions" / f"{TOKEN}.json").write_text(json.dumps(design))
    at = session_with(TOKEN)                             # a reload: the URL still says ?design=<TOKEN>
    assert "node 'half_done', field 'args.x': port 'x' is not connected" in texts(at.error)
    assert "unknown node ''" not in texts(at.error)
    assert at.text_input(key="designer.name").value == "gru"


def test_two_sessions_keep_their_own_working_designs(designs):
    first = session_with()
    first.selectbox(key="designer.preset").set_value("gru").run()
    first.button(key="designer.load_preset").click().run()
    assert first.text_input(key="designer.name").value == "gru"
    second = session_with()                              # another user: a URL without the first one's id
    assert second.text_input(key="designer.name").value == "lstm"
    second.selectbox(key="designer.preset").set_value("mgu").run()
    second.button(key="designer.load_preset").click().run()
    files = sorted((designs / "sessions").glob("*.json"))
    assert len(files) == 2, files
    assert sorted(json.loads(f.read_text())["name"] for f in files) == ["gru", "mgu"]
    for path in files:                                   # each comes back with its own id
        assert session_with(path.stem).text_input(key="designer.name").value == json.loads(path.read_text())["name"]


def test_the_url_keeps_the_design_id_on_every_page(tmp_path, monkeypatch):
    monkeypatch.setenv("RNN_DESIGNS_DIR", str(tmp_path / "designs"))
    main = Path(__file__).resolve().parents[2] / "app" / "main.py"
    at = AppTest.from_file(str(main), default_timeout=60).run()
    token = at.session_state["state.token"]
    assert at.query_params["design"] in (token, [token])
    at.query_params.pop("design")                         # as a page switch in the browser may do
    at.switch_page("views/schedule.py").run()
    assert at.query_params["design"] in (token, [token]) and not at.exception


def test_a_link_with_a_foreign_design_id_starts_a_new_design(designs):
    at = session_with("../../etc/passwd")
    assert "is not one this app makes" in texts(at.warning)
    assert at.text_input(key="designer.name").value == "lstm"
    assert not (designs.parent / "etc").exists()


def test_two_size_edits_in_a_row_both_stick(designer):
    at = designer
    at.text_input(key="designer.hidden_size").set_value(str(12)).run()
    at.text_input(key="designer.input_size").set_value(str(5)).run()       # was reset to the old 64 before
    assert at.text_input(key="designer.input_size").value == "5"
    assert at.text_input(key="designer.hidden_size").value == "12"
    assert {k: at.session_state["state.sizes"][k] for k in ("input_size", "hidden_size")} == \
        {"input_size": 5, "hidden_size": 12}


def test_the_sample_run_is_a_real_reference_run_of_the_current_cell(designer):
    at = designer
    at.text_input(key="designer.hidden_size").set_value(str(12)).run()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["outputs (T, B, H)"] == "3 x 2 x 12"
    sizes = at.session_state["state.sizes"]                             # the plan's sizes, which the run uses
    assert f"shape (3, 2, {sizes['input_size']}) (T, B, I)" in "\n".join(c.value for c in at.caption)
    cell = engine.from_json(at.session_state["state.store"]["design"])          # the designer's own copy of the LSTM
    network = engine.Network(cell, sizes["input_size"], 12, sizes["num_layers"])
    params = engine.init_params(network, seed=0)
    x = np.random.default_rng(1).standard_normal((3, 2, sizes["input_size"]))
    want = engine.run(network, params, x, backend="reference", dtype=np.float64)
    assert metrics["largest |output|"] == f"{np.abs(want.outputs).max():.4g}"
    shown = next(c.value for c in at.code if c.value.startswith("outputs[-1, 0, :6]"))
    assert shown == "outputs[-1, 0, :6] = [" + ", ".join(f"{v:.6g}" for v in want.outputs[-1, 0, :6]) + "]"
    states = next(d.value for d in at.dataframe if "final state" in d.value.columns)
    assert sorted(states["final state"]) == ["c", "h"]
    assert set(states["shape (L, B, size)"]) == {f"{sizes['num_layers']} x 2 x 12"}


def test_the_plan_lists_gemms_and_kernels_and_colours_the_graph(designer):
    explain = pytest.importorskip("engine.explain", reason="engine.explain is not part of this engine yet")
    at = designer
    sizes = {"input_size": 64, "hidden_size": 256, "num_layers": 2, "steps": 50, "batch": 16}
    plan = explain.explain_json(engine.preset("lstm").cell, **sizes)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["grouped GEMMs"] == str(len(plan["gemms"]))
    assert metrics["fused kernels"] == str(len(plan["kernels"]))
    gemms = next(d.value for d in at.dataframe if "GEMM" in d.value.columns)
    assert list(gemms["GEMM"]) == [g["name"] for g in plan["gemms"]]
    assert "W_ii_x" in gemms["matmuls"].iloc[0]
    kernels = next(d.value for d in at.dataframe if "kernel" in d.value.columns)
    assert list(kernels["nodes"]) == [", ".join(k["nodes"]) for k in plan["kernels"]]
    chart = next(c for c in at.get("plotly_chart") if c.proto.id.endswith("designer.plan_figure"))
    traces = json.loads(chart.proto.spec)["data"]
    grouped = {t["name"] for t in traces if t.get("customdata")}
    assert set(plan["node_groups"].values()) <= grouped


def test_plan_not_available_without_engine_explain(designer, monkeypatch):
    monkeypatch.setitem(sys.modules, "engine.explain", None)     # import engine.explain now fails
    st.cache_data.clear()
    at = designer
    at.text_input(key="designer.batch").set_value(str(3)).run()
    assert not at.exception
    assert any("plan not available yet" in i.value for i in at.info)


def test_bad_sizes_name_the_field(designer):
    at = designer
    at.text_input(key="designer.hidden_size").set_value(str(0)).run()
    assert "hidden_size: must be at least 1" in texts(at.error)


def test_an_unreadable_working_design_is_reported_kept_aside_and_the_lstm_loaded(designs):
    sessions = designs / "sessions"
    sessions.mkdir(parents=True)
    (sessions / f"{TOKEN}.json").write_text('{"nodes": [')
    at = session_with(TOKEN)
    warning = texts(at.warning)
    assert "could not be read" in warning and "started from the LSTM preset" in warning
    (kept,) = sessions.glob(f"{TOKEN}.json.corrupt-*")
    assert str(kept) in warning and kept.read_text() == '{"nodes": ['         # never overwritten
    assert latex(at) == engine.to_latex(engine.preset("lstm").cell)
    at.selectbox(key="designer.preset").set_value("gru").run()
    at.button(key="designer.load_preset").click().run()
    assert json.loads((sessions / f"{TOKEN}.json").read_text())["name"] == "gru"     # written atomically
    assert not list(sessions.glob("*.tmp")) and not texts(at.warning).count("could not be read")


def test_a_cell_the_dsl_cannot_write_is_an_error_not_a_traceback(designer):
    at = designer
    design = engine.to_dict(engine.preset("elman_tanh").cell)
    schema, _ = adapter.design_to_schema(design)
    source = next(n for n in schema["nodes"] if n["type"] == "input")
    next(o for o in source["options"] if o["name"] == "name")["value"] = "lambda"    # valid IR, a Python keyword
    send(at, schema)
    assert not at.exception
    assert "cannot be written in the DSL" in texts(at.error) and "node 'lambda'" in texts(at.error)
    assert r"\lambda" in latex(at) or "lambda" in latex(at)


def test_a_cell_built_from_building_blocks_runs_and_the_toggle_draws_its_primitives(designer):
    at = designer
    from test_adapter import gru_cho_from_building_blocks
    schema, _ = gru_cho_from_building_blocks()
    send(at, schema)
    assert not at.error, texts(at.error)
    assert r"r &= \sigma(r_{sum} + b_{r})" in latex(at) and "W_n" in at.code[0].value   # primitives in the cell
    at.button(key="designer.redraw").click().run()           # drawn from the cell: composites found again
    drawn = at.session_state["designer.canvas"]["schema"]["nodes"]
    assert sorted(n["type"] for n in drawn if n["type"] in palette.COMPOSITE_TYPES) == ["candidate", "gate", "gate",
                                                                                       "lerp"]
    at.toggle(key="designer.building_blocks").set_value(False).run()
    drawn = at.session_state["designer.canvas"]["schema"]["nodes"]
    assert not {n["type"] for n in drawn} & palette.COMPOSITE_TYPES and len(drawn) > 30
    assert not at.error, texts(at.error)


def test_input_is_hidden_is_a_cell_setting_the_canvas_keeps(designer, designs):
    at = designer
    schema = lstm_canvas()
    add = add_block(schema, "add", 7)
    for port, source in (("a", "x"), ("b", "h")):
        schema["connections"].append({"id": f"edge__x{port}", "outputNode": node_id(schema, source),
                                      "outputNodeInterface": "value", "inputNode": add["id"],
                                      "inputNodeInterface": port})
    send(at, schema)
    assert "shape mismatch in 'add'" in texts(at.error) and "input_is_hidden" in texts(at.error)
    at.checkbox(key="designer.input_is_hidden").check().run()
    assert "shape mismatch" not in texts(at.error), texts(at.error)
    assert "node 'add_7': value is computed but never used" in texts(at.warning)
    assert json.loads(working_file(designs).read_text())["input_is_hidden"] is True
    squash = add_block(schema, "tanh", 8)                      # another canvas edit: the setting stays
    schema["connections"].append({"id": "edge__squash", "outputNode": add["id"], "outputNodeInterface": "value",
                                  "inputNode": squash["id"], "inputNodeInterface": "x"})
    send(at, schema)
    saved = json.loads(working_file(designs).read_text())
    assert saved["input_is_hidden"] is True and any(n["name"] == "tanh_8" for n in saved["nodes"])
    assert "shape mismatch" not in texts(at.error), texts(at.error)


def test_a_new_empty_cell_is_built_from_building_blocks_and_undo_brings_the_old_design_back(designer):
    """The from-scratch journey of the browser test, through the read-back: New empty cell draws x, h and h's
    next value; a gate, a candidate and a lerp and eight wires make it a cell."""
    at = designer
    at.button(key="designer.new").click().run()
    assert not at.exception and "Started an empty cell" in texts(at.success)
    assert at.text_input(key="designer.name").value == "my_cell"
    assert "state 'h' has no next value yet" in texts(at.error)
    schema = copy.deepcopy(at.session_state["designer.canvas"]["schema"])
    assert sorted(n["label"].removeprefix(adapter.WARNING_MARK) for n in schema["nodes"]) == [
        "h at t", "h · state", "x · input"]
    seeded = {n["type"]: n for n in schema["nodes"]}
    blocks = {t: add_block(schema, t, i) for i, t in enumerate(["gate", "candidate", "lerp"], start=1)}
    blocks.update(seeded)
    wires = [("input", "gate", "x"), ("state", "gate", "h"), ("input", "candidate", "x"), ("state", "candidate", "h"),
             ("gate", "lerp", "z"), ("state", "lerp", "a"), ("candidate", "lerp", "b"),
             ("lerp", palette.NEXT_STATE, palette.NEXT_PORT)]
    for number, (source, target, port) in enumerate(wires):
        schema["connections"].append({"id": f"edge__{number}", "outputNode": blocks[source]["id"],
                                      "outputNodeInterface": "value", "inputNode": blocks[target]["id"],
                                      "inputNodeInterface": port})
    send(at, schema)
    assert not at.error, texts(at.error)
    assert "my_cell" in texts(at.success)
    code = at.code[0].value
    assert "def my_cell(x, h):" in code and "gate_1 = sigmoid(" in code and "lerp_3 = " in code, code
    at.button(key="designer.undo").click().run()
    at.button(key="designer.undo").click().run()
    assert latex(at) == engine.to_latex(engine.preset("lstm").cell)


def test_an_edit_that_makes_a_problem_marks_its_block_in_place_and_fixing_it_clears_the_mark(designer):
    """No redraw for an edit: the canvas keeps its revision (the component keeps its own state) and gets marks by
    block id, which the component draws on the blocks."""
    at = designer
    first = at.session_state["designer.canvas"]
    assert first["marks"] == {}
    schema = lstm_canvas()
    relu = add_block(schema, "relu", 1)
    send(at, schema)
    canvas = at.session_state["designer.canvas"]
    assert canvas["revision"] == first["revision"]
    assert canvas["marks"] == {relu["id"]: "port 'x' is not connected (field 'args.x')"}
    assert "port 'x' is not connected" in texts(at.error)

    schema["connections"].append({"id": "edge__fix", "outputNode": node_id(schema, "g"), "outputNodeInterface": "value",
                                  "inputNode": relu["id"], "inputNodeInterface": "x"})
    send(at, schema)
    canvas = at.session_state["designer.canvas"]
    assert canvas["marks"] == {} and canvas["revision"] == first["revision"] and not at.error, texts(at.error)


def test_a_missing_next_value_marks_the_next_state_block_once(designer):
    at = designer
    at.button(key="designer.new").click().run()
    canvas = at.session_state["designer.canvas"]
    sink = next(n["id"] for n in canvas["schema"]["nodes"] if n["type"] == palette.NEXT_STATE)
    assert canvas["marks"] == {sink: "state 'h' has no next value yet (field 'states.next')"}
    schema = copy.deepcopy(canvas["schema"])
    add_block(schema, "relu", 1)                              # an edit: the canvas is read back, said once
    send(at, schema)
    canvas = at.session_state["designer.canvas"]
    assert canvas["marks"][sink] == "port 'next' is not connected (field 'args.next')"
    assert texts(at.error).count("port 'next' is not connected") == 1 and "no next value yet" not in texts(at.error)


def test_a_cell_with_a_projected_state_opens_validates_plans_and_runs(designer):
    from test_projection import lstm_proj
    at = designer
    text = engine.to_json(lstm_proj()).encode()
    at.file_uploader(key="designer.upload").set_value(("lstm_proj.json", text, "application/json")).run()
    assert not at.exception and not at.error, texts(at.error)
    assert "lstm_proj" in texts(at.success) and "state_dims" in at.code[0].value
    drawn = {n["label"]: n for n in at.session_state["designer.canvas"]["schema"]["nodes"]}
    assert {o["name"]: o["value"] for o in drawn["h · state"]["options"]}["dim"] == "P"
    assert any(m.label == "outputs (T, B, P)" and m.value == "3 x 2 x 128" for m in at.metric)   # P = 128
    at.text_input(key="designer.proj_size").set_value(str(5)).run()         # the plan's sizes: P too
    assert not at.exception and not at.error, texts(at.error)
    assert any(m.label == "outputs (T, B, P)" and m.value == "3 x 2 x 5" for m in at.metric)


def test_blocks_keep_their_places_through_undo_and_a_new_design_is_laid_out_afresh(designer):
    at = designer
    auto = {n["label"]: n["position"] for n in at.session_state["designer.canvas"]["schema"]["nodes"]}
    schema = lstm_canvas()
    g = next(n for n in schema["nodes"] if n["id"] == node_id(schema, "g"))
    g["position"] = {"x": 901.0, "y": -17.0}                 # the researcher moved g, then added a block
    add_block(schema, "relu", 1)
    send(at, schema)
    at.button(key="designer.undo").click().run()             # back to the LSTM: drawn again, g where it was put
    drawn = {n["label"]: n["position"] for n in at.session_state["designer.canvas"]["schema"]["nodes"]}
    assert drawn["g · tanh"] == {"x": 901.0, "y": -17.0} and drawn["i · sigmoid"] == auto["i · sigmoid"]
    at.button(key="designer.redraw").click().run()           # "Redraw": the automatic layout again
    drawn = {n["label"]: n["position"] for n in at.session_state["designer.canvas"]["schema"]["nodes"]}
    assert drawn["g · tanh"] == auto["g · tanh"]
    send(at, schema)
    at.selectbox(key="designer.preset").set_value("gru").run()
    at.button(key="designer.load_preset").click().run()      # another design: nothing carried over
    gru = engine.to_dict(engine.preset("gru").cell)
    fresh, _ = adapter.design_to_schema(gru)
    assert [n["position"] for n in at.session_state["designer.canvas"]["schema"]["nodes"]] == [
        n["position"] for n in fresh["nodes"]]


def test_undo_and_redo_from_the_canvas_keys(designer):
    """The canvas sends {"command": "undo"} for Ctrl+Z (and "redo" for Ctrl+Shift+Z / Ctrl+Y), once per keypress."""
    at = designer
    schema = lstm_canvas()
    add_block(schema, "relu", 1)
    send(at, schema)
    assert "relu_1" in texts(at.error)
    revision = at.session_state["designer.canvas"]["revision"]
    edit = at.session_state["designer.canvas"]["edit"]
    at.session_state["designer.editor"] = {"revision": revision, "edit": edit + 1, "command": "undo"}
    at.run()
    assert not at.error and latex(at) == engine.to_latex(engine.preset("lstm").cell)
    at.run()                                                  # the same value again: not a second undo
    assert at.button(key="designer.undo").disabled
    canvas = at.session_state["designer.canvas"]
    at.session_state["designer.editor"] = {"revision": canvas["revision"], "edit": canvas["edit"] + 1,
                                           "command": "redo"}
    at.run()
    assert "relu_1" in texts(at.error)


# ---- the designer's traps ----------------------------------------------------------------------------

def rename(schema: dict, block_id: str, field: str, value: str) -> dict:
    node = next(n for n in schema["nodes"] if n["id"] == block_id)
    node["options"] = [o for o in node["options"] if o["name"] != field] + [{"name": field, "value": value}]
    return schema


@pytest.mark.parametrize("preset,old,new,by", [("gru", "h", "s", "state"), ("lstm", "c", "cell_c", "state"),
                                              ("lstm", "c", "cell_c", "next state"), ("lstm", "x", "u", "input")])
def test_a_rename_on_the_canvas_carries_through_and_is_drawn_at_once(designs, preset, old, new, by):
    """Renaming a state (its block, or its next-value block's field), or any other node, keeps the cell valid: the
    next-value block, the output and the wires follow, and the canvas is drawn again with the new labels."""
    at = AppTest.from_file(str(PAGE), default_timeout=60)
    at.run()
    at.selectbox(key="designer.preset").set_value(preset)
    at.button(key="designer.load_preset").click().run()
    canvas = at.session_state["designer.canvas"]
    schema = copy.deepcopy(canvas["schema"])
    block = canvas["ids"][adapter.sink_key(old) if by == "next state" else old]
    send(at, rename(schema, block, "state" if by == "next state" else "name", new))
    assert not at.error, texts(at.error)
    design = json.loads(at.session_state["state.store"]["design"])
    cell = engine.from_dict(design)
    want = engine.to_dict(engine.preset(preset).cell)
    assert len(cell.nodes) == len(want["nodes"]) and new in {n.name for n in cell.nodes}
    if by != "input":
        assert new in cell.state_names and old not in cell.state_names
    labels = [n["label"] for n in at.session_state["designer.canvas"]["schema"]["nodes"]]
    assert at.session_state["designer.canvas"]["revision"] > canvas["revision"]       # drawn afresh: new labels
    assert any(label.startswith(f"{new} · ") for label in labels) and not any(
        label.startswith(f"{old} · ") for label in labels)
    if by != "input":
        assert f"{new} at t" in labels


def test_an_edit_is_taken_and_applied_as_one_step(designer):
    """The canvas's value is marked as taken only together with the design change it brings: the canvas state
    and the design's state change with no st.session_state access in between (a rerun cannot land inside)."""
    body = PAGE.read_text().split("def take_canvas_edit(")[1].split("\ndef ")[0]
    after = body.split("# ---- no st.session_state access below this line")[1]
    assert "st.session_state" not in after and "state." not in after.replace("change.", "")


def test_the_sample_run_refuses_a_size_too_big_and_the_files_tab_stays(designer):
    at = designer
    at.text_input(key="designer.hidden_size").set_value("65536").run()
    assert not at.exception
    refusal = next(e.value for e in at.error if "the sample run" in e.value)
    assert "more than the limit of" in refusal and "GiB (parameters" in refusal
    assert at.button(key="designer.save") is not None and at.text_input(key="designer.save_name") is not None


def test_a_bad_size_is_refused_whole_and_kept_across_a_page_change(designs):
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app" / "main.py"), default_timeout=60)
    at.run()
    for typed in ("abc", "12abc", "2.5", "-3"):
        at.text_input(key="designer.hidden_size").set_value(typed).run()
        assert at.session_state["state.sizes"].get("hidden_size", 256) == 256      # never 0, 12 or 2
        assert any(e.value.startswith("hidden_size:") and repr(typed) in e.value or
                   e.value.startswith("hidden_size: must be at least 1") for e in at.error), texts(at.error)
    assert any("this sample run is for the previous sizes" in w.value for w in at.warning)
    at.switch_page("views/schedule.py").run()
    at.switch_page("views/designer.py").run()
    assert at.text_input(key="designer.hidden_size").value == "-3"
    assert any(e.value.startswith("hidden_size:") for e in at.error)


def test_save_is_a_callback_and_a_fresh_visit_offers_the_last_design(designer, designs):
    at = designer
    at.selectbox(key="designer.preset").set_value("gru")
    at.button(key="designer.load_preset").click().run()
    at.text_input(key="designer.save_name").set_value("my_gru")
    at.button(key="designer.save").click().run()
    assert (designs / "my_gru.json").exists() and "Saved" in texts(at.success)
    fresh = session_with()                                      # the app's address without ?design=
    assert fresh.text_input(key="designer.name").value == "lstm"
    fresh.button(key="designer.reopen").click().run()
    assert fresh.text_input(key="designer.name").value == "gru"
    assert "Reopened the last design 'gru'" in texts(fresh.success)


def test_a_wire_the_canvas_refused_is_said_in_words(designer):
    at = designer
    canvas = at.session_state["designer.canvas"]
    block = canvas["ids"]["g"]
    at.session_state["designer.editor"] = {"revision": canvas["revision"], "edit": canvas["edit"] + 1,
                                           "refused": {"block": block, "port": "x"}}
    at.run()
    assert "node 'g': a wire from 'g' to its own port 'x' is refused" in texts(at.warning)
    assert "lstm" in texts(at.success)                           # the design is unchanged
