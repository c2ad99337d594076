"""tf32's step products held as shifted fp16 (engine/schedules/tf32_fp16.py; tf32_storage="fp16", what the fused
backend's "auto" runs in tf32 with its products on cuBLAS) on the GPU: every preset against the tf32 emulation, both
storages side by side, the replay to the direct run, the copies' rounding to the host's bit for bit, and the falls
back to TF32 storage for a step operand past the copy's range and for a weight it cannot hold, each said in info.
tests/gpu/test_fused_modes_gpu.py runs tf32 in its default storage in the mode's other checks."""
from __future__ import annotations

import numpy as np
import pytest
from test_fused import make_case, relative_error
from test_fused_modes_gpu import UNEXPLAINED
from test_precision_gpu import check_mode

import engine
from engine.schedules import fused_modes, tf32_fp16

pytestmark = pytest.mark.gpu

SIZES = {"input_size": 37, "hidden_size": 129, "batch": 19, "steps": 17}


@pytest.mark.parametrize("storage", ["fp16", "tf32"])
@pytest.mark.parametrize("name", sorted(engine.presets()))
def test_every_preset_matches_the_tf32_emulation_in_either_storage(cupy, name, storage):
    network, params, x, states = make_case(engine.preset(name).cell, 2, seed=5, sizes=SIZES)
    program = fused_modes.prepare(network, params, precision="tf32", step_product="cublaslt", tf32_storage=storage)
    result = program.run(x, states, poison=True)
    assert result.info["tf32_storage"] == storage and "tf32_storage_fallback" not in result.info, result.info
    check_mode(result, network, params, x, states, "tf32", f"fused {name} tf32 in {storage}", UNEXPLAINED)


def test_the_storages_agree_and_the_replay_is_the_direct_run(cupy):
    sizes = {"input_size": 64, "hidden_size": 96, "batch": 16, "steps": 23}
    for name, layers in (("lstm", 3), ("gru_cho", 1), ("gru", 2)):
        network, params, x, states = make_case(engine.preset(name).cell, layers, seed=3, sizes=sizes)
        half = fused_modes.prepare(network, params, precision="tf32", step_product="cublaslt")
        direct = half.run(x, states, poison=True)
        assert direct.info["tf32_storage"] == "fp16", direct.info
        plain = fused_modes.prepare(network, params, precision="tf32", tf32_storage="tf32").run(x, states)
        # the same TF32 values multiplied; only the fp32 sums' order differs
        assert relative_error(direct.outputs, plain.outputs) < 1e-4, name
        for _ in range(3):
            again = half.run(x, states)
        assert again.info["replayed"].startswith("replayed from CUDA graphs"), again.info["replayed"]
        np.testing.assert_array_equal(again.outputs, direct.outputs)
        for state, value in direct.final_states.items():
            np.testing.assert_array_equal(again.final_states[state], value)


def test_the_initial_copies_are_the_hosts_values_and_flag_past_the_range(cupy):
    rng = np.random.default_rng(6)
    values = np.clip(rng.standard_normal(4099) * 2.0 ** rng.integers(-30, 6, 4099), -60, 60).astype(np.float32)
    values[17] = 70.0                                           # past the copy's range
    out = cupy.full(values.size, np.nan, dtype=cupy.float16)
    flag = cupy.zeros(1, dtype=cupy.uint32)
    tf32_fp16.round_into(cupy, cupy.asarray(values), out, flag)
    np.testing.assert_array_equal(cupy.asnumpy(out).view(np.uint16), tf32_fp16.scaled_operand(values).view(np.uint16))
    assert int(flag.get()[0]) == 1
    flag.fill(0)
    values[17] = 63.0
    tf32_fp16.round_into(cupy, cupy.asarray(values), out, flag)
    assert int(flag.get()[0]) == 0


def test_a_step_operand_past_the_copys_range_runs_again_in_tf32_storage(cupy):
    network, params, x, states = make_case(engine.preset("lstm").cell, 2, seed=4, sizes=SIZES)
    states = {name: value.copy() for name, value in states.items()}
    states["h"][1, 3, 5] = 100.0                                # layer 1's h at step 0: past ~64
    program = fused_modes.prepare(network, params, precision="tf32", step_product="cublaslt")
    result = program.run(x, states, poison=True)
    assert result.info["tf32_storage"] == "tf32", result.info
    assert "past its fp16 copy's range" in result.info["tf32_storage_fallback"], result.info
    check_mode(result, network, params, x, states, "tf32", "fused lstm tf32 after the fallback", UNEXPLAINED)
    assert program.run(x, states).info["tf32_storage"] == "tf32"          # for good


def test_a_weight_it_cannot_hold_runs_in_tf32_storage(cupy):
    network, params, x, states = make_case(engine.preset("gru").cell, 1, seed=2, sizes=SIZES)
    layers = [dict(layer) for layer in params.layers]
    layers[0]["W_hr"] = np.array(layers[0]["W_hr"], copy=True)
    layers[0]["W_hr"][:4] *= 2.0 ** -24               # four rows (outputs) of the step's weight, 2^24 smaller
    small = engine.Params(layers)
    result = fused_modes.prepare(network, small, precision="tf32", step_product="cublaslt").run(x, states)
    assert result.info["tf32_storage"] == "tf32", result.info
    assert "has a row" in result.info["tf32_storage_fallback"], result.info
    check_mode(result, network, small, x, states, "tf32", "fused gru tf32, a weight held in TF32", UNEXPLAINED)


def test_each_program_has_its_own_range_flag(cupy):
    """Two programs of the same cell and sizes share their kernels' module, and each has a range flag of its own
    (a buffer the kernels take as a parameter), so one's operand past the range, or its reset of the flag at a run's
    start, is not the other's when both run at once."""
    network, params, x, states = make_case(engine.preset("lstm").cell, 2, seed=4, sizes=SIZES)
    past = {name: value.copy() for name, value in states.items()}
    past["h"][0, 1, 2] = 90.0
    first = fused_modes.prepare(network, params, precision="tf32", step_product="cublaslt")
    second = fused_modes.prepare(network, params, precision="tf32", step_product="cublaslt")
    flags = [p.executor(x.shape[0], x.shape[1]).device.range_flag for p in (first, second)]
    assert flags[0].data.ptr != flags[1].data.ptr
    assert first.run(x, past).info["tf32_storage"] == "tf32"
    kept = second.run(x, states)
    assert kept.info["tf32_storage"] == "fp16" and "tf32_storage_fallback" not in kept.info, kept.info
    float32x3 = [fused_modes.prepare(network, params, precision="float32x3") for _ in range(2)]
    flags = [p.executor(x.shape[0], x.shape[1]).device.range_flag for p in float32x3]
    assert flags[0].data.ptr != flags[1].data.ptr
