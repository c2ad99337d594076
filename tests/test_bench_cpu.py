"""The benchmark harness without a GPU: the CLI's refusal, configuration parsing, FLOP counting,
floors, divergence, the results file, the tables, the torch cell interpreter against the NumPy
reference, and the whole per-cell measuring logic run on the CPU with stand-in implementations."""
from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from compiler_cells import every_op

import engine
from engine import backends
from engine.backends import reference
from engine.bench import (
    ANCHORS,
    SCHEMA,
    SCHEMA_VERSION,
    BenchConfig,
    floors,
    layer_step_flops,
    list_results,
    load_results,
    markdown_table,
    network_flops,
    parse_config,
    parse_configs,
    run_bench,
    save_results,
    text_summary,
)
from engine.bench.configs import load_config_file
from engine.bench.divergence import TOLERANCE, error_summary, gate, step_curves
from engine.bench.implementation import Case, Implementation
from engine.bench.implementations import (
    AutoSchedule,
    CompileBudget,
    Cudnn,
    EngineBackend,
    TorchCell,
    select,
)
from engine.bench.progress import TextProgress
from engine.bench.results import new_results
from engine.bench.runner import add_derived, measure_cell, merge_groups, resolve_settings
from engine.bench.timing import time_runs, wall_timer
from engine.cli import main
from engine.dsl import W, b, cell, identity, sigmoid, tanh
from engine.errors import BackendError
from engine.ops import OPS

ROOT = Path(__file__).resolve().parents[1]


# ---- no GPU ---------------------------------------------------------------------------------------

@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(backends, "gpu_status", lambda: (False, "no CUDA device (test)"))


def test_bench_needs_a_gpu(no_gpu, capsys):
    code = main(["bench", "--config", "mid", "--preset", "gru"])
    err = capsys.readouterr().err
    assert code == 2
    assert "needs a CUDA GPU" in err and "no CUDA device (test)" in err and "hint:" in err


def test_run_bench_needs_a_gpu(no_gpu):
    with pytest.raises(BackendError, match="needs a CUDA GPU"):
        run_bench(["lstm"], ["8,8,1,2,2"])


@pytest.mark.skipif(backends.gpu_status()[0], reason="this machine has a GPU: the refusal is tested in-process")
def test_bench_command_without_gpu_exits_non_zero():
    done = subprocess.run([sys.executable, "-m", "engine", "bench", "--quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    assert "needs a CUDA GPU" in done.stderr and "hint:" in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_config_is_reported_before_looking_for_a_gpu(no_gpu, capsys):
    assert main(["bench", "--config", "1,2,3"]) == 2
    assert "I,H,L,T,B" in capsys.readouterr().err


def test_bad_implementation_names_are_reported_before_looking_for_a_gpu(no_gpu, capsys):
    assert main(["bench", "--impl", "auto-bf16", "--impl", "fused-fp64", "-c", "mid"]) == 2
    err = capsys.readouterr().err
    assert "unknown implementation 'fused-fp64'" in err and "auto-fp32x3" in err and "needs a CUDA GPU" not in err
    assert main(["bench", "--train", "--impl", "fused-bf16", "--impl", "persistent", "-c", "mid"]) == 2
    err = capsys.readouterr().err
    assert "--impl persistent: not a training-step implementation" in err and "engine-fused-bf16" in err
    assert main(["bench", "--train", "--impl", "fused-bf16", "--impl", "cudnn-bf16", "-c", "mid"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err                  # good names: on to the GPU check


def test_list_configs_works_without_a_gpu(no_gpu, capsys):
    assert main(["bench", "--list-configs"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ANCHORS)


# ---- configurations ---------------------------------------------------------------------------------

def test_anchor_configurations():
    got = {name: (c.input_size, c.hidden_size, c.num_layers, c.steps, c.batch) for name, c in ANCHORS.items()}
    assert got == {"blogB": (64, 256, 3, 100, 64), "mid": (512, 512, 4, 100, 64), "lat": (512, 512, 2, 100, 1),
                   "large": (1024, 1024, 2, 100, 128), "blogA": (2560, 2560, 1, 200, 64)}
    assert ANCHORS["mid"].wavefront_steps == 103


def test_parse_config_forms(tmp_path):
    assert parse_config("lat") == [ANCHORS["lat"]]
    (c,) = parse_config(" 37, 129,3,17,5 ")
    assert (c.input_size, c.hidden_size, c.num_layers, c.steps, c.batch) == (37, 129, 3, 17, 5)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"configs": ["mid", {"name": "wide", "input_size": 8, "hidden_size": 2048,
                                                    "num_layers": 1, "steps": 10, "batch": 2}]}))
    mid, wide = parse_config(str(path))
    assert mid == ANCHORS["mid"] and wide.name == "wide" and wide.hidden_size == 2048
    assert parse_configs(None) == list(ANCHORS.values())
    assert parse_configs(["mid", "lat", "mid"]) == [ANCHORS["mid"], ANCHORS["lat"]]


@pytest.mark.parametrize("text, message", [
    ("nope", "not an anchor"), ("1,2,3,4", "not an anchor"), ("1,2,x,4,5", "five integers"),
    ("0,2,3,4,5", "input_size must be"), ("1,2,3,4,-5", "batch must be"), ("missing.json", "does not exist"),
])
def test_bad_configs_are_named(text, message):
    with pytest.raises(BackendError, match=message):
        parse_config(text)


@pytest.mark.parametrize("content, message", [
    ("{not json", "invalid JSON"), ('{"configs": []}', "non-empty list"), ('["nope"]', "configs\\[0\\]"),
    ('[{"input_size": 1}]', "missing field"), ('[{"input_size": 1, "hidden_size": 1, "num_layers": 1, "steps": 1, '
                                              '"batch": 1, "heads": 2}]', "unknown field"),
])
def test_bad_config_files_are_named(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(BackendError, match=message):
        load_config_file(path)


def test_shipped_config_files_load():
    files = sorted((ROOT / "benchmarks" / "configs").glob("*.json"))
    assert files
    for path in files:
        assert load_config_file(path)


# ---- FLOPs and floors ------------------------------------------------------------------------------

def test_lstm_flops_by_hand():
    """8 matmuls (4 on x, 4 on h) and 21 elementwise ops of B x H per layer step."""
    I, H, B = 64, 256, 32
    got = layer_step_flops(engine.preset("lstm").cell, I, H, B)
    assert got["matmul"] == 2 * B * H * (4 * I + 4 * H)
    assert got["elementwise"] == 21 * B * H
    net = engine.Network(engine.preset("lstm").cell, I, H, 3)
    total = network_flops(net, steps=10, batch=B)
    per_layer_h = 2 * B * H * 8 * H + 21 * B * H
    assert total["per_step"] == got["total"] + 2 * per_layer_h
    assert total["total"] == 10 * total["per_step"]


def test_gru_flops_by_hand():
    I, H, B = 5, 7, 3
    got = layer_step_flops(engine.preset("gru").cell, I, H, B)
    assert got == {"matmul": 2 * B * H * (3 * I + 3 * H), "elementwise": 17 * B * H,
                   "total": 2 * B * H * (3 * I + 3 * H) + 17 * B * H}


@cell
def param_only(x, h):
    gate = sigmoid(b("b_g"))                # no batch dimension: H flops
    h_next = identity(gate * tanh(W("W") @ x + h))
    return {"h": h_next}


def test_flops_of_unbatched_and_identity_ops():
    got = layer_step_flops(param_only, 4, 6, 10)
    # sigmoid(b): H; add, tanh, mul: 3 * B * H; identity: 0
    assert got["elementwise"] == 6 + 3 * 10 * 6
    assert got["matmul"] == 2 * 6 * 4 * 10


def test_floors():
    got = floors(4e12, 103, sgemm_tflops=50.0, launch_us=4.0)
    assert got["compute_ms"] == pytest.approx(80.0) and got["latency_ms"] == pytest.approx(0.412)
    assert got["floor_ms"] == got["compute_ms"]
    assert floors(1e9, 103, None, None) == {"compute_ms": None, "latency_ms": None, "floor_ms": None}


# ---- divergence ---------------------------------------------------------------------------------------

def test_step_curves_find_the_step():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((6, 3, 4))
    out = ref.copy()
    out[3, 1, 2] += 0.5
    out[5] += 1e-3
    curves = step_curves(out, ref, np)
    assert int(np.argmax(curves["max"])) == 3
    assert curves["max"][3] == pytest.approx(0.5) and curves["mean"][3] == pytest.approx(0.5 / 12, rel=1e-3)
    assert curves["max"][0] == 0 and curves["max"][5] == pytest.approx(1e-3)


def test_error_summary_and_gate():
    ref = np.linspace(-2, 2, 24).reshape(2, 3, 4)
    good = error_summary(ref + 1e-7, ref, np, "fp32")
    assert good["within_tolerance"] and gate(good, "fp32") is None
    assert good["rel"] == pytest.approx(1e-7 / 2)
    wrong = error_summary(ref * 0.5, ref, np, "fp32")
    assert "exceeds" in gate(wrong, "fp32")
    assert gate(error_summary(ref * 0.9, ref, np, "bf16"), "bf16") is None   # reduced precision: not gated
    poisoned = ref.copy()
    poisoned[1, 2, 3] = np.nan
    summary = error_summary(poisoned, ref, np, "fp16")
    assert summary["nonfinite"] == 1 and "non-finite" in gate(summary, "fp16")
    assert step_curves(poisoned, ref, np)["max"][1] is None      # JSON-safe


# ---- results ----------------------------------------------------------------------------------------

def fake_results(created="2031-01-02T03:04:05+00:00") -> dict:
    results = new_results({"device": "Test GPU 80GB"}, {"sgemm_fp32_tflops": 50.0, "launch_us": 4.0},
                          {"reps": 20})
    results["created"] = created
    entry = {"name": "naive", "family": "engine", "precision": "fp32", "status": "ok", "reason": None,
             "median_ms": 12.5, "min_ms": 12.0, "max_ms": 14.0, "speedup": {"vs_cudnn_fp32": 0.5, "vs_naive": 1.0},
             "error": {"rel": 1e-7}, "peak_bytes": 2 ** 20, "tflops": 1.5, "vs_floor": 3.0, "tf32": False,
             "divergence": {"vs_reference": {"max": [0.0, 1e-7], "mean": [0.0, 1e-8]}}}
    cudnn = dict(entry, name="cudnn-fp32", median_ms=6.25, speedup={"vs_cudnn_fp32": 1.0, "vs_naive": 2.0})
    missing = {"name": "torch-compile", "status": "unavailable", "reason": "triton is not installed"}
    results["cells"] = [
        {"preset": "lstm", "config": ANCHORS["mid"].to_dict(), "status": "ok", "reason": None,
         "flops": {"total": 10 ** 10}, "wavefront_steps": 103,
         "floors": {"compute_ms": 0.2, "latency_ms": 0.41, "floor_ms": 0.41},
         "implementations": [cudnn, entry, missing], "warnings": []},
        {"preset": "gru", "config": ANCHORS["blogA"].to_dict(), "status": "skipped",
         "reason": "needs about 900.0 GiB of GPU memory", "implementations": []},
    ]
    return results


def test_results_round_trip(tmp_path):
    results = fake_results()
    path = save_results(results, tmp_path / "r.json")
    assert load_results(path) == results
    assert not list(tmp_path.glob("*.tmp"))


def test_results_loader_rejects_other_files(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "something-else", "version": 1, "cells": []}))
    with pytest.raises(BackendError, match="not a benchmark result"):
        load_results(other)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema": SCHEMA, "version": SCHEMA_VERSION + 1, "cells": []}))
    with pytest.raises(BackendError, match="schema version"):
        load_results(old)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(BackendError, match="not valid JSON"):
        load_results(broken)
    with pytest.raises(BackendError, match="does not exist"):
        load_results(tmp_path / "none.json")


def test_only_results_files_that_cannot_be_read_are_reported(tmp_path):
    """A bench-*.json that fails to load is reported; the folder's other JSON (probe outputs, phase profiles) is
    not a results document and is left out of the report, as out of the list."""
    from engine.bench import unreadable_results
    (tmp_path / "bench-20261124-000000-GPU.json").write_text("{")
    (tmp_path / "phase-lstm-mid.json").write_text(json.dumps({"phases": []}))
    (tmp_path / "training-step.json").write_text(json.dumps([{"preset": "lstm"}]))
    reported = unreadable_results(tmp_path)
    assert [Path(path).name for path, _ in reported] == ["bench-20261124-000000-GPU.json"]
    assert "not valid JSON" in reported[0][1]
    assert list_results(tmp_path) == []


def test_list_results_newest_first(tmp_path):
    save_results(fake_results("2030-01-01T00:00:00+00:00"), tmp_path / "a.json")
    save_results(fake_results("2031-06-01T00:00:00+00:00"), tmp_path / "b.json")
    (tmp_path / "junk.json").write_text("[]")
    listed = list_results(tmp_path)
    assert [Path(r["path"]).name for r in listed] == ["b.json", "a.json"]
    assert listed[0]["presets"] == ["gru", "lstm"] and listed[0]["device"] == "Test GPU 80GB"


def test_markdown_table():
    table = markdown_table(fake_results()).splitlines()
    assert table[0].split("|")[1:-1] == [" cell ", " config ", " I,H,L,T,B ", " floor ms (compute / latency) ",
                                         " cudnn-fp32 ", " naive ", " torch-compile "]
    assert table[2] == "| lstm | mid | 512,512,4,100,64 | 0.2 / 0.41 | 6.25 (1.00x) | 12.5 (0.50x) | n/a |"
    assert table[3].startswith("| gru | blogA |") and table[3].endswith("skipped | skipped | skipped |")


def test_text_summary_prints_floors_and_reasons():
    text = text_summary(fake_results())
    assert "floors: compute 0.2 ms" in text and "103 wavefront steps x 4.00 us" in text
    assert "torch-compile   unavailable: triton is not installed" in text
    assert "skipped: needs about 900.0 GiB" in text


# ---- settings, selection, grouping ------------------------------------------------------------------

def test_settings():
    quick = resolve_settings(quick=True, reps=None, warmup=None, buffers=None, compile_budget_s=None, seed=0,
                             time_budget_s=None)
    assert quick["reps"] == 20 and quick["buffers"] >= 2
    with pytest.raises(BackendError, match="'reps' must be an integer >= 20"):
        resolve_settings(quick=False, reps=5, warmup=None, buffers=None, compile_budget_s=None, seed=0,
                         time_budget_s=None)
    with pytest.raises(BackendError, match="'buffers'"):
        resolve_settings(quick=False, reps=None, warmup=None, buffers=1, compile_budget_s=None, seed=0,
                         time_budget_s=None)


def test_select_implementations():
    from engine.bench.implementations import default_implementations
    everything = default_implementations(1.0)
    names = [i.name for i in everything]
    assert names[0] == "cudnn-fp32" and {"naive", "cudnn-tf32", "cudnn-fp16", "cudnn-bf16", "torch-eager",
                                         "torch.compile", "torchscript"} <= set(names)
    # the engine's schedules are rows of their own, right after the backends they are compared with
    assert names[1:7] == ["naive", "fused", "graph", "persistent", "scan", "auto"]
    assert [i.name for i in select(everything, ["graph", "persistent", "auto"])] == ["graph", "persistent", "auto"]
    assert all(i.family == "engine" for i in select(everything, ["fused", "graph", "persistent", "auto"]))
    assert [i.name for i in select(everything, ["torch-compile"])] == ["torch.compile", "torchscript"]
    with pytest.raises(BackendError, match="unknown implementation 'cudnn'"):
        select(everything, ["cudnn"])


def test_merge_groups_reports_the_fastest():
    entries = [{"name": "naive", "status": "ok", "median_ms": 3.0, "detail": {}},
               {"name": "torch.compile", "status": "ok", "median_ms": 2.0, "reason": None, "detail": {"compile_s": 9}},
               {"name": "torchscript", "status": "ok", "median_ms": 1.5, "reason": None, "detail": {}}]
    groups = {"torch.compile": "torch-compile", "torchscript": "torch-compile"}
    naive, merged = merge_groups(entries, groups)
    assert naive["name"] == "naive" and merged["name"] == "torch-compile" and merged["median_ms"] == 1.5
    assert merged["detail"]["variant"] == "torchscript"
    assert merged["detail"]["candidates"]["torch.compile"]["compile_s"] == 9
    entries[1].update(status="unavailable", reason="compile budget spent")
    entries[2].update(status="unavailable", reason="no torch.jit")
    (_, merged) = merge_groups(entries, groups)
    assert merged["status"] == "unavailable" and "compile budget spent" in merged["reason"]


# ---- timing and progress -------------------------------------------------------------------------------

def test_time_runs_rotates_buffers():
    seen = []
    timing = time_runs(seen.append, wall_timer, buffers=3, warmup=2, reps=20)
    assert seen == [0, 1] + [k % 3 for k in range(20)]
    assert timing.reps == 20 and timing.min_ms <= timing.median_ms <= timing.max_ms


def test_text_progress_in_a_log():
    stream = io.StringIO()
    progress = TextProgress(stream, width=10)
    progress(0, 4, "start")
    progress(2, 4, "lstm/mid naive")
    progress(4, 4, "done")
    lines = stream.getvalue().splitlines()
    assert lines[1].startswith("[#####.....] 2/4") and lines[1].endswith("lstm/mid naive")
    assert lines[2].startswith("[##########] 4/4")


# ---- the torch cell interpreter ---------------------------------------------------------------------------


def test_every_op_has_a_torch_spelling():
    from engine.bench.torch_cell import torch_expressions
    assert set(OPS) == set(torch_expressions())
    assert {n.op for n in every_op.nodes if not n.is_leaf} == set(OPS)


def test_torch_source_reads_like_the_graph():
    from engine.bench.torch_cell import torch_source
    source = torch_source(engine.preset("lstm").cell)
    assert "def lstm_step(x, h, c, W_ii, b_ii," in source
    assert "    W_ii_x = F.linear(x, W_ii)\n" in source and "    c_next = (c_next_mul_1 + c_next_mul)\n" in source
    assert "        h, c = lstm_step(xs[t], h, c," in source
    ops = sum(1 for n in engine.preset("lstm").cell.nodes if not n.is_leaf)
    assert source.count("\n    ") - source.count("\n        ") == ops + 1 + 2 + 1   # ops, return; layer lines


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed: the torch baselines are not checked")


def torch_case(cell_graph, num_layers=2, seed=0):
    hidden = cell_graph.fit_size(7)                  # 8 for a cell of 4 heads
    net = engine.Network(cell_graph, 5, hidden, num_layers)
    params = engine.init_params(net, seed=seed)
    rng = np.random.default_rng(seed + 50)
    x = rng.standard_normal((6, 3, 5))
    states = {s: rng.uniform(-0.8, 0.8, (num_layers, 3, hidden)) for s in cell_graph.state_names}
    return net, params, x, states


CELLS = {**{name: p.cell for name, p in engine.presets().items()}, "every_op": every_op}


@pytest.mark.parametrize("mode", ["eager", "script"])
@pytest.mark.parametrize("name", sorted(CELLS))
def test_torch_cell_matches_the_reference(torch, name, mode):
    from engine.bench.torch_cell import run_torch
    net, params, x, states = torch_case(CELLS[name], seed=len(name))
    want = reference.run(net, params, x, states, dtype=np.float64)
    out, finals = run_torch(net, params, x, states, mode=mode)
    np.testing.assert_allclose(out, want.outputs, rtol=0, atol=1e-12)
    for state, value in finals.items():
        np.testing.assert_allclose(value, want.final_states[state], rtol=0, atol=1e-12, err_msg=state)


def test_torch_cell_check_can_fail(torch):
    from engine.bench.torch_cell import run_torch
    net, params, x, states = torch_case(CELLS["gru"])
    want = reference.run(net, params, x, states, dtype=np.float64)
    params.layers[1]["b_hn"] = params.layers[1]["b_hn"] + 1e-6
    out, _ = run_torch(net, params, x, states)
    assert np.max(np.abs(out - want.outputs)) > 1e-12


def test_torch_compile_path_traces(torch):
    """torch.compile with the 'eager' backend: dynamo traces the generated step (fast, no compiler)."""
    from engine.bench.torch_cell import layer_function, run_network, torch_params
    net, params, x, _ = torch_case(CELLS["lstm"])
    fn = layer_function(net.cell, "compile", {"backend": "eager"})
    with torch.no_grad():
        out, _ = run_network(fn, net, torch_params(net, params, "cpu", torch.float64), torch.from_numpy(x))
    np.testing.assert_allclose(out.numpy(), reference.run(net, params, x).outputs, rtol=0, atol=1e-12)


# ---- the measuring logic on the CPU, with stand-ins -------------------------------------------------------

class Broken(Implementation):
    """Returns `value` (or raises it) instead of the network's output."""

    family, timer = "test", "wall"

    def __init__(self, name, value, precision="fp32"):
        super().__init__()
        self.name, self.value, self.precision = name, value, precision

    def setup(self, case):
        self.shape = (case.config.steps, case.config.batch, case.config.hidden_size)

    def forward(self, k, poison=False):
        if isinstance(self.value, Exception):
            raise self.value
        return np.full(self.shape, self.value)


class Missing(Broken):
    def unavailable_reason(self, case):
        return "not here (test)"


@pytest.fixture(scope="module")
def cpu_cell(torch):
    preset = engine.preset("lstm")
    config = BenchConfig("tiny", 5, 7, 2, 6, 3)
    net = config.network(preset.cell)
    params = engine.init_params(net, seed=0)
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((6, 3, 5)).astype(np.float32) for _ in range(3)]
    case = Case("lstm", preset.cell, preset, config, net, params, inputs, np, device="cpu")
    ref = reference.run(net, params, inputs[0].astype(np.float64)).outputs
    budget = CompileBudget(0.0)
    impls = [Cudnn("fp32", timer="wall"), EngineBackend("reference", timer="wall"), Cudnn("bf16", timer="wall"),
             TorchCell("eager", timer="wall"), TorchCell("script", budget, timer="wall"),
             Broken("nan", np.nan), Broken("zeros", 0.0), Broken("raises", RuntimeError("boom\nsecond line")),
             Missing("missing", 0.0)]
    calls = []
    entries = measure_cell(case, impls, ref, reps=20, warmup=1, buffers=3, total=len(impls),
                           progress=lambda *a: calls.append(a))
    add_derived(entries, network_flops(net, 6, 3)["total"], floor_ms=0.001)
    return {e["name"]: e for e in entries}, calls


def test_cpu_cell_right_implementations_are_timed(cpu_cell):
    entries, _ = cpu_cell
    for name in ("cudnn-fp32", "reference", "torch-eager", "cudnn-bf16"):
        e = entries[name]
        assert e["status"] == "ok", (name, e["reason"])
        assert e["reps"] == 20 and e["min_ms"] <= e["median_ms"] <= e["max_ms"]
        assert len(e["divergence"]["vs_reference"]["max"]) == 6
    assert entries["cudnn-fp32"]["error"]["rel"] < 1e-5
    assert entries["cudnn-bf16"]["error"]["rel"] > entries["cudnn-fp32"]["error"]["rel"]
    assert "vs_cudnn_fp32" in entries["torch-eager"]["divergence"]
    assert "vs_cudnn_fp32" not in entries["cudnn-fp32"]["divergence"]
    e = entries["torch-eager"]
    assert e["speedup"]["vs_cudnn_fp32"] == pytest.approx(entries["cudnn-fp32"]["median_ms"] / e["median_ms"])
    assert e["tf32_flags"] == {"torch.backends.cuda.matmul.allow_tf32": False,
                               "torch.backends.cudnn.allow_tf32": False}
    assert entries["reference"]["detail"]["interface"].startswith("run(network, params, x)")


def test_cpu_cell_wrong_implementations_are_not_timed(cpu_cell):
    entries, _ = cpu_cell
    assert entries["nan"]["status"] == "failed" and "non-finite" in entries["nan"]["reason"]
    assert entries["zeros"]["status"] == "failed" and "exceeds" in entries["zeros"]["reason"]
    assert entries["raises"]["status"] == "failed" and entries["raises"]["reason"] == "RuntimeError: boom"
    assert entries["missing"]["status"] == "unavailable" and entries["missing"]["reason"] == "not here (test)"
    for name in ("nan", "zeros", "raises", "missing"):
        assert "median_ms" not in entries[name]


def test_cpu_cell_compile_budget(cpu_cell):
    entries, _ = cpu_cell
    compiled = entries["torch-compile"]
    assert compiled["status"] == "unavailable" and "compile budget" in compiled["reason"]


def test_cpu_cell_progress(cpu_cell):
    _, calls = cpu_cell
    assert [c[0] for c in calls] == list(range(len(calls)))
    assert calls[0][2] == "lstm/tiny cudnn-fp32"


def test_cpu_cell_results_are_json(cpu_cell):
    entries, _ = cpu_cell
    json.dumps(list(entries.values()), allow_nan=False)


def test_without_torch_the_baselines_say_why(monkeypatch):
    """No torch: every cuDNN and PyTorch row is 'unavailable' with the reason; nothing raises."""
    monkeypatch.setitem(sys.modules, "torch", None)          # `import torch` now raises ImportError
    preset = engine.preset("lstm")
    config = BenchConfig("tiny", 3, 4, 1, 2, 2)
    net = config.network(preset.cell)
    params = engine.init_params(net)
    inputs = [np.ones((2, 2, 3), np.float32), np.full((2, 2, 3), -1.0, np.float32)]
    case = Case("lstm", preset.cell, preset, config, net, params, inputs, np, device="cpu")
    ref = reference.run(net, params, inputs[0].astype(np.float64)).outputs
    impls = [Cudnn("fp32", timer="wall"), Cudnn("fp16", timer="wall"), TorchCell("eager", timer="wall"),
             TorchCell("compile", CompileBudget(10), timer="wall"), TorchCell("script", CompileBudget(10), timer="wall"),
             EngineBackend("reference", timer="wall")]
    entries = {e["name"]: e for e in measure_cell(case, impls, ref, reps=20, warmup=1, buffers=2)}
    for name in ("cudnn-fp32", "cudnn-fp16", "torch-eager"):
        assert entries[name]["status"] == "unavailable"
        assert "PyTorch is not importable" in entries[name]["reason"]
    assert entries["torch-compile"]["status"] == "unavailable"
    assert entries["reference"]["status"] == "ok"


class Recorder(Implementation):
    """Runs the NumPy reference and records the cell's steps in its details."""

    name, family, timer = "recorder", "test", "wall"

    def setup(self, case):
        self.case = case
        self.detail["steps"] = case.config.steps

    def forward(self, k, poison=False):
        case = self.case
        return reference.run(case.network, case.params, case.inputs[k].astype(np.float64)).outputs


def test_details_are_per_cell():
    """One implementation object measures every cell; its details must not leak from one to the next."""
    impl = Recorder()
    entries = []
    for steps in (2, 3):
        config = BenchConfig(f"t{steps}", 3, 4, 1, steps, 2)
        net = config.network(engine.preset("gru").cell)
        params = engine.init_params(net)
        inputs = [np.random.default_rng(k).standard_normal((steps, 2, 3)).astype(np.float32) for k in range(2)]
        case = Case("gru", net.cell, engine.preset("gru"), config, net, params, inputs, np, device="cpu")
        ref = reference.run(net, params, inputs[0].astype(np.float64)).outputs
        (entry,) = measure_cell(case, [impl], ref, reps=20, warmup=1, buffers=2)
        assert entry["status"] == "ok", entry["reason"]
        entries.append(entry)
    assert [e["detail"]["steps"] for e in entries] == [2, 3]


# ---- the autotuned schedule as its own row ---------------------------------------------------------------

def _tiny_case(name="gru"):
    config = BenchConfig("tiny", 3, 4, 2, 3, 2)
    net = config.network(engine.preset(name).cell)
    params = engine.init_params(net)
    inputs = [np.random.default_rng(k).standard_normal((3, 2, 3)).astype(np.float32) for k in range(2)]
    case = Case(name, net.cell, engine.preset(name), config, net, params, inputs, np, device="cpu")
    return case, reference.run(net, params, inputs[0].astype(np.float64)).outputs


def test_auto_row_without_a_gpu_says_why(no_gpu):
    case, ref = _tiny_case()
    (entry,) = measure_cell(case, [AutoSchedule(timer="wall")], ref, reps=20, warmup=1, buffers=2)
    assert entry["name"] == "auto" and entry["family"] == "engine"
    assert entry["status"] == "unavailable" and "no CUDA device (test)" in entry["reason"]


def test_auto_row_runs_the_autotuners_choice(monkeypatch):
    """On a GPU the choice is tune()'s; here tune and prepare are stand-ins that run the NumPy reference."""
    from engine.schedules import autotune
    monkeypatch.setattr(backends, "gpu_status", lambda: (True, "a GPU (test)"))
    asked = []

    def tune(network, params, steps, batch):
        asked.append((network.cell.name, steps, batch))
        return autotune.Choice("persistent", autotune.TileConfig(2), "fastest (test)", "key", cached=True)

    class Program:
        def __init__(self, network, params):
            self.network, self.params = network, params

        def run(self, x, poison=False):
            return reference.run(self.network, self.params, np.asarray(x, dtype=np.float64))

    monkeypatch.setattr(autotune, "tune", tune)
    monkeypatch.setattr(autotune, "prepare", lambda candidate, network, params: Program(network, params))
    case, ref = _tiny_case()
    (entry,) = measure_cell(case, [AutoSchedule(timer="wall")], ref, reps=20, warmup=1, buffers=2)
    assert entry["status"] == "ok", entry["reason"]
    assert asked == [("gru", 3, 2)]
    assert entry["detail"]["schedule"] == "persistent" and entry["detail"]["why"] == "fastest (test)"
    assert entry["detail"]["config"] == autotune.TileConfig(2).label() and entry["detail"]["cached"] is True
    assert entry["detail"]["poisoned"] is True and entry["reps"] == 20


# ---- the engine in reduced precision: rows, speedups over cuDNN in the same mode, gating -------------------

REDUCED = ("tf32", "fp16", "bf16")
LONG_NAMES = {"fp32": "float32", "tf32": "tf32", "fp16": "float16", "bf16": "bfloat16"}


def test_reduced_precision_rows_are_named_and_ordered():
    from engine.bench.implementations import default_implementations
    everything = default_implementations(1.0)
    names = [i.name for i in everything]
    # after the fp32 rows, each reduced mode: cuDNN first, then the fused backend (its mode path), the engine's
    # schedules and auto in that mode; float32x3 has no cuDNN mode
    assert names[7:25] == [f"{base}-{mode}" for mode in REDUCED
                           for base in ("cudnn", "fused", "graph", "persistent", "scan", "auto")]
    assert names[25:30] == [f"{base}-fp32x3" for base in ("fused", "graph", "persistent", "scan", "auto")]
    assert not {"naive-bf16", "naive-tf32", "naive-fp32x3", "cudnn-fp32x3"} & set(names)     # strict fp32 only
    by_name = {i.name: i for i in everything}
    for mode in REDUCED:
        for base in ("fused", "graph", "persistent", "scan", "auto"):
            row = by_name[f"{base}-{mode}"]
            assert (row.family, row.precision, row.tf32) == ("engine", mode, mode == "tf32")
    assert isinstance(by_name["auto-fp16"], AutoSchedule)
    for name in ("graph", "persistent", "auto", "fused", "naive"):
        assert (by_name[name].precision, by_name[name].tf32) == ("fp32", False)


def test_reduced_precision_rows_are_selectable_by_name():
    from engine.bench.implementations import default_implementations, implementation_choices
    everything = default_implementations(1.0)
    assert {"persistent-bf16", "graph-tf32", "auto-fp16"} <= set(implementation_choices())
    (row,) = select(everything, ["persistent-bf16"])
    assert (row.name, row.backend, row.precision) == ("persistent-bf16", "persistent", "bf16")
    assert [i.name for i in select(everything, ["cudnn-tf32", "graph-tf32", "persistent"])] == \
        ["persistent", "cudnn-tf32", "graph-tf32"]                              # measuring order, not asked order
    (fused,) = select(everything, ["fused-bf16"])
    assert (fused.backend, fused.precision) == ("fused", "bf16")
    (split,) = select(everything, ["fused-fp32x3"])
    assert (split.backend, split.precision) == ("fused", "fp32x3")
    with pytest.raises(BackendError, match="unknown implementation 'naive-fp32x3'"):
        select(everything, ["naive-fp32x3"])
    with pytest.raises(ValueError, match="not one of fp32, tf32, fp16, bf16"):
        EngineBackend("persistent", precision="float16")                        # the harness takes short names


def test_run_bench_accepts_reduced_precision_rows_by_name(no_gpu):
    """The name is checked before the GPU is looked for: an unknown one is refused, a known one gets as far
    as the GPU check."""
    with pytest.raises(BackendError, match="unknown implementation 'naive-fp16'"):
        run_bench(["lstm"], ["8,8,1,2,2"], implementations=["naive-fp16"])
    with pytest.raises(BackendError, match="needs a CUDA GPU"):
        run_bench(["lstm"], ["8,8,1,2,2"], implementations=["persistent-bf16", "auto-tf32"])


def test_short_precision_names_are_the_engines():
    from engine.codegen.precision import PRECISIONS
    for short, long in LONG_NAMES.items():
        assert PRECISIONS[long].short == short
        expected = {} if short == "fp32" else {"precision": long}
        assert EngineBackend("graph", precision=short).precision_options() == expected


def test_a_fused_mode_rows_detail_says_which_step_product_and_parts_ran():
    """After the timed runs the row's detail has the program's step product (the fused modes' product()) and, in
    float32x3, the parts that ran (after any fallback); a program without them adds nothing."""
    import types
    row = EngineBackend("fused", precision="fp32x3")
    row.program = types.SimpleNamespace(replayed="replayed from CUDA graphs", precision="float32x3", x3_parts="tf32",
                                        product=lambda: "cublaslt")
    row.teardown()
    assert (row.detail["step_product"], row.detail["x3_parts"], row.detail["replayed"]) == (
        "cublaslt", "tf32", "replayed from CUDA graphs")
    plain = EngineBackend("graph")
    plain.program = types.SimpleNamespace(replayed=None)
    plain.teardown()
    assert "step_product" not in plain.detail and "x3_parts" not in plain.detail


def _entry(name, precision, median_ms=None, status="ok"):
    entry = {"name": name, "family": name.split("-")[0], "precision": precision, "status": status}
    return entry if median_ms is None else dict(entry, median_ms=median_ms)


def test_speedup_over_cudnn_in_the_same_mode():
    entries = [_entry("cudnn-fp32", "fp32", 8.0), _entry("naive", "fp32", 16.0), _entry("persistent", "fp32", 4.0),
               _entry("cudnn-bf16", "bf16", 6.0), _entry("persistent-bf16", "bf16", 2.0),
               _entry("cudnn-fp16", "fp16", status="failed"), _entry("graph-fp16", "fp16", 3.0),
               _entry("graph-tf32", "tf32", 5.0)]                                  # no cudnn-tf32 row at all
    add_derived(entries, flops_total=10 ** 9, floor_ms=1.0)
    speedup = {e["name"]: e.get("speedup") for e in entries}
    assert speedup["persistent-bf16"] == {"vs_cudnn_fp32": 4.0, "vs_naive": 8.0, "vs_cudnn_same": 3.0}
    assert speedup["cudnn-bf16"]["vs_cudnn_same"] == 1.0
    assert speedup["cudnn-fp32"]["vs_cudnn_same"] == 1.0
    assert speedup["persistent"]["vs_cudnn_same"] == speedup["persistent"]["vs_cudnn_fp32"] == 2.0
    assert speedup["graph-fp16"] == {"vs_cudnn_fp32": pytest.approx(8 / 3), "vs_naive": pytest.approx(16 / 3),
                                     "vs_cudnn_same": None}                    # its cuDNN row failed
    assert speedup["graph-tf32"]["vs_cudnn_same"] is None                     # its cuDNN row did not run
    assert speedup["cudnn-fp16"] is None                                       # not ok: no speedups


class ReferenceStandIn(Implementation):
    """A baseline that runs the NumPy reference with the matmul rounding of its precision mode, its outputs
    multiplied by `scale`."""

    timer = "wall"

    def __init__(self, name, family, precision, scale=1.0):
        super().__init__()
        self.name, self.family, self.precision, self.scale = name, family, precision, scale

    def setup(self, case):
        self.case = case

    def forward(self, k, poison=False):
        case = self.case
        return reference.run(case.network, case.params, np.asarray(case.inputs[k], dtype=np.float32),
                             dtype=np.float32, precision=LONG_NAMES[self.precision]).outputs * self.scale


class FakeSchedule:
    """A stand-in for a schedule module (engine.schedules.persistent): prepare(network, params, dtype,
    **options) records its options; the program runs the NumPy reference in the precision it was given,
    its outputs multiplied by `scale` (1 + a relative error) or replaced by NaN."""

    def __init__(self):
        self.options, self.scale = [], 1.0

    def prepare(self, network, params, dtype=np.float32, **options):
        self.options.append(options)
        schedule = self

        class Program:
            def run(self, x, initial_states=None, poison=False):
                result = reference.run(network, params, np.asarray(x), initial_states, dtype=dtype,
                                       precision=options.get("precision", "float32"))
                return dataclasses.replace(result, outputs=result.outputs * schedule.scale)

        return Program()


@pytest.fixture
def fake_persistent(monkeypatch):
    schedule, real_get = FakeSchedule(), backends.get
    monkeypatch.setattr(backends, "get", lambda name: schedule if name == "persistent" else real_get(name))
    return schedule


def test_reduced_precision_rows_pass_their_precision_to_prepare(fake_persistent):
    case, ref = _tiny_case("lstm")
    impls = [ReferenceStandIn("cudnn-fp32", "cudnn", "fp32"), EngineBackend("persistent", timer="wall"),
             *[EngineBackend("persistent", timer="wall", precision=mode) for mode in REDUCED]]
    entries = {e["name"]: e for e in measure_cell(case, impls, ref, reps=20, warmup=1, buffers=2)}
    assert fake_persistent.options == [{}, {"precision": "tf32"}, {"precision": "float16"},
                                       {"precision": "bfloat16"}]               # fp32 calls as before the modes
    for mode in REDUCED:
        entry = entries[f"persistent-{mode}"]
        assert entry["status"] == "ok", entry["reason"]
        assert (entry["precision"], entry["tf32"], entry["detail"]["precision"]) == (mode, mode == "tf32",
                                                                                      LONG_NAMES[mode])
        assert entry["error"]["tolerance"] == TOLERANCE[mode]
        # the rounding is real: the reduced row is further from float64 than the fp32 one
        assert entry["error"]["rel"] > 10 * entries["persistent"]["error"]["rel"]
        for against in ("vs_reference", "vs_cudnn_fp32"):
            curves = entry["divergence"][against]
            assert len(curves["max"]) == len(curves["mean"]) == case.config.steps
        assert entry["error_vs_cudnn_fp32"]["rel"] > 0


@pytest.mark.parametrize("mode", ["fp32", *REDUCED])
def test_reduced_precision_rows_are_gated_like_cudnn(fake_persistent, mode):
    """Relative error 0.5 against float64: an fp32 row is wrong and not timed; a reduced-precision row (engine
    or cuDNN) is reported outside its tolerance but timed. A non-finite output disqualifies every row."""
    case, ref = _tiny_case("lstm")
    fake_persistent.scale = 1.5
    cudnn = ReferenceStandIn(f"cudnn-{mode}", "cudnn", mode, scale=1.5)
    entries = measure_cell(case, [EngineBackend("persistent", timer="wall", precision=mode), cudnn], ref,
                           reps=20, warmup=1, buffers=2)
    for entry in entries:
        assert entry["error"]["rel"] == pytest.approx(0.5, rel=1e-2)
        assert entry["error"]["within_tolerance"] is False
        if mode == "fp32":
            assert entry["status"] == "failed" and "exceeds" in entry["reason"]
        else:
            assert entry["status"] == "ok" and entry["reps"] == 20, entry["reason"]
    fake_persistent.scale = np.nan
    (entry,) = measure_cell(case, [EngineBackend("persistent", timer="wall", precision=mode)], ref, reps=20,
                            warmup=1, buffers=2)
    assert entry["status"] == "failed" and "non-finite" in entry["reason"] and "median_ms" not in entry


def test_auto_row_in_reduced_precision_tunes_and_prepares_in_it(monkeypatch):
    from engine.schedules import autotune
    monkeypatch.setattr(backends, "gpu_status", lambda: (True, "a GPU (test)"))
    asked = []

    def tune(network, params, steps, batch, **options):
        asked.append(("tune", options))
        return autotune.Choice("graph", autotune.TileConfig(2), "fastest (test)", "key", cached=False)

    def prepare(candidate, network, params, **options):
        asked.append(("prepare", options))
        return FakeSchedule().prepare(network, params, np.float32, **options)

    monkeypatch.setattr(autotune, "tune", tune)
    monkeypatch.setattr(autotune, "prepare", prepare)
    case, ref = _tiny_case()
    (entry,) = measure_cell(case, [AutoSchedule(timer="wall", precision="fp16")], ref, reps=20, warmup=1, buffers=2)
    assert entry["status"] == "ok", entry["reason"]
    assert (entry["name"], entry["precision"], entry["tf32"]) == ("auto-fp16", "fp16", False)
    assert asked == [("tune", {"precision": "float16"}), ("prepare", {"precision": "float16"})]
    assert entry["detail"]["schedule"] == "graph" and entry["detail"]["precision"] == "float16"


def reduced_results() -> dict:
    results = fake_results()
    cell = results["cells"][0]
    entries = [_entry("cudnn-fp32", "fp32", 8.0), _entry("persistent", "fp32", 4.0),
               _entry("cudnn-bf16", "bf16", 6.0), _entry("persistent-bf16", "bf16", 2.0),
               _entry("graph-fp16", "fp16", 3.0)]
    add_derived(entries, flops_total=10 ** 9, floor_ms=1.0)
    cell["implementations"] = [dict(e, min_ms=e["median_ms"], max_ms=e["median_ms"], error={"rel": 1e-3})
                               for e in entries]
    return results


def test_markdown_table_shows_the_same_mode_speedup():
    table = markdown_table(reduced_results()).splitlines()
    assert table[0].split("|")[5:-1] == [" cudnn-fp32 ", " persistent ", " cudnn-bf16 ", " persistent-bf16 ",
                                         " graph-fp16 "]
    assert table[2].split(" | ")[4:] == ["8 (1.00x)", "4 (2.00x)", "6 (1.33x)", "2 (4.00x; 3.00x same mode)",
                                         "3 (2.67x) |"]                       # no cudnn-fp16: no same-mode ratio
    assert "(Nx; Mx same mode)" in table[-1]
    assert "same mode" not in markdown_table(fake_results())                # files from before: as they were


def test_text_summary_has_a_same_mode_column():
    """Columns: name, median, min-max, x floor, TFLOP/s, vs cuDNN, vs same, vs naive, ..."""
    text = text_summary(reduced_results())
    assert "vs cuDNN  vs same vs naive" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("persistent-bf16"))
    assert row.split()[5:8] == ["4.00", "3.00", "-"]
    old = next(line for line in text_summary(fake_results()).splitlines() if line.strip().startswith("naive"))
    assert old.split()[5:8] == ["0.50", "-", "1.00"]                          # no vs_cudnn_same in old files


def test_rows_that_cannot_take_a_cell_say_why_before_running():
    """LSTMP (values of size P): the wavefront schedules and the naive backend refuse it as 'unavailable' with the
    reason, before anything is built; the fused backend takes it."""
    preset = engine.preset("lstm_proj")
    config = BenchConfig("tiny", 5, 7, 2, 6, 3)
    net = config.network(preset.cell)
    case = Case("lstm_proj", preset.cell, preset, config, net, engine.init_params(net, seed=0), [], np, device="cpu")
    for name in ("graph", "persistent"):
        reason = EngineBackend(name).unavailable_reason(case)
        assert f"schedule '{name}' cannot run cell 'lstm_proj'" in reason and "projection size P" in reason
    assert "does not take cell 'lstm_proj'" in EngineBackend("naive").unavailable_reason(case)
    assert EngineBackend("fused").unavailable_reason(case) is None


def test_source_hash_names_the_code_not_the_caches(tmp_path):
    """environment()'s source_hash: the same files give the same hash, a changed kernel or module another, and the
    caches (__pycache__, .pyc, .cubin) none; the repository's own hash is what the benchmark records."""
    from engine.bench.runner import environment, source_hash
    for folder, name, text in (("engine", "a.py", "x = 1\n"), ("kernels", "k.cu", "// k\n")):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / name).write_text(text)
    first = source_hash(tmp_path)
    (tmp_path / "engine" / "__pycache__").mkdir()
    (tmp_path / "engine" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\x00")
    (tmp_path / "kernels" / "k.cubin").write_bytes(b"\x01")
    assert source_hash(tmp_path) == first and len(first) == 16
    (tmp_path / "kernels" / "k.cu").write_text("// k, changed\n")
    assert source_hash(tmp_path) != first
    assert "source_hash" in environment.__code__.co_names          # recorded with every result (needs a GPU to run)
