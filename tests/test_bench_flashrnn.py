"""FlashRNN as a baseline of the benchmark (issue #34, item 4), on the CPU: its 'vanilla' backend (NX-AI's PyTorch
code) given the engine's weights in FlashRNN's layout computes what the engine's reference computes, for its LSTM,
its GRU and its sLSTM, two layers deep; the harness reports the rows it cannot run with the reason. The timed
'cuda_fused' rows run in the GPU benchmark."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.backends import reference
from engine.bench.configs import BenchConfig
from engine.bench.flashrnn import LAYOUTS, FlashRNN
from engine.bench.implementation import Case
from engine.bench.runner import measure_cell

pytest.importorskip("torch", reason="PyTorch is not installed (pip install -r requirements-test.txt)")
pytest.importorskip("flashrnn", reason="flashrnn is not installed (pip install -r requirements-test.txt)")


def case_of(name: str):
    config = BenchConfig("tiny", 3, 8, 2, 5, 3)
    network = config.network(engine.preset(name).cell)
    params = engine.init_params(network, seed=1)
    inputs = [np.random.default_rng(k).standard_normal((5, 3, 3)).astype(np.float32) for k in range(2)]
    case = Case(name, network.cell, engine.preset(name), config, network, params, inputs, np, device="cpu")
    return case, reference.run(network, params, inputs[0].astype(np.float64)).outputs


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_flashrnn_given_the_engines_weights_computes_the_engines_cell(name):
    case, want = case_of(name)
    row = FlashRNN("fp32", backend="vanilla", timer="wall")
    assert row.unavailable_reason(case) is None
    row.setup(case)
    got = row.output(row.forward(0), np)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    (entry,) = measure_cell(case, [row], want, reps=3, warmup=1, buffers=2)
    assert entry["name"] == "flashrnn-fp32" and entry["family"] == "flashrnn" and entry["status"] == "ok", entry
    assert entry["detail"]["function"] == LAYOUTS[name].function


def test_flashrnn_rows_it_cannot_run_say_why():
    case, _ = case_of("lstm")
    assert "kernels need a GPU" in FlashRNN("bf16").unavailable_reason(case)
    assert "no tf32 mode" in FlashRNN("tf32", backend="vanilla").unavailable_reason(case)
    other, _ = case_of("mgu")
    assert "FlashRNN has no 'mgu'" in FlashRNN("fp32", backend="vanilla").unavailable_reason(other)


def test_flashrnn_rows_share_the_runs_compile_budget(monkeypatch):
    """Its first call builds its kernels: the rows spend one budget, and a row the budget cannot take is reported
    unavailable with the reason instead of stalling the run."""
    import sys

    from engine.bench.implementation import CompileBudget, Unavailable
    module = sys.modules[FlashRNN.__module__]          # (engine.bench is also the name of a function)
    case, _ = case_of("gru")
    budget = CompileBudget(60.0)
    first, second = FlashRNN("fp32", budget=budget), FlashRNN("bf16", budget=budget)
    with pytest.raises(Unavailable, match=r"took 75\.0 s, more than the 60\.0 s left"):
        first.after_first_call(75.0)
    assert first.detail["first_call_s"] == 75.0 and budget.left == -15.0
    monkeypatch.setattr(module, "torch_device_reason", lambda torch, case: None)     # as where CUDA is
    case.device = "cuda"
    assert second.unavailable_reason(case) == "the run's compile budget (60 s) is spent"
