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
