"""The precision modes tf32, float16 and bfloat16 of the schedules, against the reference that emulates them.

The reference with precision=<mode> rounds both operands of every matmul exactly as the kernels do
(engine.rounding) and computes the rest in float64. A schedule in that mode must match it closely (the
only differences left: fp32 accumulation and cell math, and the rare 16-bit rounding of h that an fp32
difference flips), and much more closely than it matches the strict float64 reference: the emulation must
explain nearly all of the mode's divergence, so a wrong rounding (truncation instead of nearest, a
missing rounding of h, fp32 weights) fails here even when its error looks small.

Paths covered: the warp GEMV with rounded operands (B = 3), the tensor-core MMA (B = 19 and 40: one and
three 16-row tiles, split K), resident and streamed weights, layer 0 projected in the kernel (L = 2) or
by cublasGemmEx before it (L = 1, and layer by layer), the race check, the API and the autotuner.
"""
from __future__ import annotations

import numpy as np
import pytest
from test_fused import make_case, relative_error

import engine
from engine.backends import reference
from engine.errors import BackendError
from engine.schedules import autotune, schedule_class
from engine.schedules.tiling import TileConfig

pytestmark = pytest.mark.gpu

# Every preset the wavefront schedules takes: not LSTMP (values of size P), refused by name (tests/test_projection.py).
PRESETS = sorted(n for n, p in engine.presets().items() if not p.cell.uses_projection)
SCHEDULES = ("graph", "persistent")
REDUCED = ("tf32", "float16", "bfloat16")
# Norm-relative error against the emulating reference, and the share of the mode's divergence from float64
# that may stay unexplained by the emulation.
EMULATED_TOLERANCE = 2e-3
UNEXPLAINED = 0.25


def errors(result, ref):
    found = {"outputs": relative_error(result.outputs, ref.outputs)}
    for name, value in ref.final_states.items():
        found[f"final {name}"] = relative_error(result.final_states[name], value)
    return found


def check_mode(result, network, params, x, states, precision, what, unexplained=UNEXPLAINED):
    assert not np.isnan(result.outputs).any(), f"{what}: NaN in the outputs (a value read before it was written)"
    emulated = errors(result, reference.run(network, params, x, states, precision=precision))
    strict = errors(result, reference.run(network, params, x, states))
    worst = max(emulated, key=emulated.get)
    assert emulated[worst] <= EMULATED_TOLERANCE, \
        f"{what}: {worst} differs from the {precision} emulation by {emulated[worst]:.3g}"
    assert strict["outputs"] > 0, f"{what}: bit-equal to float64: the mode rounds nothing"
    assert emulated["outputs"] <= unexplained * strict["outputs"], (
        f"{what}: the {precision} emulation explains too little of the divergence: {emulated['outputs']:.3g} from "
        f"it, {strict['outputs']:.3g} from float64")


def run(schedule, network, params, x, states, precision, config=None):
    program = schedule_class(schedule)(network, params, config=config, precision=precision)
    return program.run(x, states, poison=True)


@pytest.mark.parametrize("precision", REDUCED)
@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_matches_its_emulation(cupy, name, precision):
    # The persistent kernel on the tensor-core path (B = 19); the GEMV path and the graph schedule, which
    # share the stage code, for the two presets of different structure (one stage, two stages).
    cases = [("persistent", 19)] + ([("persistent", 3), ("graph", 19)] if name in ("lstm", "gru_cho") else [])
    for schedule, batch in cases:
        size = {"input_size": 37, "hidden_size": 129, "batch": batch, "steps": 17}
        network, params, x, states = make_case(engine.preset(name).cell, 2, seed=batch, sizes=size)
        result = run(schedule, network, params, x, states, precision)
        assert result.info["precision"] == precision
        check_mode(result, network, params, x, states, precision, f"{schedule} {name} {precision} B={batch}")


CASES = [
    ("one layer: cublasGemmEx projection", 1, 40, TileConfig()),
    ("streamed weights", 2, 40, TileConfig(resident=False)),
    ("layer by layer", 3, 19, TileConfig(layers_per_launch=1)),
    ("gemv, streamed", 2, 4, TileConfig(resident=False)),
]


@pytest.mark.parametrize("precision", REDUCED)
@pytest.mark.parametrize("label,layers,batch,config", CASES, ids=[c[0] for c in CASES])
def test_paths(cupy, label, layers, batch, config, precision):
    size = {"input_size": 48, "hidden_size": 96, "batch": batch, "steps": 13}
    schedules = ("persistent",) if config.layers_per_launch or not config.resident else SCHEDULES
    for cell in ("lstm", "gru_cho"):
        network, params, x, states = make_case(engine.preset(cell).cell, layers, seed=3, sizes=size)
        for schedule in schedules:
            result = run(schedule, network, params, x, states, precision, config)
            check_mode(result, network, params, x, states, precision, f"{schedule} {cell} {precision} {label}")


BULK_CASES = [
    ("resident weights", 2, 40, TileConfig()),
    ("streamed weights", 2, 19, TileConfig(resident=False)),
    ("one layer", 1, 33, TileConfig()),
    ("layer by layer", 3, 24, TileConfig(layers_per_launch=1)),
    ("feed warp", 2, 40, TileConfig(feed_warp=True)),             # a warp of its own feeds the ring
    ("feed warp, streamed", 2, 19, TileConfig(resident=False, feed_warp=True)),
    # a feed warp beside three MMA warps, each with several passes over its tiles (32 columns x 48 rows of 1 x 1)
    ("feed warp, several passes", 2, 48, TileConfig(units_per_block=8, threads=128, warp_tile=(1, 1), feed_warp=True)),
    ("wgmma stream", 2, 40, TileConfig(stream_wgmma=True)),        # kernels/wgmma_stream.cuh, two feed warps
    ("wgmma stream, one layer", 1, 64, TileConfig(stream_wgmma=True)),
]


@pytest.mark.parametrize("precision", ("float16", "bfloat16"))
@pytest.mark.parametrize("label,layers,batch,config", BULK_CASES, ids=[c[0] for c in BULK_CASES])
def test_the_bulk_pipeline_matches_its_emulation(cupy, label, layers, batch, config, precision):
    """Sizes in whole chunks of 64 columns: the GEMMs stage chunked 16-bit operands with bulk copies (X written by
    the cell code and by the host: x, nonzero initial states; streamed weights chunked per block)."""
    size = {"input_size": 64, "hidden_size": 128, "batch": batch, "steps": 11}
    schedules = ("persistent",) if config.layers_per_launch or not config.resident else SCHEDULES
    for cell in ("lstm", "gru", "gru_cho"):
        network, params, x, states = make_case(engine.preset(cell).cell, layers, seed=batch, sizes=size)
        for schedule in schedules:
            result = run(schedule, network, params, x, states, precision, config)
            assert "bulk copies" in result.info["tiling"], result.info["tiling"]
            check_mode(result, network, params, x, states, precision, f"{schedule} {cell} {precision} bulk {label}")


@pytest.mark.parametrize("schedule, precision", [("persistent", p) for p in REDUCED]
                         + [("graph", "float32x3"), ("persistent", "float32x3")])
def test_twenty_runs_are_bit_identical(cupy, schedule, precision):
    size = {"input_size": 64, "hidden_size": 128, "batch": 33, "steps": 12}
    network, params, x, _ = make_case(engine.preset("lstm").cell, 2, seed=5, sizes=size)
    program = schedule_class(schedule)(network, params, precision=precision)
    x_gpu = cupy.asarray(x, dtype=cupy.float32)
    first = program.run(x_gpu).outputs.get()
    for _ in range(19):
        assert np.array_equal(program.run(x_gpu).outputs.get(), first), f"{schedule} {precision}: runs differ"


def test_api_runs_every_mode_and_refuses_it_on_the_float32_backend(cupy, tmp_path, monkeypatch):
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path))
    size = {"input_size": 32, "hidden_size": 64, "batch": 8, "steps": 6}
    network, params, x, states = make_case(engine.preset("gru").cell, 2, seed=2, sizes=size)
    for precision in ("bf16", "tf32"):
        result = engine.run(network, params, x, states, backend="auto", precision=precision)
        canonical = {"bf16": "bfloat16"}.get(precision, precision)
        assert result.info["precision"] == canonical and result.backend in (*SCHEDULES, "fused")
        check_mode(result, network, params, x, states, canonical, f"auto {precision}")
    choice = autotune.tune(network, params, 6, 8, precision="float16")
    assert "float16" in choice.key and choice.schedule in (*SCHEDULES, "fused") and "float16" in choice.why
    with pytest.raises(BackendError, match="precision"):
        engine.run(network, params, x, states, backend="naive", precision="float16")
    fused = engine.run(network, params, x, states, backend="fused", precision="float16")     # its mode path
    check_mode(fused, network, params, x, states, "float16", "fused float16")
    x3 = engine.run(network, params, x, states, backend="fused", precision="float32x3")     # split_products.py
    assert x3.info["precision"] == "float32x3"
    exact = reference.run(network, params, x, states).outputs
    assert np.max(np.abs(x3.outputs - exact)) <= 1e-5 * np.max(np.abs(exact))
    with pytest.raises(BackendError, match="'precision'"):
        engine.run(network, params, x, states, backend="persistent", precision="float8")
