"""The fused backend (cuBLAS GEMMs + generated kernels + hoisting + wavefront) against the reference.

Every preset, 1 and 3 layers, odd sizes (I=37, H=129, B=3, T=17), non-zero initial states, every work
buffer poisoned with NaN before the run (poison=True), float32 within 1e-5 relative (in the 2-norm)
of the float64 NumPy reference. Skipped with the `cupy` fixture's reason where there is no GPU.
"""
from __future__ import annotations

import numpy as np
import pytest
from compiler_cells import CELLS

import engine
from engine.backends import fused, reference
from engine.errors import BackendError
from engine.passes import PASS_NAMES

pytestmark = pytest.mark.gpu

PRESETS = sorted(engine.presets())
SIZES = {"input_size": 37, "hidden_size": 129, "batch": 3, "steps": 17}
TOLERANCE = 1e-5


def make_case(cell, num_layers, seed=0, sizes=SIZES):
    sizes = dict(sizes, hidden_size=cell.fit_size(sizes["hidden_size"]))    # a multiple of a cell's heads (slstm)
    network = engine.Network(cell, sizes["input_size"], sizes["hidden_size"], num_layers)
    params = engine.init_params(network, seed=seed)
    rng = np.random.default_rng(100 + seed)
    x = rng.standard_normal((sizes["steps"], sizes["batch"], sizes["input_size"]))
    states = {name: rng.uniform(-0.8, 0.8, (num_layers, sizes["batch"], sizes["hidden_size"]))
              for name in cell.state_names}
    return network, params, x, states


def relative_error(got, want) -> float:
    got = np.asarray(got, dtype=np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def assert_matches(result, ref, what):
    assert not np.isnan(result.outputs).any(), f"{what}: NaN in the outputs (a value read before it was written)"
    errors = {"outputs": relative_error(result.outputs, ref.outputs)}
    for name, value in ref.final_states.items():
        errors[f"final {name}"] = relative_error(result.final_states[name], value)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= TOLERANCE, f"{what}: {worst} relative error {errors[worst]:.3g} > {TOLERANCE}"


@pytest.mark.parametrize("num_layers", [1, 3])
@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_matches_the_reference(cupy, name, num_layers):
    network, params, x, states = make_case(engine.preset(name).cell, num_layers, seed=num_layers)
    ref = reference.run(network, params, x, states, dtype=np.float64)
    result = fused.run(network, params, x, states, poison=True)
    assert isinstance(result.outputs, np.ndarray) and result.outputs.dtype == np.float32
    assert_matches(result, ref, f"{name}, L={num_layers}")


@pytest.mark.parametrize("name", sorted(CELLS))
def test_unusual_cells_match_the_reference(cupy, name):
    network, params, x, states = make_case(CELLS[name], num_layers=2)
    ref = reference.run(network, params, x, states, dtype=np.float64)
    assert_matches(fused.run(network, params, x, states, poison=True), ref, name)


@pytest.mark.parametrize("passes", [[]] + [{name: False} for name in PASS_NAMES])
@pytest.mark.parametrize("name", ["lstm", "gru_cho", "lstm_fgr", "input_sized"])
def test_every_pass_can_be_switched_off(cupy, name, passes):
    cell = CELLS[name] if name in CELLS else engine.preset(name).cell
    network, params, x, states = make_case(cell, num_layers=2)
    ref = reference.run(network, params, x, states, dtype=np.float64)
    assert_matches(fused.run(network, params, x, states, passes=passes, poison=True), ref, f"{name} {passes}")


@pytest.mark.parametrize("chunk_steps", [1, 5, 17])
def test_interleaved_layout_and_chunks(cupy, chunk_steps):
    network, params, x, states = make_case(engine.preset("lstm").cell, num_layers=3)
    ref = reference.run(network, params, x, states, dtype=np.float64)
    result = fused.run(network, params, x, states, layout="interleaved", chunk_steps=chunk_steps, poison=True)
    assert_matches(result, ref, f"interleaved, chunk {chunk_steps}")


def test_differential_check_can_fail(cupy):
    network, params, x, states = make_case(engine.preset("gru").cell, num_layers=1)
    ref = reference.run(network, params, x, states, dtype=np.float64)
    params.layers[0]["W_hz"] = params.layers[0]["W_hz"] * 1.01
    result = fused.run(network, params, x, states)
    assert relative_error(result.outputs, ref.outputs) > TOLERANCE


def test_cupy_in_cupy_out_numpy_in_numpy_out(cupy):
    network, params, x, states = make_case(engine.preset("mgu").cell, num_layers=2)
    on_gpu = fused.run(network, params, cupy.asarray(x, dtype=cupy.float32),
                       {k: cupy.asarray(v) for k, v in states.items()})
    assert isinstance(on_gpu.outputs, cupy.ndarray) and isinstance(on_gpu.final_states["h"], cupy.ndarray)
    on_host = fused.run(network, params, x, states)
    assert isinstance(on_host.outputs, np.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(on_gpu.outputs), on_host.outputs, rtol=0, atol=1e-6)


def test_zero_initial_states_by_default(cupy):
    network, params, x, _ = make_case(engine.preset("lstm").cell, num_layers=2)
    ref = reference.run(network, params, x, None, dtype=np.float64)
    assert_matches(fused.run(network, params, x, poison=True), ref, "no initial states")


def test_engine_run_picks_fused(cupy):
    network, params, x, states = make_case(engine.preset("lstm").cell, num_layers=1)
    result = engine.run(network, params, x, states, backend="fused")
    assert result.backend == "fused" and result.info["launches_per_step"] == 2


def test_bad_arguments_name_the_argument(cupy):
    network, params, x, states = make_case(engine.preset("lstm").cell, num_layers=2)
    with pytest.raises(BackendError, match="'x'"):
        fused.run(network, params, x[:, :, :5])
    with pytest.raises(BackendError, match="'x'"):
        fused.run(network, params, x.astype(np.int32))
    with pytest.raises(BackendError, match="initial_states"):
        fused.run(network, params, x, {"h": states["h"][:1]})
    with pytest.raises(BackendError, match="float32 only"):
        fused.run(network, params, x, dtype=np.float16)
    bad = engine.Params([dict(layer) for layer in params.layers])
    del bad.layers[1]["W_hi"]
    with pytest.raises(BackendError, match="W_hi"):
        fused.run(network, bad, x)


def test_memory_is_checked_before_allocating(cupy):
    network = engine.Network(engine.preset("lstm").cell, 8, 1024, 1)
    params = engine.init_params(network)
    huge = cupy.broadcast_to(cupy.zeros((1, 1, 8), dtype=cupy.float32), (1_000_000, 256, 8))
    before = cupy.get_default_memory_pool().used_bytes()
    with pytest.raises(BackendError, match=r"needs [\d.,]+ \w+, the limit is .*free GPU memory.*hint"):
        fused.run(network, params, huge)
    assert cupy.get_default_memory_pool().used_bytes() == before


@pytest.mark.parametrize("name", ["lstm", "gru_cho"])
def test_prepared_program_reuses_weights_across_fresh_inputs(cupy, name):
    """prepare() uploads once; every later run(x) on new random inputs (and a new T, B) is still right."""
    network, params, _, _ = make_case(engine.preset(name).cell, 2, seed=7)
    program = fused.prepare(network, params)
    rng = np.random.default_rng(55)
    for steps, batch in ((17, 3), (17, 3), (5, 8)):
        x = rng.standard_normal((steps, batch, network.input_size))
        ref = reference.run(network, params, x, dtype=np.float64)
        result = program.run(cupy.asarray(x, dtype=cupy.float32), poison=True)
        assert isinstance(result.outputs, cupy.ndarray)
        assert_matches(type(result)(outputs=cupy.asnumpy(result.outputs),
                                    final_states={k: cupy.asnumpy(v) for k, v in result.final_states.items()}),
                       ref, f"{name} prepared, T={steps} B={batch}")
