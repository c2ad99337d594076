"""Every page of the app (except the Designer, tested with its own code) run through Streamlit's AppTest.

These run on the CPU without a GPU: widgets work, bad sizes become messages that name the field, and
no page raises.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path

import pytest

import engine
from engine.schedule import wavefront

PAGES = {"gallery": "Gallery", "schedule": "Schedule", "benchmarks": "Benchmarks", "divergence": "Divergence",
         "export": "Export", "networks": "Networks"}


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def chart_spec(at, key: str) -> dict:
    """The plotly JSON of the chart with this key."""
    for chart in at.get("plotly_chart"):
        if chart.proto.id.endswith(key):
            return json.loads(chart.proto.spec)
    raise AssertionError(f"no plotly chart with key {key!r}")


def chart_keys(at) -> list[str]:
    return [chart.proto.id.rsplit("-", 1)[-1] for chart in at.get("plotly_chart")]


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


@pytest.mark.parametrize("name", PAGES)
def test_page_runs_without_exception(open_page, name):
    at = open_page(name)
    assert [t.value for t in at.title] == [PAGES[name]]
    assert not at.error, texts(at.error)


def test_sidebar_says_whether_a_gpu_is_available(app):
    ok, reason = engine.backends.gpu_status()
    sidebar = texts(app.sidebar.info) + texts(app.sidebar.success) + texts(app.sidebar.caption)
    assert ("GPU available" in sidebar) == ok
    assert reason in sidebar


# ---- Gallery --------------------------------------------------------------------------------------

def test_gallery_has_a_card_per_preset(open_page):
    at = open_page("gallery")
    presets = engine.presets()
    open_keys = sorted(b.key for b in at.button if b.key.startswith("gallery.open."))
    assert open_keys == sorted(f"gallery.open.{name}" for name in presets)
    assert len(at.latex) == len(presets)
    assert sorted(k for k in chart_keys(at) if k.startswith("gallery.graph.")) == sorted(
        f"gallery.graph.{name}" for name in presets)
    # the picture of each cell has one marker per node of its graph
    lstm = presets["lstm"].cell
    markers = sum(len(t["x"]) for t in chart_spec(at, "gallery.graph.lstm")["data"] if t["mode"].startswith("markers"))
    assert markers == lstm.nx.number_of_nodes()
    cudnn_cards = sum("cuDNN mode" in m.value for m in at.markdown)
    assert cudnn_cards == sum(1 for p in presets.values() if p.cudnn)


def test_gallery_cards_show_every_presets_family_and_citation(open_page):
    at = open_page("gallery")
    presets = engine.presets()
    captions = [c.value for c in at.caption]
    for name, preset in presets.items():
        assert preset.citation in captions, name
        assert f"`{name}` · family {preset.family}" in captions
    assert {"xLSTM", "LayerNorm"} <= set(at.multiselect(key="gallery.families").options)
    at.multiselect(key="gallery.families").set_value(["xLSTM", "LayerNorm"]).run()
    assert not at.exception, texts(at.exception)
    shown = {b.key.removeprefix("gallery.open.") for b in at.button if b.key.startswith("gallery.open.")}
    assert shown == {name for name, p in presets.items() if p.family in ("xLSTM", "LayerNorm")}
    assert {"slstm", "ln_lstm", "ln_gru"} <= shown
    assert "xLSTM: Extended Long Short-Term Memory" in presets["slstm"].citation
    assert "Layer Normalization" in presets["ln_lstm"].citation and "Layer Normalization" in presets["ln_gru"].citation


def test_gallery_filters_by_family_and_text(open_page):
    at = open_page("gallery")
    at.multiselect(key="gallery.families").set_value(["GRU"]).run()
    shown = {b.key.removeprefix("gallery.open.") for b in at.button if b.key.startswith("gallery.open.")}
    assert shown == {name for name, p in engine.presets().items() if p.family == "GRU"}
    at.multiselect(key="gallery.families").set_value(sorted({p.family for p in engine.presets().values()})).run()
    at.text_input(key="gallery.search").set_value("no such cell anywhere").run()
    assert not [b for b in at.button if b.key.startswith("gallery.open.")]
    assert "No preset matches" in texts(at.info)


def test_gallery_opens_a_preset_in_the_designer(open_page):
    at = open_page("gallery")
    at.button(key="gallery.open.gru").click().run()
    assert not at.exception, texts(at.exception)
    assert [t.value for t in at.title] == ["Designer"]
    at.switch_page("views/export.py").run()
    cell_json = next(c.value for c in at.code if c.language == "json")
    assert engine.from_json(cell_json) == engine.preset("gru").cell


def test_gallery_benchmark_button_preselects_the_preset(open_page):
    at = open_page("gallery")
    at.button(key="gallery.bench.mgu").click().run()
    assert not at.exception, texts(at.exception)
    assert [t.value for t in at.title] == ["Benchmarks"]
    assert at.multiselect(key="benchmarks.presets").value == ["mgu"]


# ---- sizes forms ----------------------------------------------------------------------------------

ABSURD = [("input_size", 0), ("hidden_size", -3), ("num_layers", 65), ("steps", 65537), ("batch", 0),
          ("hidden_size", 70000)]


@pytest.mark.parametrize("field,value", ABSURD)
def test_schedule_names_the_absurd_size(open_page, field, value):
    at = open_page("schedule")
    at.text_input(key=f"schedule.{field}").set_value(str(value)).run()
    assert not at.exception, texts(at.exception)
    assert len(at.error) == 1 and at.error[0].value.startswith(f"{field}:"), texts(at.error)
    assert "schedule.heatmap" not in chart_keys(at)
    at.text_input(key=f"schedule.{field}").set_value(str(3)).run()        # fixing it brings the page back
    assert not at.error and "schedule.heatmap" in chart_keys(at)


@pytest.mark.parametrize("field,value", [("hidden_size", 0), ("num_layers", 100)])
def test_export_names_the_absurd_size(open_page, field, value):
    at = open_page("export")
    at.text_input(key=f"export.{field}").set_value(str(value)).run()
    assert not at.exception, texts(at.exception)
    assert [e.value.split(":")[0] for e in at.error] == [field]


# ---- Schedule -------------------------------------------------------------------------------------

def test_schedule_heatmap_is_the_engines_wavefront(open_page):
    at = open_page("schedule")
    at.text_input(key="schedule.num_layers").set_value(str(3)).run()
    at.text_input(key="schedule.steps").set_value(str(7)).run()
    heatmap = chart_spec(at, "schedule.heatmap")["data"][0]
    grid = wavefront(3, 7).step_of()
    assert heatmap["z"] == grid
    assert heatmap["text"] == [[str(k) for k in row] for row in grid]


def test_schedule_steps_through_the_wavefront(open_page):
    at = open_page("schedule")
    at.text_input(key="schedule.num_layers").set_value(str(3)).run()
    at.text_input(key="schedule.steps").set_value(str(7)).run()
    at.slider(key="schedule.wave_step").set_value(4).run()
    rings = chart_spec(at, "schedule.heatmap")["data"][1]
    assert sorted(zip(rings["y"], rings["x"])) == [(0, 4), (1, 3), (2, 2)]      # layer l at t = 4 - l
    assert "Wavefront step 4 runs layer 0 at t=4, layer 1 at t=3, layer 2 at t=2 together" in texts(at.caption)
    at.text_input(key="schedule.steps").set_value(str(2)).run()                 # 4 wavefront steps now: clamped
    assert at.slider(key="schedule.wave_step").value == 3 and not at.exception
    rings = chart_spec(at, "schedule.heatmap")["data"][1]
    assert sorted(zip(rings["y"], rings["x"])) == [(2, 1)]


def test_schedule_long_sequences_show_a_window(open_page):
    at = open_page("schedule")
    at.text_input(key="schedule.steps").set_value(str(5000)).run()
    heatmap = chart_spec(at, "schedule.heatmap")["data"][0]
    assert 0 < len(heatmap["z"][0]) < 5000
    assert "of 5000" in texts(at.caption)


def test_schedule_refuses_a_plan_too_big_to_build_in_a_page(open_page):
    at = open_page("schedule")
    at.text_input(key="schedule.num_layers").set_value(str(64)).run()
    at.text_input(key="schedule.steps").set_value(str(65536)).run()      # each within its own limit
    assert not at.exception
    assert [e.value.split(":")[0] for e in at.error] == ["steps"]
    assert "layer-steps" in at.error[0].value
    assert "schedule.heatmap" in chart_keys(at) and "schedule.stages" not in chart_keys(at)


def test_schedule_shows_the_plan_or_says_it_is_missing(open_page):
    at = open_page("schedule")
    metrics = {m.label: m.value for m in at.metric}
    if not has_module("engine.explain"):
        assert "plan is not available" in texts(at.info)
        assert "launches per step" not in metrics
        return
    from engine.explain import explain_json
    sizes = {k: int(at.text_input(key=f"schedule.{k}").value) for k in
             ("input_size", "hidden_size", "num_layers", "steps", "batch")}
    plan = explain_json(engine.from_json(next(c.value for c in _export_json(at))), **sizes)
    assert metrics["launches per step"] == str(plan["launches_per_step"])
    assert "schedule.stages" in chart_keys(at)
    table = at.dataframe[0].value                # the stage table; the per-layer costs follow
    assert len(table) == sum(len(g.get("shapes") or [g]) for g in plan["gemms"]) + len(plan["kernels"])
    assert set(table["name"]) == {g["name"] for g in plan["gemms"]} | {k["name"] for k in plan["kernels"]}


def _export_json(at):
    """The current design's JSON, read from the Export page (then back to where we were)."""
    at.switch_page("views/export.py").run()
    codes = [c for c in at.code if c.language == "json"]
    at.switch_page("views/schedule.py").run()
    return codes


def test_schedule_timeline_needs_a_gpu(open_page):
    at = open_page("schedule")
    ok, _ = engine.backends.gpu_status()
    if ok:
        pytest.skip("this machine has a GPU; the message is for machines without one")
    assert "Live timelines need a GPU" in texts(at.info)


# ---- Schedule: the GPU schedules -------------------------------------------------------------------

MAIN = Path(__file__).resolve().parents[2] / "app" / "main.py"


@pytest.fixture
def autotune_cache(tmp_path, monkeypatch):
    """An autotune cache of the test's own, empty until the test writes to it."""
    path = tmp_path / "autotune"
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(path))
    return path


def _sizes(at) -> dict:
    return {k: int(at.text_input(key=f"schedule.{k}").value) for k in
            ("input_size", "hidden_size", "num_layers", "steps", "batch")}


def _schedules(cell, sizes) -> dict:
    from engine.explain import explain_json
    return explain_json(cell, **sizes)["schedules"]


def test_schedule_draws_the_persistent_blocks_by_default(open_page, autotune_cache):
    at = open_page("schedule")
    assert at.radio(key="schedule.choice").value == "persistent"
    report = _schedules(engine.preset("lstm").cell, _sizes(at))
    entry = report["persistent"]
    tiling = entry["tiling"]
    (bars,) = chart_spec(at, "schedule.blocks")["data"]
    assert bars["y"] == [f"layer {layer}" for layer, _, _ in tiling["blocks_owned"]]
    assert bars["base"] == [first for _, first, _ in tiling["blocks_owned"]]
    assert bars["x"] == [units for _, _, units in tiling["blocks_owned"]]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["host launches per sequence"] == "1" and metrics["kernel launches per sequence"] == "1"
    assert metrics["barriers per sequence"] == str(entry["barriers_per_sequence"])
    assert metrics["thread blocks"] == str(tiling["blocks"])
    assert metrics["shared memory per block"] == f"{tiling['smem_bytes'] / 1024:.1f} KiB"
    smem = next(d.value for d in at.dataframe if "GEMM" in d.value.columns)
    assert list(smem["GEMM"]) == [g["name"] for g in tiling["gemms"]]
    assert list(smem["weights"]) == [g["where"] for g in tiling["gemms"]]
    compare = next(d.value for d in at.dataframe if "schedule" in d.value.columns)
    assert list(compare["schedule"]) == ["fused", "graph", "persistent"]
    assert list(compare["launched as"]) == ["per-step launches", "graph replay", "one persistent kernel"]
    assert "no choice cached" in texts(at.caption)
    registers = [str(c.value) for c in at.caption if str(c.value).startswith("Registers:")]
    assert tiling["carried"] and registers == [f"Registers: {tiling['carried_text']}."]     # the LSTM's c state
    assert not at.error and not at.warning


def test_schedule_selector_switches_what_is_drawn(open_page, autotune_cache):
    at = open_page("schedule")
    report = _schedules(engine.preset("lstm").cell, _sizes(at))
    at.radio(key="schedule.choice").set_value("graph").run()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["kernel launches per sequence"] == str(report["graph"]["kernel_launches_per_sequence"])
    assert metrics["kernel launches per step"] == str(report["graph"]["launches_per_step"])
    assert chart_spec(at, "schedule.blocks")["layout"]["title"]["text"].startswith("graph: ")
    at.toggle(key="schedule.show_source").set_value(True).run()
    cuda = [c.value for c in at.code if c.language == "cpp" and "engine.codegen.wavefront" in c.value]
    assert len(cuda) == 1 and "_wave_s" in cuda[0] and "cooperative_groups" not in cuda[0]
    at.radio(key="schedule.choice").set_value("fused").run()
    assert "schedule.blocks" not in chart_keys(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["host launches per sequence"] == str(report["fused"]["host_launches_per_sequence"])
    assert metrics["barriers per sequence"] == "none"
    assert not at.exception and not at.error


def test_schedule_precision_plans_tensor_core_tiles(open_page, autotune_cache):
    at = open_page("schedule")
    at.text_input(key="schedule.batch").set_value(str(32)).run()          # many rows: the tiled path
    assert at.radio(key="schedule.precision").value == "float32"
    metrics = {m.label: m.value for m in at.metric}
    assert "accumulators per warp" not in metrics and "registers per thread" in metrics
    at.radio(key="schedule.precision").set_value("bfloat16").run()
    from engine.explain import explain_json
    tiling = explain_json(engine.preset("lstm").cell, **_sizes(at), precision="bfloat16")["schedules"]["persistent"][
        "tiling"]
    wm, wn = tiling["warp_tile"]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["accumulators per warp"] == f"{wm * 16} x {wn * 8}"
    assert metrics["shared memory per block"] == f"{tiling['smem_bytes'] / 1024:.1f} KiB"
    assert "tensor-core MMA (bfloat16)" in texts(at.caption)
    at.toggle(key="schedule.show_source").set_value(True).run()
    cuda = [c.value for c in at.code if c.language == "cpp" and "engine.codegen.wavefront" in c.value]
    assert len(cuda) == 1 and "rnn_mma_gemms<RNN_BF16" in cuda[0]
    assert not at.exception and not at.error


def test_schedule_starts_at_the_autotuners_choice(open_page, autotune_cache):
    from app.state import DEFAULT_SIZES
    from engine.schedules.autotune import Choice, TileConfig, cache_key, write_entry
    network = engine.Network(engine.preset("lstm").cell, DEFAULT_SIZES["input_size"], DEFAULT_SIZES["hidden_size"],
                             DEFAULT_SIZES["num_layers"])
    key = cache_key(network, DEFAULT_SIZES["steps"], DEFAULT_SIZES["batch"], "Test GPU")
    write_entry(key, Choice("graph", TileConfig(4), "fastest of 3 (test)", key, [{"candidate": "graph", "ms": 0.1}]))
    at = open_page("schedule")
    choice = at.radio(key="schedule.choice")
    assert choice.value == "graph"
    assert "the autotuner's choice on Test GPU: fastest of 3 (test)" in texts(at.caption)
    assert [e.label for e in at.expander if e.label.startswith("Autotuned")] == [
        f"Autotuned on Test GPU: graph ({TileConfig(4).label()})"]


def test_schedule_says_why_a_cell_cannot_use_the_wavefront_schedules(tmp_path, monkeypatch, autotune_cache):
    from compiler_cells import input_sized
    from streamlit.testing.v1 import AppTest
    token = "0123456789abcdef0123456789abcdef"          # this session's working design: the input_sized cell
    sessions = tmp_path / "designs" / "sessions"
    sessions.mkdir(parents=True)
    (sessions / f"{token}.json").write_text(engine.to_json(input_sized))
    monkeypatch.setenv("RNN_DESIGNS_DIR", str(tmp_path / "designs"))
    at = AppTest.from_file(str(MAIN), default_timeout=60)
    at.query_params["design"] = token
    at.run()
    at.switch_page("views/schedule.py").run()
    assert not at.exception, texts(at.exception)
    assert at.radio(key="schedule.choice").value == "fused"         # nothing else can run it
    assert "the wavefront schedules cannot run this cell" in texts(at.caption)
    at.radio(key="schedule.choice").set_value("persistent").run()
    warning = texts(at.warning)
    assert "The persistent schedule cannot run cell 'input_sized'" in warning and "h_gx_gemm" in warning
    assert "schedule.blocks" not in chart_keys(at) and not at.error
    compare = next(d.value for d in at.dataframe if "schedule" in d.value.columns)
    assert list(compare["can run"]) == ["yes", "no", "no"]


# ---- Export ---------------------------------------------------------------------------------------

def test_export_offers_the_cell_json_and_dsl(open_page):
    at = open_page("export")
    keys = {d.key for d in at.download_button}
    assert "export.cell_json" in keys
    cell = engine.from_json(next(c.value for c in at.code if c.language == "json"))
    if has_module("engine.dsl_emit"):
        from engine.dsl_emit import emit_dsl
        assert "export.dsl" in keys
        assert next(c.value for c in at.code if c.language == "python").strip() == emit_dsl(cell).strip()
    else:
        assert "DSL export is not available" in texts(at.caption)


def test_export_shows_the_generated_cuda(open_page):
    at = open_page("export")
    if not has_module("engine.export"):
        assert "CUDA export is not available" in texts(at.info)
        return
    cuda = [c.value for c in at.code if c.language == "cpp"]
    assert len(cuda) == 1 and "__global__" in cuda[0]
    assert "export.cu" in {d.key for d in at.download_button}


# ---- Divergence -----------------------------------------------------------------------------------

def test_divergence_live_demo_is_a_real_float32_run(open_page):
    at = open_page("divergence")
    at.text_input(key="divergence.steps").set_value(str(30)).run()
    series = {t["name"]: t["y"] for t in chart_spec(at, "divergence.demo")["data"]}
    worst = series["float32 max |error|"]
    mean = series["float32 mean |error|"]
    assert len(worst) == 30
    finite = [e for e in worst if e is not None]
    assert finite and all(0 < e < 1e-3 for e in finite)          # float32 rounding: small, and not zero
    assert all(m is None or w is None or m <= w for m, w in zip(mean, worst))
    assert chart_spec(at, "divergence.demo")["layout"]["yaxis"]["type"] == "log"


def test_divergence_demo_plots_every_precision_mode(open_page):
    at = open_page("divergence")
    at.text_input(key="divergence.steps").set_value(str(20)).run()
    series = {t["name"]: [e for e in t["y"] if e is not None] for t in chart_spec(at, "divergence.demo")["data"]}
    assert set(series) == {f"{p} {s} |error|" for p in ("float32", "tf32", "float16", "bfloat16")
                           for s in ("max", "mean")}
    worst = {p: max(series[f"{p} max |error|"]) for p in ("float32", "tf32", "float16", "bfloat16")}
    # The modes round every matmul operand: far above float32's own rounding; bf16 (7 mantissa bits) the most.
    assert min(worst["tf32"], worst["float16"]) > 10 * worst["float32"]
    assert worst["bfloat16"] > max(worst["tf32"], worst["float16"])
    assert chart_spec(at, "divergence.demo")["layout"]["title"]["text"] == "Error per time step, by precision"
    at.multiselect(key="divergence.precisions").set_value(["bfloat16"]).run()
    names = [t["name"] for t in chart_spec(at, "divergence.demo")["data"]]
    assert names == ["bfloat16 max |error|", "bfloat16 mean |error|"]
    assert not at.exception and not at.error


def test_divergence_seed_draws_a_fresh_input(open_page):
    at = open_page("divergence")
    at.text_input(key="divergence.steps").set_value(str(10)).run()
    before = chart_spec(at, "divergence.demo")["data"][0]["y"]
    at.number_input(key="divergence.seed").set_value(7).run()
    assert chart_spec(at, "divergence.demo")["data"][0]["y"] != before


def test_divergence_demo_limits_name_the_field(open_page):
    at = open_page("divergence")
    at.text_input(key="divergence.steps").set_value(str(100_000)).run()
    assert not at.exception
    assert [e.value.split(":")[0] for e in at.error] == ["steps"]
    assert "divergence.demo" not in chart_keys(at)


# ---- Benchmarks -----------------------------------------------------------------------------------

def bench_available() -> bool:
    if not has_module("engine.bench"):
        return False
    bench = importlib.import_module("engine.bench")   # the package: engine.bench is the api function
    return all(hasattr(bench, name) for name in ("run_bench", "list_results", "load_results"))


def test_benchmarks_without_a_gpu_say_live_runs_need_one(open_page):
    at = open_page("benchmarks")
    if not bench_available():
        assert "not part of this engine" in texts(at.info)
        return
    ok, reason = engine.backends.gpu_status()
    if ok:
        pytest.skip("this machine has a GPU; the message is for machines without one")
    assert f"Live runs need a GPU: {reason}" in texts(at.info)
    assert at.button(key="benchmarks.run").disabled


def test_benchmarks_draw_the_saved_speedups(open_page, saved_results):
    if not bench_available():
        pytest.skip("engine.bench does not export run_bench, list_results and load_results yet")
    at = open_page("benchmarks")
    spec = chart_spec(at, "benchmarks.speedup")
    bars = {trace["name"]: dict(zip(trace["x"], trace["y"])) for trace in spec["data"]}
    assert set(bars) == {"vs naive", "vs torch-eager", "vs cudnn-fp32"}
    for cell in saved_results["cells"]:
        medians = {e["name"]: e["median_ms"] for e in cell["implementations"] if e["status"] == "ok"}
        label = f"{cell['preset']} · {cell['config']['name']}"
        for baseline in ("naive", "torch-eager", "cudnn-fp32"):
            assert bars[f"vs {baseline}"][label] == pytest.approx(medians[baseline] / medians["fused"])
    (line,) = spec["layout"]["shapes"]
    assert line["y0"] == line["y1"] == 1 and line["line"]["dash"] == "dash"
    table = at.dataframe[0].value
    assert len(table) == sum(len(c["implementations"]) for c in saved_results["cells"])
    assert {"benchmarks.csv", "benchmarks.json"} <= {d.key for d in at.download_button}


def test_benchmarks_report_an_unreadable_results_file_and_leave_it(open_page, saved_results, tmp_path):
    broken = tmp_path / "bench-broken.json"
    broken.write_text('{"schema": "not ours"}')
    at = open_page("benchmarks")
    warning = texts(at.warning)
    assert f"Skipped {broken}, left as it is" in warning and "is not a benchmark result" in warning
    assert broken.read_text() == '{"schema": "not ours"}'
    assert not at.exception


def test_benchmarks_baselines_and_implementation_are_chosen(open_page, saved_results):
    if not bench_available():
        pytest.skip("engine.bench does not export run_bench, list_results and load_results yet")
    at = open_page("benchmarks")
    at.selectbox(key="benchmarks.mine").set_value("naive").run()
    at.multiselect(key="benchmarks.baselines").set_value(["cudnn-fp16"]).run()
    (trace,) = chart_spec(at, "benchmarks.speedup")["data"]
    cell = saved_results["cells"][1]
    medians = {e["name"]: e["median_ms"] for e in cell["implementations"] if e["status"] == "ok"}
    assert dict(zip(trace["x"], trace["y"]))["gru · mid"] == pytest.approx(medians["cudnn-fp16"] / medians["naive"])


def test_benchmarks_draw_flashrnn_as_a_baseline(open_page, saved_results):
    """FlashRNN's rows (engine/bench/flashrnn.py) are a baseline like cuDNN's: chosen, its bars are its time over
    the engine's."""
    if not bench_available():
        pytest.skip("engine.bench does not export run_bench, list_results and load_results yet")
    at = open_page("benchmarks")
    assert "flashrnn-bf16" in at.multiselect(key="benchmarks.baselines").options
    at.multiselect(key="benchmarks.baselines").set_value(["flashrnn-bf16"]).run()
    (trace,) = chart_spec(at, "benchmarks.speedup")["data"]
    for cell in saved_results["cells"]:
        medians = {e["name"]: e["median_ms"] for e in cell["implementations"] if e["status"] == "ok"}
        label = f"{cell['preset']} · {cell['config']['name']}"
        assert dict(zip(trace["x"], trace["y"]))[label] == pytest.approx(medians["flashrnn-bf16"] / medians["fused"])


def test_benchmarks_show_each_schedule_as_its_own_row(open_page, saved_results):
    if not bench_available():
        pytest.skip("engine.bench does not export run_bench, list_results and load_results yet")
    at = open_page("benchmarks")
    schedules = ["graph", "persistent", "auto"]
    assert set(schedules) <= set(at.multiselect(key="benchmarks.implementations").options)
    assert set(schedules) <= set(at.multiselect(key="benchmarks.implementations").value)
    table = at.dataframe[0].value
    for cell in saved_results["cells"]:
        label = table[(table["preset"] == cell["preset"]) & (table["config"] == cell["config"]["name"])]
        medians = {e["name"]: e["median_ms"] for e in cell["implementations"] if e["status"] == "ok"}
        for name in schedules:
            (row,) = label[label["implementation"] == name]["median_ms"]
            assert row == pytest.approx(medians[name])
    engine_bars = chart_spec(at, "benchmarks.engine")["data"]
    assert [t["name"] for t in engine_bars] == ["naive", "fused", "graph", "persistent", "auto"]
    assert set(schedules) <= set(at.selectbox(key="benchmarks.mine").options)
    at.selectbox(key="benchmarks.mine").set_value("persistent").run()
    spec = chart_spec(at, "benchmarks.speedup")
    assert spec["layout"]["title"]["text"].startswith("persistent:")


def test_benchmarks_custom_sizes_name_the_absurd_field(open_page):
    if not bench_available():
        pytest.skip("engine.bench does not export run_bench, list_results and load_results yet")
    at = open_page("benchmarks")
    at.toggle(key="benchmarks.custom").set_value(True).run()
    at.text_input(key="benchmarks.batch").set_value(str(0)).run()
    assert not at.exception
    assert [e.value.split(":")[0] for e in at.error] == ["batch"]
    assert at.button(key="benchmarks.run").disabled


def test_divergence_draws_the_saved_error_curves(open_page, saved_results):
    if not bench_available():
        pytest.skip("engine.bench does not export list_results and load_results yet")
    at = open_page("divergence")

    def expected(cell_index, against, stat):
        return {f"{e['name']} ({e['precision']})": e["divergence"][against][stat]
                for e in saved_results["cells"][cell_index]["implementations"] if e.get("divergence")}

    def assert_drawn(curves):
        spec = chart_spec(at, "divergence.results")
        assert spec["layout"]["yaxis"]["type"] == "log"
        drawn = {trace["name"]: trace["y"] for trace in spec["data"]}
        assert set(drawn) == set(curves)
        for name, errors in curves.items():
            assert drawn[name] == pytest.approx(errors), name

    assert_drawn(expected(0, "vs_reference", "max"))
    at.radio(key="divergence.against").set_value("vs_cudnn_fp32").run()
    at.radio(key="divergence.stat").set_value("mean").run()
    at.selectbox(key="divergence.cell").set_value(1).run()
    assert_drawn(expected(1, "vs_cudnn_fp32", "mean"))
    assert "divergence.demo" in chart_keys(at)          # the live demo is still there


def test_benchmarks_show_networks(open_page, tmp_path, monkeypatch):
    """A harness run of `--config deepspeech` only (no cells): the page draws each row's speedup over cuDNN and the
    networks table, and offers deepspeech among the configurations of a live run."""
    from engine.bench import results as results_module
    from engine.bench.configs import NET_ANCHORS
    from engine.nets.io import net_to_dict
    config = NET_ANCHORS["deepspeech"]
    rows = [("cudnn-fp32", 13.1), ("persistent", 8.14), ("fused", 52.6)]
    entries = [{"name": name, "family": "cudnn" if name.startswith("cudnn") else "engine", "precision": "fp32",
                "status": "ok", "reason": None, "tf32": False, "median_ms": ms, "min_ms": ms, "max_ms": ms, "reps": 20,
                "error": {"rel": 4e-7}, "speedup": {"vs_cudnn_fp32": 13.1 / ms}} for name, ms in rows]
    entries.append({"name": "graph", "family": "engine", "precision": "fp32", "status": "unavailable",
                    "reason": "needs a GPU (test)", "tf32": False})
    results = results_module.new_results({"device": "Test GPU"}, {}, {"reps": 20})
    results["nets"] = [{"preset": "lstm", "config": config.to_dict(), "net": net_to_dict(config.build("lstm")),
                        "status": "ok", "reason": None, "implementations": entries}]
    results_module.save_results(results, tmp_path / "bench-nets.json")
    monkeypatch.setattr(results_module, "RESULTS_DIR", tmp_path)
    at = open_page("benchmarks")
    assert "deepspeech (network, 4 layers a block: I=512 H=512 T=100 B=64)" in \
        at.multiselect(key="benchmarks.configs").options
    (trace,) = chart_spec(at, "benchmarks.nets_speedup")["data"]
    bars = dict(zip(trace["x"], trace["y"]))
    assert bars == pytest.approx({"lstm · deepspeech · persistent": 13.1 / 8.14, "lstm · deepspeech · fused": 13.1 / 52.6})
    (frame,) = at.dataframe                          # no cells in this file: the networks table alone
    table = frame.value
    assert list(table["implementation"]) == ["cudnn-fp32", "persistent", "fused", "graph"]
    assert set(table["blocks"]) == {"lstm x4 -> max-pool 2/2 -> lstm x4"}
    assert list(table["status"])[-1] == "unavailable" and "needs a GPU (test)" in list(table["reason"])
    assert "benchmarks.json" in {d.key for d in at.download_button} and not at.exception


def test_benchmarks_show_training_steps(open_page, tmp_path, monkeypatch):
    """A `bench --train` results file: the page draws the engine's speedup over cuDNN per cell and configuration and
    lists every row, a row that was not timed with its reason; a file that is not a training result is skipped."""
    from engine.bench import results as results_module
    from engine.bench.training import SCHEMA, save_results
    row = {"status": "ok", "reason": None, "error": {"x": 4e-7, "params_max": 9e-7, "tolerance": 1e-3}, "reps": 5}
    results = {"schema": SCHEMA, "created": "2026-11-24T20:22:06+00:00", "environment": {"device": "Test GPU"},
               "settings": {"reps": 5, "loss": "sum(outputs * w), w random normal", "precision": "fp32, TF32 off",
                            "tolerance": 1e-3},
               "cells": [{"preset": "lstm", "config": "mid", "sizes": [512, 512, 4, 100, 64], "implementations": [
                   {**row, "name": "cudnn-fp32", "median_ms": 22.9, "speedup_vs_cudnn_fp32": 1.0},
                   {**row, "name": "engine-fused", "median_ms": 30.3, "speedup_vs_cudnn_fp32": 22.9 / 30.3}]},
                   {"preset": "gru_cho", "config": "mid", "sizes": [512, 512, 4, 100, 64], "implementations": [
                       {"name": "cudnn-fp32", "status": "unavailable", "reason": "cell 'gru_cho' has no cuDNN "
                        "equivalent"}, {**row, "name": "engine-fused", "median_ms": 29.7}]}]}
    save_results(results, tmp_path / "train-20261124-202206-Test-GPU.json")
    (tmp_path / "train-broken.json").write_text("{ not json")
    monkeypatch.setattr(results_module, "RESULTS_DIR", tmp_path)
    at = open_page("benchmarks")
    assert at.selectbox(key="benchmarks.train_file").options == ["train-20261124-202206-Test-GPU.json (Test GPU)"]
    (trace,) = chart_spec(at, "benchmarks.train_speedup")["data"]
    assert dict(zip(trace["x"], trace["y"])) == pytest.approx({"lstm · mid · engine-fused": 22.9 / 30.3})
    (frame,) = at.dataframe                          # no harness results in this folder: the training table alone
    table = frame.value
    assert list(table["implementation"]) == ["cudnn-fp32", "engine-fused", "cudnn-fp32", "engine-fused"]
    assert list(table["median ms"])[1] == pytest.approx(30.3)
    assert "cell 'gru_cho' has no cuDNN equivalent" in list(table["reason"])
    assert list(table["max gradient error"])[0] == pytest.approx(9e-7)
    assert not at.exception


def test_divergence_demo_of_a_projected_cell_asks_for_p(app, open_page):
    """LSTMP (states of size P): the demo has a P field and plots every step of the (T, B, P) output."""
    app.selectbox(key="designer.preset").set_value("lstm_proj").run()
    app.button(key="designer.load_preset").click().run()
    at = open_page("divergence")
    at.text_input(key="divergence.steps").set_value(str(12)).run()
    at.text_input(key="divergence.proj_size").set_value(str(5)).run()
    series = {t["name"]: t["y"] for t in chart_spec(at, "divergence.demo")["data"]}
    assert len(series["float32 max |error|"]) == 12
    assert not at.exception and not at.error


@pytest.mark.parametrize("page", ["gallery", "schedule", "export", "benchmarks", "divergence"])
def test_every_page_takes_a_projected_cell(app, open_page, page):
    """LSTMP on every page: what cannot take P (the wavefront schedules, the export) says so; nothing raises."""
    app.selectbox(key="designer.preset").set_value("lstm_proj").run()
    app.button(key="designer.load_preset").click().run()
    at = open_page(page)
    assert not at.exception, [e.value for e in at.exception]


# ---- Networks -------------------------------------------------------------------------------------

def test_networks_plans_the_deepspeech_block_over_two_gpus(open_page):
    """The default: DeepSpeech (4 LSTM 512, max-pool 2, 4 more) at T=100, B=64 on 2 GPUs; the blocks table, the
    metrics and the schedule figure are the planner's own numbers."""
    from engine.multigpu import plan_pipeline
    at = open_page("networks")
    plan = plan_pipeline(engine.net_preset("deepspeech"), 2, 100, 64)
    blocks = at.dataframe[0].value
    assert list(blocks["reads steps"]) == [100, 100, 50] and list(blocks["name"]) == ["rnn_a", "pool", "rnn_b"]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["predicted (ms)"] == f"{plan.predicted_ms:.3g}" and metrics["predicted bubble"] == \
        f"{100 * plan.bubble:.0f}%"
    table = at.dataframe[1].value
    assert list(table["layers"]) == [", ".join(plan.units[u].label for u in g) for g in plan.split]
    traces = chart_spec(at, "networks.pipeline")["data"]
    assert [t["name"] for t in traces] == ["GPU 0", "GPU 1"]
    chunks = -(-100 // plan.chunk)
    assert all(len(t["base"]) == chunks for t in traces)
    assert traces[1]["base"][0] == pytest.approx(plan.stage_us / 1e3)        # GPU 1 starts one stage later
    assert {"networks.net_json", "networks.plan_json"} <= {d.key for d in at.download_button}


def test_networks_takes_a_cell_sizes_and_a_split(open_page):
    at = open_page("networks")
    at.selectbox(key="networks.cell").set_value("gru").run()
    at.number_input(key="networks.deepspeech.layers").set_value(2).run()
    at.text_input(key="networks.split").input("1,3").run()
    assert not at.error, texts(at.error)
    table = at.dataframe[1].value
    assert list(table["layers"]) == ["rnn_a[0]", "rnn_a[1], rnn_b[0], rnn_b[1]"]
    assert "2 gru layers" in texts(at.caption)


@pytest.mark.parametrize("field,value,message", [
    ("networks.split", "3,3", "split [3, 3] places 6 layers, but net 'deepspeech' has 8"),
    ("networks.split", "four", "split: 'four' is not layer counts separated by commas"),
    ("networks.gpus", 9, "net 'deepspeech' has 8 layer(s), so 9 GPUs would leave 1 without work"),
    ("networks.gpus", 0, "gpus: must be at least 1"),
    ("networks.steps", 1, "the pool window 2 is longer than the 1 step"),
])
def test_networks_name_what_is_wrong(open_page, field, value, message):
    at = open_page("networks")
    text = field in ("networks.split", "networks.steps", "networks.batch")       # text fields; steps: a size field
    widget = at.text_input(key=field) if text else at.number_input(key=field)
    (widget.input(str(value)) if text else widget.set_value(value)).run()
    assert message in texts(at.error) and not at.exception


def test_networks_reads_pasted_json(open_page):
    from engine.nets.data import Pool
    from engine.nets.io import net_to_json
    net = engine.Net(16, (engine.Layers("lstm", 8, 2), Pool("mean", 3, 3), engine.Layers("gru", 8, 1)), name="mine")
    at = open_page("networks")
    at.radio(key="networks.source").set_value("JSON").run()
    assert "Paste a network's JSON" in texts(at.info)
    at.text_area(key="networks.json").input(net_to_json(net)).run()
    assert not at.error, texts(at.error)
    assert list(at.dataframe[0].value["reads steps"]) == [100, 100, 33]
    at.text_area(key="networks.json").input('{"schema": "rnn-network", "version": 1}').run()
    assert "Network JSON:" in texts(at.error) and not at.exception


def test_networks_show_the_measured_pipelines(open_page, tmp_path, monkeypatch):
    """benchmarks/results/pipeline-*.json rows (planner and tuned plans) as a table; a file of another format is
    named and left alone."""
    from engine.bench import results as results_module
    row = {"net": "deepspeech", "gpus": 2, "backend": "persistent", "device": "Test GPU", "choice": "tuned",
           "split": [4, 4], "chunk": 34, "ms": 7.0, "measured_bubble": 0.44, "predicted_ms": 6.2,
           "predicted_bubble": 0.4, "one_gpu_best": "persistent", "one_gpu_ms": {"persistent": 7.7},
           "max_rel_diff": 0.0}
    (tmp_path / "pipeline-b.json").write_text(json.dumps([{**row, "replay": True}, {**row, "choice": "planner",
                                                                                    "ms": 8.0, "fuse_pools": True}]))
    (tmp_path / "pipeline-a.json").write_text(json.dumps({"not": "rows"}))
    monkeypatch.setattr(results_module, "RESULTS_DIR", tmp_path)
    at = open_page("networks")
    table = next(f.value for f in at.dataframe if "pipelined (ms)" in f.value.columns)
    assert list(table["plan"]) == ["tuned", "planner"] and list(table["pipelined (ms)"]) == [7.0, 8.0]
    assert list(table["speedup"]) == pytest.approx([1.1, 7.7 / 8.0])
    assert list(table["chunks run"]) == ["replayed", "run by run, pools fused"]      # older rows: run by run
    assert "Skipped pipeline-a.json, left as it is" in texts(at.caption)


def test_benchmarks_lead_with_the_chart_and_fold_what_did_not_run(open_page, saved_results, tmp_path):
    """Cases the run skipped are one folded line after the charts, not a column of warnings before them; the
    implementation picker spells each implementation once."""
    if not bench_available():
        pytest.skip("engine.bench does not export run_bench, list_results and load_results yet")
    from engine.bench.results import save_results
    budget = "the run's time budget was spent"
    for k in range(12):
        saved_results["cells"].append({"preset": "gru", "status": "skipped", "reason": budget, "implementations": [],
                                       "config": {"name": f"case{k}", "input_size": 8, "hidden_size": 16,
                                                  "num_layers": 1, "steps": 4, "batch": 2}})
    save_results(saved_results, tmp_path / "bench-test.json")
    at = open_page("benchmarks")
    assert not at.warning, texts(at.warning)
    assert "benchmarks.speedup" in chart_keys(at)
    assert [e.label for e in at.expander if "skipped" in e.label] == [f"12 cases skipped: {budget}"]
    picker = at.multiselect(key="benchmarks.implementations").options
    assert "torch-compile" in picker and "torch.compile" not in picker


def test_schedule_says_whether_the_scan_takes_the_cell(open_page):
    at = open_page("schedule")
    assert "does not take this cell: node 'W_hi_h' multiplies state 'h' by the matrix 'W_hi'" in texts(at.caption)
    at.switch_page("views/gallery.py").run()
    at.button(key="gallery.open.mingru").click().run()          # a linear recurrence
    at.switch_page("views/schedule.py").run()
    assert not at.exception, texts(at.exception)
    assert "runs this cell as one parallel scan" in texts(at.success)
    assert "a = `h_next_one_minus`, b = `h_next_mul`" in texts(at.success)


def test_schedule_says_what_reductions_and_heads_cost(open_page):
    at = open_page("schedule")
    assert "Reductions and heads" not in texts(at.info)                 # the LSTM has neither
    for name, says in (("ln_lstm", "reduction(s) over H (mean_h) run as GEMMs by a fixed H x H matrix"),
                       ("ln_lstm", "The wavefront schedules run no GEMM for them"),
                       ("ln_lstm", "row sum(s) a step, 3 stage(s) a step"),
                       ("slstm", "weights 'R_i', 'R_f', 'R_z', 'R_o': 4 heads each, multiplied as block-diagonal matrices")):
        at.switch_page("views/gallery.py").run()
        at.button(key=f"gallery.open.{name}").click().run()
        at.switch_page("views/schedule.py").run()
        assert not at.exception, texts(at.exception)
        assert says in texts(at.info), texts(at.info)
