"""The training-step benchmark (engine/bench/training.py) on the CPU: the harness's checks and table, with the
engine's NumPy path as the implementation (the GPU rows, cuDNN and the naive CuPy path, run on the GPU machine:
`python -m engine bench --train`)."""
from __future__ import annotations

import json

import numpy as np

import engine
from engine.bench.training import EngineTrain, bench_training, training_table


def test_a_correct_step_is_checked_then_timed_and_saved(tmp_path):
    results = bench_training(["gru", "lstm"], ["3,5,2,4,2"], reps=2, warmup=1, device="cpu", out_dir=tmp_path)
    assert [c["preset"] for c in results["cells"]] == ["gru", "lstm"]
    for cell in results["cells"]:
        (row,) = cell["implementations"]
        assert row["name"] == "engine-reference" and row["status"] == "ok", row
        assert row["error"]["x"] < 1e-5 and row["error"]["params_max"] < 1e-5      # fp32 against float64
        assert row["median_ms"] > 0 and row["reps"] == 2
    (saved,) = results["saved_to"]
    assert json.loads(open(saved).read())["schema"] == "cellforge/train-bench"
    table = training_table(results)
    assert "| gru | I3-H5-L2-T4-B2 | 3,5,2,4,2 |" in table and "engine-reference" in table


class ScaledGradient(EngineTrain):
    """A deliberately wrong implementation: its gradient of x is 1% too large."""

    def step(self, k):
        dx, params = super().step(k)
        return dx * np.float32(1.01), params


def test_a_wrong_gradient_is_caught_and_not_timed():
    wrong = ScaledGradient("reference")
    results = bench_training(["lstm"], ["3,4,1,3,2"], implementations=[wrong], reps=2, device="cpu")
    (row,) = results["cells"][0]["implementations"]
    assert row["status"] == "wrong" and "median_ms" not in row
    assert 0.005 < row["error"]["x"] < 0.02


def test_the_bench_command_without_a_gpu_says_so(capsys):
    if engine.backends.gpu_status()[0]:
        import pytest
        pytest.skip("a GPU is present: the command runs there")
    from engine.cli import main
    assert main(["bench", "--train", "--config", "3,4,1,3,2"]) != 0
    assert "needs a CUDA GPU" in capsys.readouterr().err
