"""float32x3 (3xTF32) on the CPU: the split and its emulation's error, the reference in the mode, nvcc on its
generated CUDA, the name, the training step's refusal, auto's opt-in and the bench rows. (On the GPU:
tests/gpu/test_precision_fp32x3_gpu.py.)"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from nvcc_check import compile_sources
from test_schedules_cpu import render

import engine
from engine.backends import reference
from engine.bench.divergence import error_bound
from engine.bench.implementations import default_implementations
from engine.codegen.precision import precision as lookup
from engine.errors import BackendError, CompileError
from engine.rounding import mode_matmul, round_like, round_operand, split_tf32, weight_bits
from engine.schedules import autotune
from engine.schedules.tiling import H100, TileConfig

EPS32 = 2.0 ** -24


def product(w, a):
    return a @ w.T


def test_the_split_parts_are_tf32_values_and_sum_to_within_2_to_the_minus_23():
    values = np.random.default_rng(0).standard_normal(10000).astype(np.float32)
    hi, lo = split_tf32(values)
    for part in (hi, lo):
        assert np.all(part.astype(np.float32).view(np.uint32) & 0x1FFF == 0), "a part is not a TF32 value"
    assert np.array_equal(hi, round_operand(values, "tf32"))
    assert np.max(np.abs(hi + lo - values) / np.abs(values)) <= 2.0 ** -23
    assert np.isnan(split_tf32(np.float32(np.inf))[1])          # as the GPU's v - hi: Inf - Inf


@pytest.mark.parametrize("k", [8, 100, 1024, 2560])
def test_the_emulation_is_fp32_accurate_where_tf32_is_not(k):
    rng = np.random.default_rng(k)
    w = rng.standard_normal((64, k)).astype(np.float32).astype(np.float64)
    a = rng.standard_normal((16, k)).astype(np.float32).astype(np.float64)
    exact, scale = product(w, a), np.abs(a) @ np.abs(w).T             # error relative to sum |a_k w_k|
    x3 = np.max(np.abs(mode_matmul(w, a, "float32x3", product) - exact) / scale)
    tf32 = np.max(np.abs(mode_matmul(w, a, "tf32", product) - exact) / scale)
    assert x3 <= 4 * EPS32, x3                  # 2^-22: the dropped lo*lo and the lo's rounding, per product
    assert tf32 > 1e-5 and x3 < tf32 / 100, (x3, tf32)


def test_the_emulation_is_the_three_products_of_the_parts():
    rng = np.random.default_rng(1)
    w, a = rng.standard_normal((8, 40)), rng.standard_normal((5, 40))
    (wh, wl), (ah, al) = split_tf32(w), split_tf32(a)
    want = ah @ wl.T + al @ wh.T + ah @ wh.T
    assert np.array_equal(mode_matmul(w, a, "float32x3", product), want)


def test_the_name_the_storage_and_the_refusals_of_a_single_rounding():
    mode = lookup("fp32x3")
    assert mode.name == "float32x3" and mode.mode == 4 and mode.k_step == 8 and mode.weight_type == "float"
    assert mode.split and mode.fp32_accurate and mode.tensor_cores and not lookup("tf32").split
    w = np.random.default_rng(2).standard_normal((3, 5))
    assert np.array_equal(weight_bits(w, "float32x3"), w.astype(np.float32))    # unrounded: split at load
    with pytest.raises(CompileError, match="float32x3.*split_tf32"):
        round_operand(w, "float32x3")
    with pytest.raises(CompileError, match="float32x3"):
        round_like(w, "float32x3")


def small_case(cell="lstm", layers=2):
    network = engine.Network(engine.preset(cell).cell, input_size=12, hidden_size=20, num_layers=layers)
    params = engine.init_params(network, seed=1)
    x = np.random.default_rng(2).standard_normal((9, 3, 12))
    return network, params, x


@pytest.mark.parametrize("cell", ["lstm", "gru", "gru_cho", "peephole_lstm", "mgu"])
def test_the_reference_in_float32x3_is_near_float64_and_far_from_tf32(cell):
    network, params, x = small_case(cell)
    strict = reference.run(network, params, x).outputs
    x3 = reference.run(network, params, x, precision="float32x3").outputs
    tf32 = reference.run(network, params, x, precision="tf32").outputs
    scale = np.max(np.abs(strict))
    x3_err, tf32_err = np.max(np.abs(x3 - strict)) / scale, np.max(np.abs(tf32 - strict)) / scale
    assert 0 < x3_err < 1e-5 and x3_err < tf32_err / 30, (x3_err, tf32_err)


def test_the_training_step_refuses_float32x3_by_name():
    network, params, x = small_case()
    with pytest.raises(BackendError, match="float32x3.*hint"):
        engine.bptt(network, params, x, np.ones((9, 3, 20)), precision="float32x3")
    from engine.autodiff.fused_planner import training_plan
    with pytest.raises(BackendError, match="float32x3"):
        training_plan(network.cell, precision="fp32x3")


@pytest.mark.nvcc
def test_float32x3_sources_compile_with_nvcc(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    cases = [("lstm-mma", ("lstm", 29, 64, 2, 19, TileConfig(), True)),
             ("gru_cho-gemv", ("gru_cho", 29, 64, 1, 3, TileConfig(), True)),
             ("lstm-graph-streamed", ("lstm", 29, 64, 2, 40, TileConfig(resident=False), False)),
             ("gru-layer-by-layer", ("gru", 64, 96, 3, 33, TileConfig(layers_per_launch=1), True))]
    sources = {}
    for label, args in cases:
        _, source, tiling = render(*args, precision="float32x3")
        assert ("rnn_mma_gemms<RNN_TF32X3" in source) == tiling.mma, label
        sources[label] = source
    compile_sources(sources, tmp_path, tail=4000)


def test_auto_tries_float32x3_only_when_allowed():
    network = engine.Network(engine.preset("lstm").cell, input_size=64, hidden_size=128, num_layers=2)
    strict = autotune.candidates(network, 32, H100)
    allowed = autotune.candidates(network, 32, H100, tensor_core_fp32=True)
    assert all(c.precision is None for c in strict) and strict[0].schedule == "fused"
    assert allowed[:len(strict)] == strict, "the strict candidates come first, the first stays the yardstick"
    extra = allowed[len(strict):]
    assert extra and all(c.precision == "float32x3" for c in extra)
    assert {c.schedule for c in extra} == {"fused", "graph", "persistent"} and extra[0].schedule == "fused"
    with_lengths = autotune.candidates(network, 32, H100, lengths=True, tensor_core_fp32=True)
    assert {c.schedule for c in with_lengths if c.precision == "float32x3"} == {"graph", "persistent"}  # X3Gate
    assert "[float32x3]" in extra[0].label()
    assert autotune.candidates(network, 32, H100, "tf32", tensor_core_fp32=True) == autotune.candidates(
        network, 32, H100, "tf32")
    keys = {autotune.cache_key(network, 100, 32, "GPU", tensor_core_fp32=flag) for flag in (False, True)}
    assert len(keys) == 2 and any("|float32+3xtf32-gated-wgmma|" in k for k in keys)       # not a choice made ungated
    choice = autotune.Choice("persistent", TileConfig(4), "why", "k", precision="float32x3")
    again = autotune.Choice.from_dict("k", choice.to_dict())
    assert again.precision == "float32x3" and again.candidate == autotune.Candidate("persistent", TileConfig(4),
                                                                                     "float32x3")
    assert "precision" not in autotune.Choice("graph", None, "why", "k").to_dict()   # old entries read as before


def test_the_flag_is_refused_where_it_means_nothing():
    network, params, x = small_case()
    with pytest.raises(BackendError, match="allow_tensor_core_fp32.*float32"):
        engine.run(network, params, x, backend="auto", precision="tf32", allow_tensor_core_fp32=True)
    with pytest.raises(BackendError, match="precision='float32x3'"):
        engine.run(network, params, x, backend="reference", allow_tensor_core_fp32=True)
    with pytest.raises(BackendError, match="True or False"):
        engine.run(network, params, x, allow_tensor_core_fp32="yes")


def test_engine_run_float32x3_on_the_reference_emulates_it():
    network, params, x = small_case()
    result = engine.run(network, params, x, backend="reference", dtype=np.float64, precision="fp32x3")
    assert result.info["precision"] == "float32x3"
    assert np.array_equal(result.outputs, reference.run(network, params, x, precision="float32x3").outputs)


def test_the_bench_has_fp32x3_rows_compared_with_cudnn_fp32():
    names = [i.name for i in default_implementations(0.0)]
    assert {"graph-fp32x3", "persistent-fp32x3", "auto-fp32x3"} <= set(names) and "cudnn-fp32x3" not in names
    cudnn = {"name": "cudnn-fp32", "error": {"rel": 2e-6}}
    row = {"name": "persistent-fp32x3", "precision": "fp32x3", "error": {"rel": 3e-6}}
    bound = error_bound(row, cudnn)
    assert bound["ratio"] == 1.5 and bound["within"] and bound["cudnn_fp32_rel"] == 2e-6
    assert not error_bound(dict(row, error={"rel": 5e-6}), cudnn)["within"]
    assert error_bound(dict(row, precision="tf32"), cudnn) is None and error_bound(row, None) is None


class _Exact:
    def __init__(self, outputs, calls):
        self.outputs, self.calls = outputs, calls

    def run(self, x):
        self.calls.append(x)
        return self


def test_a_float32x3_candidate_is_held_to_twice_strict_fp32s_error_against_float64(monkeypatch):
    rng = np.random.default_rng(3)
    exact = rng.standard_normal((5, 3, 8))
    made = []
    monkeypatch.setattr(autotune.naive, "prepare", lambda network, params, dtype: made.append(dtype) or _Exact(
        exact, calls))
    calls = []
    x = rng.standard_normal((5, 3, 4))
    gate = autotune.X3Gate(np, "network", "params", x)
    scale = np.abs(exact).max()
    strict = exact + 1e-6 * scale * rng.choice([-1.0, 1.0], exact.shape)          # relative error 1e-6
    assert gate.refuses(exact + 1.9e-6 * scale, strict) is None
    refused = gate.refuses(exact + 2.1e-6 * scale, strict)
    assert refused == ("relative error 2.10e-06 against float64 is over 2x strict fp32's (1.00e-06) on the same input")
    assert made == [np.float64] and len(calls) == 1 and calls[0] is x     # float64, made once, on the tuning input
    # a strict output as exact as float64 still leaves fp32's unit roundoff to the candidate
    assert gate.refuses(exact + 1e-7 * scale, exact) is None and gate.refuses(exact + 2e-7 * scale, exact)

