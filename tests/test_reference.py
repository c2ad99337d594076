"""The NumPy reference backend and the parameters it runs on."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import BackendError
from engine.params import Params

NAMES = sorted(engine.presets())


# ---- parameters ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["lstm", "lstm_fgr", "indrnn"])
def test_params_npz_round_trip(name, tmp_path, make_case):
    case = make_case(engine.preset(name), num_layers=3)
    path = tmp_path / "params.npz"
    case.params.save(path)
    loaded = Params.load(path, case.network)
    assert len(loaded.layers) == 3
    for layer, (want, got) in enumerate(zip(case.params.layers, loaded.layers)):
        assert set(got) == set(want), layer
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
            assert got[key].dtype == want[key].dtype
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.npz"], "no temporary file is left behind"


def test_params_load_checks_the_network(tmp_path, make_case):
    case = make_case(engine.preset("lstm"), num_layers=2)
    path = tmp_path / "params.npz"
    case.params.save(path)
    other = engine.Network(case.network.cell, input_size=case.network.input_size + 1,
                           hidden_size=case.network.hidden_size, num_layers=2)
    with pytest.raises(BackendError, match="W_ii"):
        Params.load(path, other)
    gru = engine.Network(engine.preset("gru").cell, case.network.input_size, case.network.hidden_size, 2)
    with pytest.raises(BackendError, match="W_ir"):
        Params.load(path, gru)
    deeper = engine.Network(case.network.cell, case.network.input_size, case.network.hidden_size, 3)
    with pytest.raises(BackendError, match="layer"):
        Params.load(path, deeper)


@pytest.mark.parametrize("keys", [["W"], ["layerX.W"], ["layer0"], ["layer0.W", "layer2.W"]],
                         ids=["no_layer", "bad_number", "no_name", "gap"])
def test_params_load_rejects_bad_keys(keys, tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, **{k: np.zeros(2) for k in keys})
    with pytest.raises(BackendError, match="parameter file"):
        Params.load(path)


def test_params_load_of_a_missing_or_wrong_file(tmp_path):
    with pytest.raises(BackendError, match="nope.npz"):
        Params.load(tmp_path / "nope.npz")
    single = tmp_path / "single.npy"
    np.save(single, np.zeros(3))
    with pytest.raises(BackendError, match="single"):
        Params.load(single)


@pytest.mark.parametrize("hidden_size", [16, 49, 100])
def test_init_is_uniform_in_plus_minus_one_over_sqrt_h(hidden_size):
    net = engine.Network(engine.preset("lstm").cell, input_size=64, hidden_size=hidden_size, num_layers=2)
    params = engine.init_params(net, seed=0)
    values = np.concatenate([v.ravel() for layer in params.layers for v in layer.values()])
    k = 1.0 / np.sqrt(hidden_size)
    assert values.min() >= -k and values.max() <= k
    # uniform, not just bounded: the range is filled and the quartiles sit at -k/2, 0, k/2
    assert values.min() < -0.95 * k and values.max() > 0.95 * k
    np.testing.assert_allclose(np.quantile(values, [0.25, 0.5, 0.75]), [-k / 2, 0, k / 2], atol=0.05 * k)


def test_init_is_seeded():
    net = engine.Network(engine.preset("gru").cell, input_size=3, hidden_size=5, num_layers=2)
    a, b, c = (engine.init_params(net, seed=s) for s in (7, 7, 8))
    for layer in range(2):
        for key in a[layer]:
            np.testing.assert_array_equal(a[layer][key], b[layer][key])
            assert not np.array_equal(a[layer][key], c[layer][key])
    assert a[0]["W_ir"].shape == (5, 3) and a[1]["W_ir"].shape == (5, 5), "layer 1 reads layer 0's output"
    assert engine.init_params(net, seed=7, dtype=np.float32)[0]["W_ir"].dtype == np.float32


# ---- running ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_float32_agrees_with_float64(name, make_case, run_reference):
    case = make_case(engine.preset(name), num_layers=2)
    r64 = run_reference(case, dtype=np.float64)
    r32 = run_reference(case, dtype=np.float32)
    assert r32.outputs.dtype == np.float32
    assert all(v.dtype == np.float32 for v in r32.final_states.values())
    np.testing.assert_allclose(r32.outputs, r64.outputs, rtol=1e-4, atol=1e-5)
    for state in r64.final_states:
        np.testing.assert_allclose(r32.final_states[state], r64.final_states[state], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_initial_states_are_used(name, make_case, run_reference):
    """Running T steps equals running T1 steps, then T-T1 from the final states: the states carry over."""
    case = make_case(engine.preset(name), num_layers=2, steps=6)
    whole = run_reference(case)
    first = run_reference(case, x=case.x[:2])
    second = run_reference(case, x=case.x[2:], initial_states=first.final_states)
    np.testing.assert_allclose(np.concatenate([first.outputs, second.outputs]), whole.outputs, rtol=0, atol=1e-14)
    for state in whole.final_states:
        np.testing.assert_allclose(second.final_states[state], whole.final_states[state], rtol=0, atol=1e-14)
    # and they matter: zero initial states (given or left out) give something else
    zeros = {s: np.zeros_like(v) for s, v in case.initial_states.items()}
    from_zeros = run_reference(case, initial_states=zeros)
    np.testing.assert_array_equal(from_zeros.outputs, run_reference(case, initial_states=None).outputs)
    assert not np.allclose(from_zeros.outputs[0], whole.outputs[0])


def test_partial_initial_states_default_to_zero(make_case, run_reference):
    case = make_case(engine.preset("lstm"), num_layers=1)
    only_h = run_reference(case, initial_states={"h": case.initial_states["h"]})
    both = run_reference(case, initial_states={"h": case.initial_states["h"],
                                               "c": np.zeros_like(case.initial_states["c"])})
    np.testing.assert_array_equal(only_h.outputs, both.outputs)


def test_inputs_are_not_modified(make_case, run_reference):
    case = make_case(engine.preset("lstm_fgr"), num_layers=2)
    x, states = case.x.copy(), {k: v.copy() for k, v in case.initial_states.items()}
    run_reference(case)
    np.testing.assert_array_equal(case.x, x)
    for k in states:
        np.testing.assert_array_equal(case.initial_states[k], states[k])


@pytest.mark.parametrize("bad_x,phrase", [
    (np.zeros((4, 3)), "3 dimensions"),
    (np.zeros((4, 3, 2, 1)), "3 dimensions"),
    (np.zeros((4, 3, 6)), "input size 6"),
    (np.zeros((0, 3, 5)), "at least 1"),
    (np.zeros((4, 0, 5)), "at least 1"),
    (np.zeros((4, 3, 5), dtype=np.int64), "floating-point"),
    (np.zeros((4, 3, 5), dtype=np.complex128), "floating-point"),
    ([[[0.0] * 5] * 3] * 4, "must be an array"),
    (None, "must be an array"),
], ids=["2d", "4d", "wrong_I", "T0", "B0", "int", "complex", "list", "none"])
def test_bad_x_raises_backend_error_naming_x(bad_x, phrase, make_case, run_reference):
    case = make_case(engine.preset("lstm"), num_layers=1)
    assert case.network.input_size == 5
    with pytest.raises(BackendError) as info:
        run_reference(case, x=bad_x, initial_states=None)
    assert "'x'" in str(info.value) and phrase in str(info.value)


@pytest.mark.parametrize("states,phrase", [
    ({"k": None}, "'k' is not a state"),
    ({"h": np.zeros((2, 3, 7))}, "initial_states['h']"),
    ({"h": np.zeros((1, 3))}, "initial_states['h']"),
    ([np.zeros((1, 3, 7))], "initial_states"),
], ids=["unknown_state", "wrong_layers", "2d", "not_a_dict"])
def test_bad_initial_states_are_named(states, phrase, make_case, run_reference):
    case = make_case(engine.preset("lstm"), num_layers=1)
    with pytest.raises(BackendError) as info:
        run_reference(case, initial_states=states)
    assert phrase in str(info.value)


def test_unsupported_dtype_and_missing_params(make_case, run_reference):
    case = make_case(engine.preset("gru"), num_layers=1)
    with pytest.raises(BackendError, match="float16"):
        run_reference(case, dtype=np.float16)
    missing = Params([{k: v for k, v in case.params[0].items() if k != "b_hn"}])
    with pytest.raises(BackendError, match="b_hn"):
        run_reference(case, params=missing)
    wrong = Params([dict(case.params[0], W_hz=np.zeros((2, 2)))])
    with pytest.raises(BackendError, match="W_hz"):
        run_reference(case, params=wrong)


def test_unknown_backend_is_named():
    with pytest.raises(BackendError, match="nope"):
        engine.run(engine.Network(engine.preset("lstm").cell, 2, 3), None, np.zeros((1, 1, 2)), backend="nope")


def test_a_run_that_cannot_fit_in_memory_is_refused_before_allocating(monkeypatch):
    from engine import memory
    from engine.backends import reference as ref_backend
    from engine.errors import BackendError
    network = engine.Network(engine.preset("lstm").cell, input_size=3, hidden_size=4, num_layers=1)
    params = engine.init_params(network, seed=0)
    x = np.zeros((6, 2, 3))
    monkeypatch.setattr(memory, "available_host_bytes", lambda: 1000)       # a tiny machine
    with pytest.raises(BackendError, match=r"needs [\d.,]+ \w+, the limit is 1,000 bytes \(available host memory now\); "
                                           "hint: "):
        ref_backend.run(network, params, x)
    monkeypatch.setattr(memory, "available_host_bytes", lambda: 10**9)
    assert ref_backend.run(network, params, x).outputs.shape == (6, 2, 4)


def test_available_host_memory_is_read_on_linux():
    import os

    from engine.memory import available_host_bytes
    found = available_host_bytes()
    if not os.path.exists("/proc/meminfo"):
        assert found is None
    else:
        assert isinstance(found, int) and found > 0


@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_ten_thousand_steps_stay_finite_in_bounded_memory(name):
    import tracemalloc
    network = engine.Network(engine.preset(name).cell, input_size=3, hidden_size=8, num_layers=1)
    params = engine.init_params(network, seed=0)
    x = np.random.default_rng(0).standard_normal((10_000, 2, 3))
    tracemalloc.start()
    result = engine.run(network, params, x, backend="reference", dtype=np.float64)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert np.isfinite(result.outputs).all() and all(np.isfinite(v).all() for v in result.final_states.values())
    # The layer outputs and the input in float64 are the only sequence-long arrays: nothing per step stays.
    sequence_bytes = 8 * 10_000 * 2 * (3 + 2 * 8)
    assert peak < 1.5 * sequence_bytes + 2_000_000, f"peak {peak:,} bytes for {sequence_bytes:,} of sequences"
