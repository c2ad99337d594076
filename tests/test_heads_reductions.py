"""Reductions over the hidden units (sum_h, mean_h, the DSL's layer_norm) and weights of heads (W("R", heads=k)):
their meaning on the NumPy reference, the dense form every compiled path runs them in (engine/dense.py) held to it
(the Plan run by NumPy, the fused training step run by NumPy, the scan), gradients by finite differences, and every
bad input refused by name. The GPU paths are held to the reference by the GPU suite, which runs every preset (slstm,
ln_lstm, ln_gru) and the every_op cell (tests/compiler_cells.py, which holds sum_h and mean_h)."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.autodiff import fused_tape
from engine.autodiff.fused_numpy import NumpyRunner
from engine.autodiff.fused_planner import training_plan
from engine.backends import plan_numpy
from engine.dense import compact_gradients, dense, dense_form, diagonal_blocks
from engine.dsl import W, b, cell, layer_norm, mean_h, sigmoid, sum_h, tanh, v
from engine.errors import BackendError, CellGraphError
from engine.schedules.scan import run_arrays
from engine.schedules.scan_grad import scan_gradients


@cell
def normed(x, h, c):
    """LayerNorm of a projection (gain, bias), a joint LayerNorm of two values, a heads weight, and a raw sum_h."""
    a = layer_norm(W("Wx") @ x, v("g1"), b("b1")) + W("R", heads=4) @ h
    p, q = layer_norm([W("Up") @ h, W("Uq") @ x], gain=[v("gp"), v("gq")])
    i = sigmoid(a + p)
    c_next = i * c + (1 - i) * tanh(q + 0.1 * sum_h(c))
    h_next = tanh(c_next - mean_h(c_next))
    return {"h": h_next, "c": c_next}


@cell
def ln_mingru(x, h):
    """A minGRU whose gate is layer-normed and whose candidate has heads: still a linear recurrence (a scan)."""
    z = sigmoid(layer_norm(W("W_z") @ x, v("g")) + b("b_z"))
    h_tilde = W("W_h", heads=2) @ x + b("b_h")
    return {"h": (1 - z) * h + z * h_tilde}


def case(graph, I=6, H=8, L=2, T=7, B=3, seed=0):
    network = engine.Network(graph, I, H, L)
    params = engine.init_params(network, seed=seed)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((T, B, I))
    states = {s: rng.uniform(-0.8, 0.8, (L, B, H)) for s in graph.state_names}
    return network, params, x, states, rng.standard_normal((T, B, H))


# ---- meaning ------------------------------------------------------------------------------------------------------

def test_reductions_broadcast_a_rows_sum_and_mean_to_every_unit():
    value = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(engine.ops.OPS["sum_h"].numpy(value), np.repeat(value.sum(1, keepdims=True), 4, 1))
    np.testing.assert_array_equal(engine.ops.OPS["mean_h"].numpy(value), np.repeat(value.mean(1, keepdims=True), 4, 1))


def test_layer_norm_is_ba_et_al():
    @cell
    def ln(x, h):
        return {"h": layer_norm(W("W") @ x + h, v("g"), b("beta"), eps=1e-3)}
    network, params, x, states, _ = case(ln, L=1)
    run = engine.run(network, params, x, states, backend="reference", dtype=np.float64)
    p, h = params[0], states["h"][0]
    for t in range(x.shape[0]):
        a = x[t] @ p["W"].T + h
        h = (a - a.mean(1, keepdims=True)) / np.sqrt(a.var(1, keepdims=True) + 1e-3) * p["g"] + p["beta"]
        np.testing.assert_allclose(run.outputs[t], h, rtol=0, atol=1e-12)


def test_a_weight_of_heads_is_block_diagonal_and_stored_as_its_blocks():
    network, params, *_ = case(normed)
    assert params[0]["R"].shape == (4, 2, 2) and normed.size_multiple == 4 and normed.fit_size(7) == 8
    blocks = params[0]["R"]
    value = np.random.default_rng(0).standard_normal((5, 8))
    dense_r = engine.dense.block_diagonal(blocks)
    assert np.count_nonzero(dense_r) == blocks.size
    np.testing.assert_allclose(engine.ops.matmul_apply(blocks, value), value @ dense_r.T, rtol=0, atol=1e-14)
    np.testing.assert_array_equal(diagonal_blocks(dense_r, 4), blocks)


def test_heads_round_trip_through_json_and_the_emitted_dsl():
    from engine.dsl_emit import emit_dsl
    again = engine.from_json(engine.to_json(normed))
    assert again == normed and again["R"].attr("heads") == 4
    assert 'W("R", heads=4)' in emit_dsl(normed)


# ---- the dense form, held to the reference -------------------------------------------------------------------------

def test_the_dense_form_rewrites_reductions_and_heads_into_plain_matmuls():
    form = dense_form(normed)
    assert dict(form.heads) == {"R": 4} and sorted(op for _, op in form.fixed) == ["mean_h", "sum_h"]
    ops = {n.op for n in form.cell.nodes}
    assert not ops & {"sum_h", "mean_h"} and all(n.attr("heads") is None for n in form.cell.nodes)
    assert not dense_form(engine.preset("lstm").cell).changed                   # nothing to rewrite


@pytest.mark.parametrize("passes", [None, {"fuse_elementwise": False}], ids=["fused", "unfused"])
def test_the_plan_run_by_numpy_equals_the_reference(passes):
    network, params, x, states, _ = case(normed)
    want = engine.run(network, params, x, states, backend="reference", dtype=np.float64)
    got = plan_numpy.run(network, params, x, states, passes=passes)
    np.testing.assert_allclose(got.outputs, want.outputs, rtol=0, atol=1e-12)
    for s in normed.state_names:
        np.testing.assert_allclose(got.final_states[s], want.final_states[s], rtol=0, atol=1e-12)


def test_the_fused_training_step_run_by_numpy_gives_the_cells_own_gradients():
    network, params, x, states, d_out = case(normed)
    want = engine.bptt(network, params, x, states, d_outputs=d_out)
    params32 = engine.Params([{k: v.astype(np.float32) for k, v in layer.items()} for layer in params.layers])
    tape = fused_tape.record(network, params32, x.astype(np.float32), states, poison=True,
                             runner=NumpyRunner(training_plan(normed)))
    got = tape.backward(d_out.astype(np.float32))
    for layer in range(2):
        assert sorted(got.params[layer]) == sorted(want.params[layer])          # no fixed matrix, R as its blocks
        for name, value in want.params[layer].items():
            assert got.params[layer][name].shape == value.shape, name
            np.testing.assert_allclose(got.params[layer][name], value, rtol=2e-4, atol=2e-5, err_msg=name)


def test_compact_gradients_drops_the_fixed_matrices():
    network, params, *_ = case(normed)
    dense_net, dense_params = dense(network, params)
    assert {"J_sum_h", "J_mean_h"} <= set(dense_params[0]) and dense_params[0]["R"].shape == (8, 8)
    compact = compact_gradients(network, [dict(layer) for layer in dense_params.layers])
    assert sorted(compact[0]) == sorted(params[0]) and compact[0]["R"].shape == (4, 2, 2)


def test_a_layer_norm_min_gru_still_runs_as_a_scan_with_the_cells_own_gradients():
    network, params, x, states, d_out = case(ln_mingru)
    want = engine.run(network, params, x, states, backend="reference", dtype=np.float64)
    dense_net, dense_params = dense(network, params)
    got = run_arrays(dense_net, [dict(dense_params[k]) for k in range(2)], x, states, np.float64, np)
    np.testing.assert_allclose(got.outputs, want.outputs, rtol=0, atol=1e-12)
    grads = scan_gradients(network, params, x, states, d_out, dtype=np.float64, xp=np)
    step = engine.bptt(network, params, x, states, d_outputs=d_out)
    for name, value in step.params[0].items():
        np.testing.assert_allclose(grads.params[0][name], value, rtol=1e-10, atol=1e-12, err_msg=name)


def test_gradients_by_finite_differences():
    network, params, x, states, d_out = case(normed, L=1, T=4)
    grads = engine.bptt(network, params, x, states, d_outputs=d_out)

    def loss(p):
        return float((engine.run(network, p, x, states, backend="reference", dtype=np.float64).outputs * d_out).sum())
    for name in ("R", "g1", "gp", "gq", "Up"):
        index = (1,) * params[0][name].ndim
        bumped = [engine.Params([{k: v.copy() for k, v in params[0].items()}]) for _ in range(2)]
        bumped[0][0][name][index] += 1e-6
        bumped[1][0][name][index] -= 1e-6
        numeric = (loss(bumped[0]) - loss(bumped[1])) / 2e-6
        assert abs(numeric - grads.params[0][name][index]) <= 1e-6 * max(1.0, abs(numeric)), name


# ---- bad input, refused by name ------------------------------------------------------------------------------------

def test_heads_that_do_not_divide_a_size_are_refused_naming_the_weight():
    with pytest.raises(BackendError, match=r"weight 'R' of cell 'normed' has heads=4, which does not divide its rows "
                                           r"\(hidden_size = 6\); hint: make hidden_size a multiple of 4"):
        engine.Network(normed, 6, 6, 1)


def test_heads_on_an_input_weight_checks_the_input_size():
    with pytest.raises(BackendError, match=r"'W_h'.*heads=2.*cols \(input_size = 5\)"):
        engine.Network(ln_mingru, 5, 8, 1)
    engine.Network(ln_mingru, 6, 8, 3)                 # later layers read H = 8: divisible too


@pytest.mark.parametrize("heads", [0, -2, 2.5, "4", True, 10**6])
def test_a_bad_heads_value_is_refused_in_the_dsl(heads):
    def bad(x, h):
        return {"h": W("R", heads=heads) @ h}
    with pytest.raises(CellGraphError, match=r"field 'heads': W\('R'\): heads must be a whole number from 1 to 4096"):
        cell(bad)


@pytest.mark.parametrize("heads", [0, 2.5, "four", None])
def test_a_bad_heads_value_is_refused_in_json(preset_dict, heads):
    d = preset_dict("gru")
    weight = next(n for n in d["nodes"] if n["op"] == "weight")
    weight["attrs"]["heads"] = heads
    with pytest.raises(CellGraphError, match=rf"node '{weight['name']}'.*attrs.heads"):
        engine.from_dict(d)


def test_a_reduction_over_a_value_that_is_not_h_sized_is_refused_naming_the_node():
    def over_x(x, h):
        return {"h": h + mean_h(x)}
    with pytest.raises(CellGraphError, match=r"'mean_h' reduces over the H hidden units, but 'x' has size I"):
        cell(over_x)


@pytest.mark.parametrize("call, field", [(lambda x, h: layer_norm(h, eps=0.0), "eps"),
                                         (lambda x, h: layer_norm(h, gain=0.5), "gain"),
                                         (lambda x, h: layer_norm([h, h], gain=[v("g")]), "gain"),
                                         (lambda x, h: layer_norm([]), "value")])
def test_layer_norm_refuses_bad_arguments_by_name(call, field):
    def bad(x, h):
        return {"h": call(x, h)}
    with pytest.raises(CellGraphError, match=rf"field '{field}': layer_norm\(\)"):
        cell(bad)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")           # NumPy's divide by zero: what the check names
def test_check_finite_names_the_rsqrt_of_a_layer_norm_without_eps():
    @cell
    def unsafe(x, h):
        centred = W("W") @ x - mean_h(W("W") @ x)
        return {"h": tanh(centred * engine.dsl.rsqrt(mean_h(centred * centred)) + h)}
    network = engine.Network(unsafe, 3, 4, 1)
    params = engine.init_params(network)
    params[0]["W"][...] = 1.0                              # every unit equal: variance 0, rsqrt(0) = inf
    with pytest.raises(BackendError, match=r"node '.*rsqrt.*'.*layer 0.*step 0"):
        engine.run(network, params, np.ones((2, 1, 3)), backend="reference", check_finite=True)
