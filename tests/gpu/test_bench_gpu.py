"""A tiny benchmark end to end on the GPU: every implementation runs or says why not, the checks
before timing hold, the results file round-trips, and configurations too large are skipped before
anything is allocated."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from engine.bench import BenchConfig, list_results, load_results, markdown_table, run_bench, text_summary
from engine.cli import main

pytestmark = pytest.mark.gpu

TINY = BenchConfig("tiny", 16, 32, 2, 5, 4)
STATUSES = {"ok", "unavailable", "failed", "skipped"}


def torch_cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch
    return torch.cuda.is_available() and torch.backends.cudnn.is_available()


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory):
    """One tiny run shared by the tests below (each test asks for `cupy` first, which skips without a GPU)."""
    calls = []
    out = tmp_path_factory.mktemp("bench")
    flags_before = tf32_flags()
    # torch.compile is left out (minutes of inductor compiles); TorchScript stands for the compiled group.
    results = run_bench(["lstm"], [TINY], reps=20, warmup=2, buffers=2, compile_budget_s=60, out_dir=out,
                        implementations=["cudnn-fp32", "naive", "fused", "cudnn-tf32", "cudnn-fp16", "cudnn-bf16",
                                         "torch-eager", "torchscript"],
                        progress=lambda done, total, label: calls.append((done, total, label)))
    assert tf32_flags() == flags_before, "run_bench must restore torch's TF32 switches"
    return results, calls, out


def tf32_flags():
    if not torch_cuda_available():
        return None
    import torch
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def entries(results) -> dict:
    (cell,) = results["cells"]
    return {e["name"]: e for e in cell["implementations"]}


def test_every_implementation_runs_or_says_why(cupy, tiny_results):
    results, _, _ = tiny_results
    assert results["status"] == "complete"
    (cell,) = results["cells"]
    assert cell["status"] == "ok", cell["reason"]
    for name, entry in entries(results).items():
        assert entry["status"] in STATUSES
        if entry["status"] != "ok":
            assert entry["reason"], name
    assert entries(results)["naive"]["status"] == "ok", entries(results)["naive"]["reason"]


def test_the_reference_is_checked_against_numpy(cupy, tiny_results):
    results, _, _ = tiny_results
    reference = results["cells"][0]["reference"]
    assert reference["cpu_check_ok"] is True
    assert reference["cpu_check_max_abs"] < 1e-10


def test_timings_errors_and_curves(cupy, tiny_results):
    results, _, _ = tiny_results
    cell = results["cells"][0]
    naive = entries(results)["naive"]
    assert naive["reps"] == 20
    assert 0 < naive["min_ms"] <= naive["median_ms"] <= naive["max_ms"]
    assert naive["error"]["rel"] <= 1e-5 and naive["error"]["nonfinite"] == 0
    assert naive["peak_bytes"] > 0
    assert naive["tflops"] == pytest.approx(cell["flops"]["total"] / (naive["median_ms"] * 1e-3) / 1e12)
    curves = naive["divergence"]["vs_reference"]
    assert len(curves["max"]) == len(curves["mean"]) == TINY.steps
    assert all(m >= a for m, a in zip(curves["max"], curves["mean"]))
    assert naive["speedup"]["vs_naive"] == pytest.approx(1.0)
    floors = cell["floors"]
    assert floors["compute_ms"] > 0 and floors["latency_ms"] > 0
    assert results["device_measurements"]["sgemm_fp32_tflops"] > 1
    assert 0 < results["device_measurements"]["launch_us"] < 1000


@pytest.mark.skipif(not torch_cuda_available(), reason="torch with CUDA and cuDNN is not installed")
def test_cudnn_rows(cupy, tiny_results):
    results, _, _ = tiny_results
    by_name = entries(results)
    cudnn = by_name["cudnn-fp32"]
    assert cudnn["status"] == "ok", cudnn["reason"]
    assert cudnn["tf32_flags"] == {"torch.backends.cuda.matmul.allow_tf32": False,
                                   "torch.backends.cudnn.allow_tf32": False}
    assert by_name["cudnn-tf32"]["tf32_flags"]["torch.backends.cudnn.allow_tf32"] is True
    assert cudnn["error"]["rel"] <= 1e-5
    naive = by_name["naive"]
    assert naive["speedup"]["vs_cudnn_fp32"] == pytest.approx(cudnn["median_ms"] / naive["median_ms"])
    assert len(naive["divergence"]["vs_cudnn_fp32"]["max"]) == TINY.steps
    for precision in ("fp16", "bf16"):
        entry = by_name[f"cudnn-{precision}"]
        if entry["status"] == "ok":
            assert entry["error"]["nonfinite"] == 0 and entry["error"]["rel"] < 0.25
    assert by_name["torch-eager"]["status"] == "ok", by_name["torch-eager"]["reason"]
    compiled = by_name["torch-compile"]
    assert compiled["status"] in STATUSES
    if compiled["status"] == "ok":
        assert compiled["detail"]["variant"] == "torchscript"


def test_progress_is_reported(cupy, tiny_results):
    _, calls, _ = tiny_results
    assert calls and calls[-1][0] == calls[-1][1]
    done = [c[0] for c in calls]
    assert done == sorted(done)
    assert any("naive" in label for _, _, label in calls)


def test_results_file_round_trips(cupy, tiny_results):
    results, _, out = tiny_results
    (path,) = results["saved_to"]
    assert load_results(path) == results
    listed = list_results(out)
    assert listed[0]["path"] == path and listed[0]["presets"] == ["lstm"]
    table = markdown_table(results)
    assert "| lstm | tiny |" in table and "naive" in table
    assert "floors: compute" in text_summary(results)


def test_too_large_is_skipped_before_allocating(cupy, tmp_path):
    huge = BenchConfig("huge", 4096, 65536, 1, 100000, 65536)
    pool = cupy.get_default_memory_pool()
    results = run_bench(["lstm"], [huge], reps=20, implementations=["naive"], out_dir=tmp_path)
    (cell,) = results["cells"]
    assert cell["status"] == "skipped" and "GiB" in cell["reason"]
    assert cell["implementations"] == []
    assert pool.used_bytes() < 1 << 30


def test_cli_end_to_end(cupy, tmp_path, capsys):
    code = main(["bench", "--preset", "gru", "--config", "8,16,1,4,2", "--impl", "naive", "--impl", "torch-eager",
                 "--reps", "20", "--warmup", "1", "--out", str(tmp_path), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert "| gru |" in out and "results:" in out
    (path,) = tmp_path.glob("*.json")
    data = load_results(path)
    assert [e["name"] for e in data["cells"][0]["implementations"]] == ["naive", "torch-eager"]
    assert np.isfinite(data["cells"][0]["implementations"][0]["median_ms"])
