"""The app's figure functions are pure: results in, a plotly Figure out. Checked without Streamlit."""
from __future__ import annotations

import random

import networkx as nx
import pytest

import engine
from app import figures
from engine.schedule import wavefront


@pytest.mark.parametrize("num_layers,steps", [(1, 1), (3, 7), (4, 2), (6, 20)])
def test_heatmap_labels_are_the_wavefront_steps(num_layers, steps):
    grid = wavefront(num_layers, steps).to_dict()["grid"]
    heatmap = figures.wavefront_heatmap(grid).data[0]
    assert [list(row) for row in heatmap.z] == grid
    assert [list(row) for row in heatmap.text] == [[str(k) for k in row] for row in grid]
    assert list(heatmap.y) == list(range(num_layers)) and list(heatmap.x) == list(range(steps))
    # the dependency diagonals: layer l at step t runs in wavefront step l + t
    assert all(int(heatmap.text[l][t]) == l + t for l in range(num_layers) for t in range(steps))


def test_heatmap_window_offsets_the_time_axis():
    grid = wavefront(2, 5).to_dict()["grid"]
    assert list(figures.wavefront_heatmap(grid, first_step=40).data[0].x) == [40, 41, 42, 43, 44]


@pytest.mark.parametrize("name", ["lstm", "gru", "mgu", "peephole_lstm"])
def test_cell_graph_picture_draws_every_node_and_edge_left_to_right(name):
    cell = engine.preset(name).cell
    fig = figures.cell_graph_figure(cell.nx, [(s.name, s.next) for s in cell.states])
    markers = [t for t in fig.data if t.mode.startswith("markers")]
    drawn = {n: (x, y) for t in markers for n, x, y in zip(t.text, t.x, t.y)}
    assert set(drawn) == set(cell.nx.nodes)
    assert sum(len(t.x) for t in markers) == cell.nx.number_of_nodes()
    edges = next(t for t in fig.data if t.name == "edges")
    assert len(edges.x) == 3 * cell.nx.number_of_edges()           # (a, b, gap) per edge
    for a, b in cell.nx.edges:
        assert drawn[a][0] < drawn[b][0], f"edge {a} -> {b} does not flow left to right"
    # every node is coloured by its kind: parameters grey, matmuls red, ...
    for t in markers:
        assert all(figures.node_kind(cell[n].op) == t.name for n in t.text)


def test_cell_graph_picture_of_a_random_dag():
    rng = random.Random(3)
    g = nx.DiGraph()
    for i in range(30):
        g.add_node(f"n{i}", op=rng.choice(["input", "weight", "matmul", "add", "tanh", "state"]))
    for i in range(30):
        for j in range(i + 1, 30):
            if rng.random() < 0.1:
                g.add_edge(f"n{i}", f"n{j}")
    positions = figures.layered_positions(g)
    assert set(positions) == set(g.nodes)
    assert all(positions[a][0] < positions[b][0] for a, b in g.edges)
    assert len(set(positions.values())) == len(positions)             # no two nodes on one spot


def test_speedup_bars_have_a_bar_per_baseline_and_the_dashed_1x_line():
    rows = [{"config": c, "baseline": b, "speedup": s} for c, b, s in
            [("B=1", "naive", 9.0), ("B=1", "PyTorch eager", 5.0), ("B=1", "cuDNN", 1.4),
             ("B=64", "naive", 3.0), ("B=64", "cuDNN", 0.8)]]
    fig = figures.speedup_bars(rows)
    assert [t.name for t in fig.data] == ["vs naive", "vs PyTorch eager", "vs cuDNN"]
    eager = fig.data[1]
    assert list(eager.x) == ["B=1", "B=64"] and list(eager.y) == [5.0, None]     # missing stays missing
    assert list(fig.data[2].y) == [1.4, 0.8]
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert len(lines) == 1 and lines[0].y0 == lines[0].y1 == 1.0 and lines[0].line.dash == "dash"
    assert any("1x" in a.text for a in fig.layout.annotations)


def test_divergence_figure_is_log_scaled_and_leaves_exact_zeros_as_gaps():
    errors = [0.0, 1e-8, 3e-7, float("nan"), 2e-6]
    fig = figures.divergence_figure([{"label": "float32", "errors": errors}])
    assert fig.layout.yaxis.type == "log"
    assert list(fig.data[0].y) == [None, 1e-8, 3e-7, None, 2e-6]
    assert list(fig.data[0].x) == [0, 1, 2, 3, 4]


def test_timeline_bars_start_and_end_where_the_events_do():
    events = [{"name": "hoisted GEMM", "lane": "stream 0", "start_ms": 0.0, "end_ms": 0.5},
              {"name": "step kernel", "lane": "stream 0", "start_ms": 0.5, "end_ms": 0.7},
              {"name": "step kernel", "lane": "stream 1", "start_ms": 0.6, "end_ms": 0.9}]
    fig = figures.timeline_figure(events)
    kernel = next(t for t in fig.data if t.name == "step kernel")
    assert list(kernel.base) == [0.5, 0.6]
    assert [round(w, 9) for w in kernel.x] == [0.2, 0.3]
    assert list(kernel.y) == ["stream 0", "stream 1"]


PLAN = {
    "gemms": [
        {"name": "gemm_x", "stage": "hoisted", "operands": ["x"], "blocks": [{"output": "gates_x"}],
         "m": 64, "n": 1024, "k": 32, "flops": 2 * 64 * 1024 * 32, "per": "sequence"},
        {"name": "gemm_h", "stage": 0, "operands": ["h"], "blocks": [{"output": "gates_h"}],
         "m": 4, "n": 1024, "k": 256, "flops": 2 * 4 * 1024 * 256, "per": "step"},
    ],
    "kernels": [{"name": "cell_step", "stage": 1, "nodes": ["i", "f", "g", "o", "c_next", "h_next"],
                 "inputs": ["gates_x", "gates_h", "c"], "outputs": ["h_next", "c_next"], "source": "..."}],
}


def test_plan_stage_table_orders_hoisted_work_first():
    rows = figures.plan_stage_table(PLAN)
    assert [(r["stage"], r["kind"], r["name"]) for r in rows] == [
        ("hoisted", "GEMM", "gemm_x"), ("0", "GEMM", "gemm_h"), ("1", "kernel", "cell_step")]
    assert rows[1]["shape"] == "4 x 1024 x 256" and rows[1]["FLOPs"] == 2 * 4 * 1024 * 256
    assert rows[2]["writes"] == "h_next, c_next"


def test_plan_stage_table_of_a_real_plan_lists_every_layers_gemm_shape():
    explain = pytest.importorskip("engine.explain")
    plan = explain.explain_json(engine.preset("lstm").cell, input_size=24, hidden_size=40, num_layers=3, steps=9,
                                batch=5)
    rows = figures.plan_stage_table(plan)
    gemm_rows = [r for r in rows if r["kind"] == "GEMM"]
    assert len(gemm_rows) == sum(len(g["shapes"]) for g in plan["gemms"])
    assert {r["name"] for r in rows if r["kind"] == "kernel"} == {k["name"] for k in plan["kernels"]}
    stages = [r["stage"] for r in rows]
    assert stages == sorted(stages, key=lambda s: (s != "hoisted", s))     # hoisted work comes first
    # the recurrent GEMM reads h and runs once per step in every layer, with M = batch, K = hidden size
    assert all(isinstance(r["layer"], str) for r in rows), "a column of mixed types does not convert to Arrow"
    recurrent = [r for r in gemm_rows if r["reads"] == "h"]
    assert len(recurrent) == 3 and all(r["per"] == "step" and r["shape"].startswith("5 x ") and
                                       r["shape"].endswith(" x 40") for r in recurrent)


def test_stage_launches_count_each_gemm_and_kernel_once():
    fig = figures.stage_launches_figure(PLAN)
    by_kind = {t.name: list(t.y) for t in fig.data}
    assert by_kind == {"GEMM": [1, 1, 0], "fused kernel": [0, 0, 1]}
    assert list(fig.data[0].x) == ["hoisted (per sequence)", "stage 0", "stage 1"]


@pytest.mark.parametrize("value,unit,text", [(1.5e9, "FLOP", "1.50 GFLOP"), (2048, "B", "2.05 kB"),
                                             (12, "B", "12 B"), (3.2e13, "FLOP", "32.00 TFLOP")])
def test_si(value, unit, text):
    assert figures.si(value, unit) == text


# ---- GPU schedules ----------------------------------------------------------------------------------------

@pytest.fixture
def schedules(monkeypatch, tmp_path):
    """explain_json's schedules of a 3-layer GRU, with the nominal H100 limits and an empty autotune cache."""
    explain = pytest.importorskip("engine.explain")
    monkeypatch.setattr(engine.backends, "gpu_status", lambda: (False, "no CUDA device (test)"))
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path))
    return explain.explain_json("gru", input_size=24, hidden_size=100, num_layers=3, steps=9, batch=16)["schedules"]


@pytest.mark.parametrize("name", ["graph", "persistent"])
def test_block_tiling_figure_draws_one_bar_per_block_where_it_sits(schedules, name):
    tiling = schedules[name]["tiling"]
    fig = figures.block_tiling_figure(tiling, schedule=name)
    (bars,) = fig.data
    assert len(bars.x) == tiling["blocks"] == len(tiling["blocks_owned"])
    for (layer, first, units), y, base, width in zip(tiling["blocks_owned"], bars.y, bars.base, bars.x):
        assert (y, base, width) == (f"layer {layer}", first, units)
    assert fig.layout.title.text.startswith(f"{name}: {tiling['blocks']} blocks")
    assert fig.layout.xaxis.title.text.startswith("hidden unit") and fig.layout.yaxis.title.text == "layer"
    assert "block %{customdata[0]}" in bars.hovertemplate and "KiB shared memory" in bars.hovertemplate
    colours = list(bars.marker.color)
    assert all(a != b for a, b in zip(colours, colours[1:]))        # neighbouring blocks can be told apart


def test_schedule_comparison_table_has_a_row_per_schedule(schedules):
    rows = {r["schedule"]: r for r in figures.schedule_comparison_table(schedules)}
    assert list(rows) == ["fused", "graph", "persistent"]
    assert rows["persistent"]["host launches per sequence"] == 1
    assert rows["persistent"]["launched as"] == "one persistent kernel"
    assert rows["graph"]["launched as"] == "graph replay"
    assert rows["graph"]["kernel launches per sequence"] == schedules["graph"]["kernel_launches_per_sequence"]
    assert rows["fused"]["launched as"] == "per-step launches" and rows["fused"]["barriers per sequence"] is None
    ineligible = dict(schedules, graph={"eligible": False, "why_not": "no (test)"})
    assert figures.schedule_comparison_table(ineligible)[1]["can run"] == "no"


def test_shared_memory_table_says_resident_or_streamed(schedules):
    rows = figures.shared_memory_table(schedules["persistent"]["tiling"])
    assert [r["GEMM"] for r in rows] == [g["name"] for g in schedules["persistent"]["tiling"]["gemms"]]
    assert {r["weights"] for r in figures.shared_memory_table(schedules["graph"]["tiling"])} == {
        "streamed from global memory"}


def test_engine_time_bars_give_each_schedule_its_own_bars():
    def entry(name, family, ms, **extra):
        return {"name": name, "family": family, "status": "ok", "median_ms": ms, **extra}

    results = {"cells": [{"preset": "lstm", "config": {"name": "lat"}, "implementations": [
        entry("cudnn-fp32", "cudnn", 1.0), entry("fused", "engine", 2.0), entry("graph", "engine", 0.5),
        entry("persistent", "engine", 0.25), entry("auto", "engine", 0.26, detail={"schedule": "persistent"}),
        {"name": "naive", "family": "engine", "status": "failed", "reason": "boom"}]}]}
    fig = figures.engine_time_bars(results)
    bars = {t.name: (list(t.x), list(t.y), list(t.customdata)) for t in fig.data}
    assert list(bars) == ["fused", "graph", "persistent", "auto"]          # engine rows that ran; no cuDNN
    assert bars["persistent"][:2] == (["lstm · lat"], [0.25])
    assert bars["auto"][2] == ["autotuned: persistent"]
    assert fig.layout.yaxis.title.text.startswith("median time") and fig.layout.title.text


def test_results_table_carries_the_same_mode_speedup():
    results = {"cells": [{"preset": "lstm", "config": {"name": "mid", "input_size": 512, "hidden_size": 512,
                                                        "num_layers": 4, "steps": 100, "batch": 64},
                          "implementations": [
                              {"name": "persistent-bf16", "family": "engine", "precision": "bf16", "status": "ok",
                               "median_ms": 2.7, "speedup": {"vs_cudnn_fp32": 2.9, "vs_cudnn_same": 3.3}},
                              {"name": "cudnn-bf16", "family": "cudnn", "precision": "bf16", "status": "ok",
                               "median_ms": 9.0, "speedup": {"vs_cudnn_fp32": 0.9, "vs_cudnn_same": 1.0}}]}]}
    rows = figures.results_table(results)
    assert [r["implementation"] for r in rows] == ["persistent-bf16", "cudnn-bf16"]
    assert [r["speedup_vs_cudnn_same_mode"] for r in rows] == [3.3, 1.0]
    assert all(set(r) == set(figures.RESULT_COLUMNS) for r in rows), "a row's columns are not RESULT_COLUMNS"


def test_every_figure_has_a_title_axis_labels_and_hover_text():
    from app.designer.figures import plan_figure
    plan = engine.explain_json("gru", input_size=8, hidden_size=16, num_layers=2, steps=5, batch=3)
    design = engine.to_dict(engine.preset("gru").cell)
    built = {
        "cell graph": figures.cell_graph_figure(engine.preset("gru").cell.nx),
        "heatmap": figures.wavefront_heatmap(wavefront(3, 6).to_dict()["grid"]),
        "speedup": figures.speedup_bars([{"config": "B=1", "baseline": "cuDNN", "speedup": 2.0}]),
        "divergence": figures.divergence_figure([{"label": "fp32", "errors": [1e-7, 2e-7]}]),
        "timeline": figures.timeline_figure([{"name": "gemm", "lane": 0, "start_ms": 0.0, "end_ms": 0.5}]),
        "stages": figures.stage_launches_figure(plan),
        "plan": plan_figure(design, plan["node_groups"]),
    }
    for name, fig in built.items():
        assert fig.layout.title.text, f"{name}: no title"
        for axis in (fig.layout.xaxis, fig.layout.yaxis):
            if axis.visible is not False and name not in ("cell graph",):
                assert axis.title.text, f"{name}: an axis without a label"
        data = [t for t in fig.data if t.hoverinfo != "skip"]
        assert data and all(t.hovertemplate or t.hoverinfo for t in data), f"{name}: a trace without hover text"
