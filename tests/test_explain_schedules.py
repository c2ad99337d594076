"""explain()'s "schedules" section without a GPU: what fused, graph and persistent would do with a cell
(eligibility, tiling, launches, barriers, shared memory), the autotuner's cached choice, the
generated wavefront source, and the errors for a bad schedule name."""
from __future__ import annotations

import dataclasses
import json

import pytest
from compiler_cells import input_sized

import engine
from engine import backends
from engine.codegen.wavefront import entry_points, render_wavefront, stages
from engine.compiler import make_plan
from engine.explain import explain, explain_json, explain_text
from engine.schedules.autotune import Choice, cache_key, write_entry
from engine.schedules.tiling import H100, TileConfig, make_tiling

SIZES = dict(input_size=24, hidden_size=40, num_layers=2, steps=6, batch=8)


@pytest.fixture(autouse=True)
def no_gpu_and_an_empty_cache(monkeypatch, tmp_path):
    """The nominal H100 limits and a cache of our own, whatever this machine has."""
    monkeypatch.setattr(backends, "gpu_status", lambda: (False, "no CUDA device (test)"))
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path / "cache"))


def _network(name: str = "lstm", **sizes) -> engine.Network:
    sizes = {**SIZES, **sizes}
    return engine.Network(engine.preset(name).cell, sizes["input_size"], sizes["hidden_size"], sizes["num_layers"])


def test_every_schedule_is_described_with_the_nominal_limits():
    report = explain_json("lstm", **SIZES)["schedules"]
    assert report["requested"] is None
    assert report["limits"]["nominal"] and report["limits"]["name"] == H100.name
    assert "no CUDA device (test)" in report["limits"]["why"]
    assert report["limits"]["multiprocessors"] == H100.multiprocessors
    assert {"fused", "graph", "persistent", "autotune", "default", "selected"} <= set(report)
    assert all(report[name]["eligible"] for name in ("fused", "graph", "persistent"))
    assert report["default"]["schedule"] == report["selected"]["schedule"] == "persistent"
    assert report["graph"]["source"] is None and report["persistent"]["source"] is None
    json.dumps(report)


@pytest.mark.parametrize("name", ["lstm", "gru", "mgu", "indrnn"])
def test_launches_and_barriers_per_sequence(name):
    T, L = SIZES["steps"], SIZES["num_layers"]
    data = explain_json(name, **SIZES)
    report = data["schedules"]
    program = make_plan(_network(name), T, SIZES["batch"], layout="interleaved").program
    stage_count = len(stages(program))
    graph, persistent, fused = report["graph"], report["persistent"], report["fused"]
    assert graph["kernel_launches_per_sequence"] == (T + L - 1) * stage_count
    assert graph["launches_per_step"] == stage_count and graph["host_launches_per_sequence"] == 1
    assert persistent["kernel_launches_per_sequence"] == persistent["host_launches_per_sequence"] == 1
    assert persistent["launches_per_step"] == 0
    assert graph["barriers_per_sequence"] == persistent["barriers_per_sequence"] == (T + L - 1) * stage_count
    assert fused["launches_per_step"] == data["launches_per_step"]
    assert fused["kernel_launches_per_sequence"] == sum(c["launches_total"] for c in data["per_layer"])
    assert fused["barriers_per_sequence"] is None


def test_the_fused_backends_modes_are_described():
    """In a mode each step product runs on cublasLt's tensor cores; in float32x3 as two GEMMs of fp16-held parts
    folded by the cell kernels, one more launch a step product (the gru_cho's two, at H = 40 one K chunk each)."""
    T, L = SIZES["steps"], SIZES["num_layers"]
    plain = explain_json("gru_cho", **SIZES)["schedules"]["fused"]
    bf16 = explain_json("gru_cho", **SIZES, precision="bfloat16")["schedules"]["fused"]
    x3 = explain_json("gru_cho", **SIZES, precision="float32x3")["schedules"]["fused"]
    assert "cublasLt" not in plain["how"] and "in bfloat16 each step's product on cublasLt" in bf16["how"]
    assert bf16["launches_per_step"] == plain["launches_per_step"]
    assert "two GEMMs of the 11-bit parts a product, held as fp16" in x3["how"]
    assert x3["launches_per_step"] == plain["launches_per_step"] + 2
    assert "folded by the cell kernels" in x3["how"] and "h_gemm K=40 in 1" in x3["how"]
    assert x3["kernel_launches_per_sequence"] == plain["kernel_launches_per_sequence"] + 2 * T * L
    text = explain("gru_cho", **SIZES, precision="float32x3", schedule="fused")
    assert "    in float32x3 each step's product on cublasLt's tensor cores" in text


@pytest.mark.parametrize("schedule", ["graph", "persistent"])
def test_tiling_is_the_engines_and_every_unit_has_one_owner(schedule):
    network = _network()
    tiling = explain_json(network, steps=SIZES["steps"], batch=SIZES["batch"])["schedules"][schedule]["tiling"]
    plan = make_plan(network, SIZES["steps"], SIZES["batch"], layout="interleaved")
    expected = make_tiling(plan.program, network, SIZES["batch"], TileConfig(), H100,
                           persistent=schedule == "persistent")
    assert tiling["describe"] == expected.describe()
    assert (tiling["blocks"], tiling["blocks_per_layer"], tiling["units_per_block"], tiling["smem_bytes"]) == (
        expected.blocks, expected.blocks_per_layer, expected.units_per_block, expected.smem_bytes)
    assert tiling["resident"] == list(expected.resident)
    assert tiling["accumulator"] == [expected.config.rows_per_thread, expected.config.cols_per_thread]
    assert len(tiling["blocks_owned"]) == expected.blocks
    for layer in range(network.num_layers):
        owned = sorted((first, units) for l, first, units in tiling["blocks_owned"] if l == layer)
        covered = [u for first, units in owned for u in range(first, first + units)]
        assert covered == list(range(network.hidden_size)), f"layer {layer}"
    for g in tiling["gemms"]:
        assert g["where"].startswith("shared memory") == (g["name"] in expected.resident)
        assert g["weight_kib_per_block"] == pytest.approx(g["columns_per_block"] * g["k"] * 4 / 1024)
    if schedule == "graph":
        assert tiling["resident"] == []              # a fresh kernel every stage: nothing stays resident


def test_one_layer_projects_its_input_with_cublas_before_the_launch():
    report = explain_json("gru", **{**SIZES, "num_layers": 1})["schedules"]
    for name in ("graph", "persistent"):
        assert report[name]["before_launch"] == ["x_proj"]
        assert "cuBLAS" in report[name]["how"]


def test_too_many_layers_for_one_block_each_leaves_the_graph_schedule():
    """A persistent kernel needs every block resident at once: more layers than SMs cannot be."""
    report = explain_json("gru", input_size=4, hidden_size=4, num_layers=H100.multiprocessors + 1, steps=2,
                          batch=2)["schedules"]
    assert not report["persistent"]["eligible"] and "multiprocessors" in report["persistent"]["why_not"]
    assert report["graph"]["eligible"]
    assert report["default"]["schedule"] == "graph"


def test_an_ineligible_cell_says_why_and_falls_back_to_fused():
    report = explain_json(input_sized, **SIZES)["schedules"]
    for name in ("graph", "persistent"):
        assert not report[name]["eligible"] and report[name]["tiling"] is None
        assert "h_gx_gemm" in report[name]["why_not"] and "size I" in report[name]["why_not"]
    assert report["default"]["schedule"] == "fused"
    text = explain_text(input_sized, **SIZES, schedule="persistent", sources=False)
    assert "persistent: cannot run this cell: GEMM 'h_gx_gemm'" in text
    assert "selected: persistent: asked for, but it cannot run this cell" in text


@pytest.mark.parametrize("schedule", ["graph", "persistent"])
def test_a_wavefront_schedule_brings_its_generated_source(schedule):
    network = _network()
    data = explain_json(network, steps=SIZES["steps"], batch=SIZES["batch"], schedule=schedule)
    report = data["schedules"]
    assert report["requested"] == schedule and report["selected"] == {"schedule": schedule, "why": "asked for"}
    plan = make_plan(network, SIZES["steps"], SIZES["batch"], layout="interleaved")
    tiling = make_tiling(plan.program, network, SIZES["batch"], TileConfig(), H100,
                         persistent=schedule == "persistent")
    assert report[schedule]["source"] == render_wavefront(plan.program, network, tiling)
    other = "graph" if schedule == "persistent" else "persistent"
    assert report[other]["source"] is None
    names = entry_points(plan.program)
    wanted = [names["persistent"]] if schedule == "persistent" else list(names["wave"])
    assert all("__global__ void __launch_bounds__" in report[schedule]["source"] and n in report[schedule]["source"]
               for n in wanted)


def test_text_with_a_schedule_ends_with_its_source():
    text = explain_text("gru", **SIZES, schedule="persistent")
    source = explain_json("gru", **SIZES, schedule="persistent")["schedules"]["persistent"]["source"]
    assert text.endswith(source)
    assert "CUDA source of schedule 'persistent'" in text
    for needle in ("schedules (tilings for NVIDIA H100 (nominal)", "graph: one kernel per stage",
                   "persistent: one cooperative kernel", "registers:", "x_proj (input projection",
                   "autotuner: nothing cached for this network at T=6, B=8", "selected: persistent: asked for"):
        assert needle in text, needle
    without = explain_text("gru", **SIZES, schedule="persistent", sources=False)
    assert "__global__" not in without and without.rstrip().endswith("asked for")


def test_text_without_a_schedule_stays_as_it_was():
    """The schedules depend on the device and the autotune cache; the plain text must not."""
    text = explain_text("gru", **SIZES)
    assert "schedules (" not in text and "CUDA source:" in text


def test_fused_and_auto_leave_the_source_to_the_fused_backend():
    fused = explain_json("lstm", **SIZES, schedule="fused")["schedules"]
    assert fused["selected"] == {"schedule": "fused", "why": "asked for"}
    assert fused["graph"]["source"] is None and fused["persistent"]["source"] is None
    auto = explain_json("lstm", **SIZES, schedule="auto")["schedules"]
    assert auto["selected"]["schedule"] == "persistent"          # nothing tuned: the default
    assert "backend='auto' times the candidates" in auto["selected"]["why"]
    assert auto["persistent"]["source"]                          # what auto would run


def test_the_autotuners_cached_choice_is_reported_and_shown_first():
    network = _network()
    T, B = SIZES["steps"], SIZES["batch"]
    timings = [{"candidate": "fused", "ms": 0.5}, {"candidate": "graph (units=1 tile=4x4 threads=256)", "ms": 0.2},
               {"candidate": "persistent (units=1 tile=4x4 threads=256)", "error": "too slow to build (test)"}]
    key = cache_key(network, T, B, "Test GPU")
    write_entry(key, Choice("graph", TileConfig(4), "fastest of 2 (test)", key, timings))
    other = cache_key(network, T + 1, B, "Test GPU")                  # other sizes: not this network's
    write_entry(other, Choice("fused", None, "other sizes (test)", other))
    report = explain_json(network, steps=T, batch=B)["schedules"]
    (choice,) = report["autotune"]["choices"]
    assert choice == {"device": "Test GPU", "schedule": "graph", "config": TileConfig(4).label(),
                      "config_fields": dataclasses.asdict(TileConfig(4)), "why": "fastest of 2 (test)",
                      "timings": timings, "precision": "float32"}     # the mode the choice runs in
    assert report["default"]["schedule"] == report["selected"]["schedule"] == "graph"
    # The chosen schedule is drawn with the chosen tiling (4 units a block), the other with the default (1 here).
    assert report["graph"]["tiling_from"] == "the autotuner's choice"
    assert report["graph"]["tiling"]["units_per_block"] == 4
    assert report["graph"]["tiling"]["blocks_per_layer"] == SIZES["hidden_size"] // 4
    assert report["persistent"]["tiling_from"] == "the default tiling"
    assert report["persistent"]["tiling"]["units_per_block"] == 1
    assert "Test GPU" in report["default"]["why"]
    text = explain_text(network, steps=T, batch=B, schedule="auto", sources=False)
    assert "autotuner on Test GPU: graph (units=4" in text and "auto selects: graph" in text
    assert "fused: 0.5 ms" in text and "error: too slow to build (test)" in text


@pytest.mark.parametrize("call", [explain_json, explain_text, explain])
def test_a_bad_schedule_name_names_the_argument_and_the_choices(call):
    with pytest.raises(engine.CompileError, match="argument 'schedule'") as e:
        call("lstm", schedule="warp")
    assert "'warp'" in str(e.value) and "fused, graph, persistent, auto" in str(e.value)


@pytest.mark.parametrize("precision,mode", [("bfloat16", "RNN_BF16"), ("tf32", "RNN_TF32")])
def test_a_precision_plans_the_schedules_for_tensor_cores(precision, mode):
    report = explain_json("lstm", **SIZES, schedule="persistent", precision=precision)["schedules"]
    entry = report["persistent"]
    assert f"tensor-core MMA ({precision})" in entry["tiling"]["describe"]
    assert f"rnn_mma_gemms<{mode}" in entry["source"] and "mma.sync.aligned" in entry["source"]
    strict = explain_json("lstm", **SIZES, schedule="persistent")["schedules"]["persistent"]
    assert "rnn_mma_gemms<" not in strict["source"] and "mma.sync" not in strict["source"]
    assert "tensor-core" not in strict["tiling"]["describe"]
    text = explain_text("lstm", **SIZES, schedule="persistent", precision=precision, sources=False)
    assert f"tensor-core MMA ({precision})" in text


@pytest.mark.parametrize("precision,sizes,batch,staging", [
    ("bfloat16", (64, 128), 40, "one bulk copy (cp.async.bulk)"),     # whole chunks of 64 columns on sm_90
    ("bfloat16", (24, 40), 40, "16-bit copies of X (cp.async)"),
    ("float32", (24, 40), 40, "fp32 X (cp.async)"),
    ("float32", (24, 40), 3, "no staging"),                             # the warp GEMV
])
def test_the_report_says_how_a_block_stages_its_operands(precision, sizes, batch, staging):
    report = explain_json("lstm", input_size=sizes[0], hidden_size=sizes[1], num_layers=2, steps=6, batch=batch,
                          precision=precision)["schedules"]
    for name in ("graph", "persistent"):
        tiling = report[name]["tiling"]
        assert staging in tiling["staging"], tiling["staging"]
        bulk = "bulk" in staging
        streamed = [g["where"] for g in tiling["gemms"] if not g["where"].startswith("shared memory")]
        assert all(w == ("streamed by bulk copies, chunked per block" if bulk else "streamed from global memory")
                   for w in streamed)
        assert streamed or name == "persistent"       # the graph schedule keeps no weight resident


@pytest.mark.parametrize("batch,words", [(2, "per-layer arrival counters"), (8, "grid-wide barrier")])
def test_the_report_names_the_barrier_the_tiling_chose(batch, words):
    """Small batches (the warp GEMV, several layers a launch) synchronise layers with arrival counters by default,
    register tiles with grid barriers: the persistent entry says which (the graph schedule has kernel boundaries)."""
    report = explain_json("lstm", **{**SIZES, "batch": batch})["schedules"]
    assert words in report["persistent"]["sync"] and words.split()[0] not in report["graph"]["sync"]
    assert ("arrival counters" in report["persistent"]["how"]) == (batch == 2)
