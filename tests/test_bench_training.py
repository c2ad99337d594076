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


def test_the_training_products_are_three_times_the_forwards_matmuls_where_nothing_is_stacked():
    """engine.bench.flops.training_products (what benchmarks/probe_gemm_floor.py times): for the LSTM and the GRU,
    forward, input adjoint plus state adjoints, and weight gradients are each the forward's matmul FLOPs (counted
    from the cell graph by layer_step_flops), plus a bias GEMV a bias vector; lstm_proj has two GEMMs a step each
    way; lstm_fgr's step GEMMs are its stacked grid (K = 4H) with the zero blocks, its weight gradients without."""
    from engine.bench.flops import training_product_flops, training_products
    from engine.flops import network_flops
    T, B = 7, 3
    for name in ("lstm", "gru"):
        network = engine.Network(engine.preset(name).cell, 5, 8, 2)
        products = training_products(network, T, B)
        forward = network_flops(network, T, B)["matmul_per_step"] * T
        biases = sum(2 * M * K for layer in products["gradients"] for M, N, K in layer if N == 1)
        assert biases > 0
        assert training_product_flops(products, T) - biases == 3 * forward, name
    proj = training_products(engine.Network(engine.preset("lstm_proj").cell, 5, 8, 2, proj_size=6), T, B)
    assert proj["step_forward"][0] == [(B, 4 * 8, 6), (B, 6, 8)]
    assert proj["step_backward"][0] == [(B, 8, 6), (B, 6, 4 * 8)]
    H = 8
    fgr = training_products(engine.Network(engine.preset("lstm_fgr").cell, 5, H, 1), T, B)
    assert fgr["step_forward"][0] == [(B, 4 * H, 4 * H)] and fgr["step_backward"][0] == [(B, 4 * H, 4 * H)]
    recurrent = sum(M * N for M, N, K in fgr["gradients"][0] if N > 1 and M == H)     # the W_x gradient has M = I = 5
    assert recurrent == 13 * H * H          # R_{z,i,f,o} h, and R_{i,f,o} of i, f, o: 13 of the grid's 16 blocks


def test_the_reduced_precision_rows_and_their_reasons_without_a_gpu():
    from engine.bench.training import training_implementations
    names = ["cudnn-tf32", "fused-tf32", "cudnn-bf16", "fused-bf16", "cudnn-fp16", "fused-fp16"]
    impls = training_implementations(names, "cpu")
    assert [i.name for i in impls] == ["cudnn-tf32", "engine-fused-tf32", "cudnn-bf16", "engine-fused-bf16",
                                       "cudnn-fp16", "engine-fused-fp16"]
    assert all(i.tolerance is None for i in impls)            # a mode's error is reported, not held to TOLERANCE
    assert [i.name for i in training_implementations(["cudnn-fp32", "fused"], "cpu")] == ["cudnn-fp32", "engine-fused"]
    results = bench_training(["lstm"], ["3,4,1,3,2"], implementations=names, reps=2, device="cpu")
    rows = {r["name"]: r for r in results["cells"][0]["implementations"]}
    assert {r["status"] for r in rows.values()} == {"unavailable"}
    assert rows["cudnn-bf16"]["reason"] == "cuDNN runs on a CUDA GPU"
    assert rows["engine-fused-bf16"]["reason"] == "engine-fused-bf16 runs on the GPU only"
    assert "fp32, TF32 off" == results["settings"]["precision"]          # the fp32 rows' statement, unchanged


class PoisonedGradient(EngineTrain):
    def step(self, k):
        dx, params = super().step(k)
        return dx * np.float32(np.nan), params


def test_a_reduced_mode_row_reports_its_error_and_is_not_timed_where_not_finite():
    """The reference's emulation of bf16 stands in for the GPU's row: its error is the mode's (about 1e-3 against
    float64, over the fp32 rows' 1e-3 tolerance), reported and timed; a NaN gradient is "wrong" and not timed."""
    results = bench_training(["lstm"], ["3,8,2,6,4"], implementations=[EngineTrain("reference", "bf16"),
                                                                       PoisonedGradient("reference", "bf16")],
                             reps=2, device="cpu")
    ok, poisoned = results["cells"][0]["implementations"]
    assert ok["name"] == "engine-reference-bf16" and ok["status"] == "ok" and ok["median_ms"] > 0
    assert 1e-5 < ok["error"]["params_max"] < 5e-2 and ok["error"]["tolerance"] is None
    assert poisoned["status"] == "wrong" and "median_ms" not in poisoned and "NaN or Inf" in poisoned["reason"]
