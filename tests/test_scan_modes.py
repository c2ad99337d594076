"""The scan schedule in the precision modes (engine/schedules/scan_modes.py) on NumPy: its forward and its gradients
against the reference's emulation of each mode (both operands of every matmul rounded, engine.rounding), a
reduction's fixed matrix left unrounded, the modes refused where they do not apply, and the autotuner offering the
scan in every mode. The CUDA side is held to the same emulation in tests/gpu/test_scan_modes_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest
from test_heads_reductions import case as heads_case
from test_heads_reductions import ln_mingru
from test_scan import CASES

import engine
from engine.dense import dense
from engine.errors import BackendError
from engine.schedules import autotune
from engine.schedules.scan import check_mode, run_arrays
from engine.schedules.scan_grad import scan_gradients
from engine.schedules.scan_modes import Products, fixed_weight
from engine.schedules.tiling import DeviceLimits

MODES = ("tf32", "float16", "bfloat16", "float32x3")
TRAINING_MODES = MODES[:3]


def case(graph):
    return heads_case(graph, T=19)


def relative(got, want) -> float:
    return float(np.max(np.abs(np.asarray(got) - want)) / max(np.max(np.abs(want)), 1e-30))


def run_dense(network, params, x, states, precision):
    dense_net, dense_params = dense(network, params)
    return run_arrays(dense_net, [dict(dense_params[k]) for k in range(network.num_layers)], x, states, np.float64,
                      np, precision=precision)


@pytest.mark.parametrize("precision", MODES)
@pytest.mark.parametrize("graph", [*CASES, ln_mingru], ids=[c.name for c in [*CASES, ln_mingru]])
def test_the_scan_in_a_mode_equals_the_references_emulation(graph, precision):
    """Float64 sums on both sides: only the order of the sums differs, so the match is to ~1e-12, while the mode
    itself moves the outputs by far more than that from the strict run (the rounding is there)."""
    network, params, x, states, _ = case(graph)
    want = engine.run(network, params, x, states, backend="reference", dtype=np.float64, precision=precision)
    strict = engine.run(network, params, x, states, backend="reference", dtype=np.float64)
    got = run_dense(network, params, x, states, precision)
    assert relative(got.outputs, want.outputs) <= 1e-11
    for s in graph.state_names:
        assert relative(got.final_states[s], want.final_states[s]) <= 1e-11, s
    assert relative(want.outputs, strict.outputs) > (1e-9 if precision == "float32x3" else 1e-5)


@pytest.mark.parametrize("precision", TRAINING_MODES)
@pytest.mark.parametrize("graph", [*CASES, ln_mingru], ids=[c.name for c in [*CASES, ln_mingru]])
def test_the_scans_gradients_in_a_mode_equal_the_step_by_step_emulation(graph, precision):
    """scan_gradients(precision=...) against engine.bptt's reference in the same mode: every parameter, x and the
    initial states, both operands of every matmul of both passes rounded (the layer norm's sums left exact)."""
    network, params, x, states, d_out = case(graph)
    want = engine.bptt(network, params, x, states, d_outputs=d_out, precision=precision)
    strict = engine.bptt(network, params, x, states, d_outputs=d_out)
    got = scan_gradients(network, params, x, states, d_out, precision=precision)
    assert relative(got.x, want.x) <= 1e-10
    for s in graph.state_names:
        assert relative(got.initial_states[s], want.initial_states[s]) <= 1e-10, s
    moved = 0.0
    for layer in range(network.num_layers):
        for name, value in want.params[layer].items():
            assert relative(got.params[layer][name], value) <= 1e-10, f"layer {layer} '{name}'"
            moved = max(moved, relative(value, strict.params[layer][name]))
    assert moved > 1e-5, "the mode's gradients equal the strict ones: nothing was rounded"


def test_a_reductions_fixed_matrix_is_not_rounded():
    """ln_mingru's layer norm runs as a matmul by a fixed matrix in the dense form; in bf16 its products stay exact,
    as the reference keeps the layer norm's sums (a rounded mean matrix would differ from the emulation)."""
    network, params, *_ = case(ln_mingru)
    dense_net, dense_params = dense(network, params)
    fixed = [n.name for n in dense_net.cell.nodes if n.op == "weight" and fixed_weight(dense_net.cell, n.name)]
    assert fixed, "the dense form has a fixed matrix"
    matrix = dense_params[0][fixed[0]]
    operand = np.random.default_rng(3).standard_normal((5, matrix.shape[1]))
    products = Products("bfloat16", np)
    assert np.array_equal(products.project(operand, matrix, exact=True), operand @ matrix.T)
    assert not np.array_equal(products.project(operand, matrix), operand @ matrix.T)


def test_the_modes_are_refused_where_they_do_not_apply():
    network, params, x, states, d_out = case(CASES[0])
    with pytest.raises(BackendError, match="float32x3"):
        scan_gradients(network, params, x, states, d_out, precision="float32x3")
    with pytest.raises(BackendError, match="precision"):
        scan_gradients(network, params, x, states, d_out, precision="int8")
    with pytest.raises(BackendError, match="float32 only.*dtype=np.float32"):
        check_mode("bfloat16", np.float64)                 # on the GPU: a mode sums in fp32
    assert check_mode("bf16", np.float64, np) == "bfloat16"    # NumPy emulates it in float64
    with pytest.raises(BackendError, match="float32x3"):
        Products("float32x3", np).matmul(np.ones((2, 2)), np.ones((2, 2)))


@pytest.mark.parametrize("precision", ["bfloat16", "tf32"])
def test_the_autotuner_offers_the_scan_in_every_mode(precision):
    network = engine.Network(engine.preset("mingru").cell, 64, 64, 1)
    limits = DeviceLimits(multiprocessors=132, smem_per_block=227 * 1024, name="test GPU", arch="sm_90")
    names = [c.schedule for c in autotune.candidates(network, 8, limits, precision=precision)]
    assert "scan" in names and "fused" in names          # the fused backend's mode path beside it
