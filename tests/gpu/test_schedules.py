"""The fast schedules (engine/schedules: graph, persistent) against the float64 reference.

Every preset at 1 and 3 layers with odd sizes (I=37, H=129, B=3, T=17), non-zero initial states and
NaN-poisoned buffers, as the fused backend's suite; the unusual compiler cells; tilings that split K
(B=1), that split K many ways or with 8x8 tiles (partial sums in rounds), that give a block
several output groups (B=64), that leave the last block short, and that stream the weights instead of keeping
them resident; a race check (20 runs bit-identical); the
autotuner's choice and its cache; the 'auto' backend.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from compiler_cells import CELLS
from test_fused import assert_matches, make_case

import engine
from engine.backends import reference
from engine.backends.common import RunResult
from engine.errors import BackendError, CompileError
from engine.schedules import autotune, schedule_class
from engine.schedules.tiling import TileConfig, eligibility

pytestmark = pytest.mark.gpu

# Every preset the wavefront schedules takes: not LSTMP (values of size P), refused by name (tests/test_projection.py).
PRESETS = sorted(n for n, p in engine.presets().items() if not p.cell.uses_projection)
SCHEDULES = ("graph", "persistent")


def run_schedule(name, network, params, x, states, config=None):
    return schedule_class(name)(network, params, config=config).run(x, states, poison=True)


@pytest.mark.parametrize("num_layers", [1, 3])
@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_preset_matches_the_reference(cupy, schedule, name, num_layers):
    network, params, x, states = make_case(engine.preset(name).cell, num_layers, seed=num_layers)
    ref = reference.run(network, params, x, states, dtype=np.float64)
    result = run_schedule(schedule, network, params, x, states)
    assert isinstance(result.outputs, np.ndarray) and result.outputs.dtype == np.float32
    assert result.backend == schedule
    assert_matches(result, ref, f"{schedule} {name}, L={num_layers}")


@pytest.mark.parametrize("name", sorted(CELLS))
def test_unusual_cells_match_or_are_refused_by_name(cupy, name):
    network, params, x, states = make_case(CELLS[name], num_layers=2)
    ref = reference.run(network, params, x, states, dtype=np.float64)
    from engine.compiler import compile_program
    why = eligibility(compile_program(CELLS[name], layout="interleaved"))
    for schedule in SCHEDULES:
        if why is None:
            assert_matches(run_schedule(schedule, network, params, x, states), ref, f"{schedule} {name}")
        else:
            with pytest.raises(CompileError, match=name):
                run_schedule(schedule, network, params, x, states)


TILINGS = [
    ("split K, B=1", {"batch": 1}, TileConfig(8, 1, 4)),
    ("short last block", {"batch": 5}, TileConfig(20, 2, 4)),
    ("many groups, B=64", {"batch": 64}, TileConfig(64, 4, 4, threads=128)),
    ("8x4 tile", {"batch": 19}, TileConfig(None, 8, 4)),
    ("streamed weights", {"batch": 7}, TileConfig(None, 4, 4, resident=False)),
    ("8x8 tile, K split, sums in rounds, B=64", {"batch": 64}, TileConfig(16, 8, 8, threads=256)),
    ("K split 32 ways, B=8", {"batch": 8}, TileConfig(4, 4, 4, threads=256)),
    ("8x4 tile, K split, layer by layer, B=64", {"batch": 64}, TileConfig(24, 8, 4, threads=384, layers_per_launch=1)),
]


@pytest.mark.parametrize("label,sizes,config", TILINGS, ids=[t[0] for t in TILINGS])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_tilings(cupy, schedule, label, sizes, config):
    size = {"input_size": 45, "hidden_size": 150, "batch": 3, "steps": 9} | sizes
    if schedule != "persistent":                       # launches of layer groups are the persistent schedule's
        config = replace(config, layers_per_launch=None)
    for cell in ("lstm", "gru_cho"):
        network, params, x, states = make_case(engine.preset(cell).cell, 2, seed=7, sizes=size)
        ref = reference.run(network, params, x, states, dtype=np.float64)
        assert_matches(run_schedule(schedule, network, params, x, states, config), ref, f"{schedule} {cell} {label}")


@pytest.mark.parametrize("batch", [3, 19])
@pytest.mark.parametrize("name", PRESETS)
def test_layer_sync_computes_what_grid_sync_computes(cupy, name, batch):
    """TileConfig(sync="layer"): per-layer arrival counters instead of grid barriers change when a block waits,
    not what it computes: outputs and final states bit-identical to the grid-synchronised kernel over 3 layers
    (a layer running ahead of the one above it), both poisoned, and both against the float64 reference; 5 runs."""
    size = {"input_size": 45, "hidden_size": 150, "batch": batch, "steps": 13}
    network, params, x, states = make_case(engine.preset(name).cell, 3, seed=batch, sizes=size)
    ref = reference.run(network, params, x, states, dtype=np.float64)
    grid = run_schedule("persistent", network, params, x, states)
    layer = schedule_class("persistent")(network, params, config=TileConfig(sync="layer"))
    for _ in range(5):
        got = layer.run(x, states, poison=True)
        assert_matches(got, ref, f"persistent sync=layer {name} B={batch}")
        assert np.array_equal(got.outputs, grid.outputs)
        for s in grid.final_states:
            assert np.array_equal(got.final_states[s], grid.final_states[s]), s


@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("batch", [2, 9])
def test_persistent_in_groups_of_layers(cupy, group, batch):
    size = {"input_size": 40, "hidden_size": 96, "batch": batch, "steps": 11}
    for cell in ("lstm", "gru"):
        network, params, x, states = make_case(engine.preset(cell).cell, 4, seed=group, sizes=size)
        ref = reference.run(network, params, x, states, dtype=np.float64)
        for sync in ("grid", "layer"):          # the arrival counters are zeroed before every launch of a group
            config = TileConfig(None, 4, 4, layers_per_launch=group, sync=sync)
            program = schedule_class("persistent")(network, params, config=config)
            result = program.run(x, states, poison=True)
            assert result.info["launches_per_sequence"] == 4 // group
            assert_matches(result, ref, f"persistent {cell}, layers per launch {group}, sync={sync}, B={batch}")


def test_layer_groups_are_refused_where_they_do_not_apply(cupy):
    network, params, *_ = make_case(engine.preset("lstm").cell, 3)
    with pytest.raises(CompileError, match="does not divide"):
        schedule_class("persistent")(network, params, config=TileConfig(layers_per_launch=2)).plan(10, 4)
    with pytest.raises(CompileError, match="persistent schedule only"):
        schedule_class("graph")(network, params, config=TileConfig(layers_per_launch=1)).plan(10, 4)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_twenty_runs_are_bit_identical(cupy, schedule):
    size = {"input_size": 64, "hidden_size": 256, "batch": 8, "steps": 30}
    network, params, x, _ = make_case(engine.preset("lstm").cell, 3, seed=3, sizes=size)
    program = schedule_class(schedule)(network, params)
    x_gpu = cupy.asarray(x, dtype=cupy.float32)
    first = cupy.asnumpy(program.run(x_gpu, poison=True).outputs)
    for _ in range(19):
        again = cupy.asnumpy(program.run(x_gpu).outputs)
        assert np.array_equal(first.view(np.uint32), again.view(np.uint32)), f"{schedule}: outputs moved between runs"


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_program_serves_new_shapes_and_device_arrays(cupy, schedule):
    network, params, x, states = make_case(engine.preset("gru").cell, 2)
    program = schedule_class(schedule)(network, params)
    for steps, batch in ((17, 3), (5, 2), (17, 3)):
        xs = cupy.asarray(np.random.default_rng(steps).standard_normal((steps, batch, network.input_size)))
        ref = reference.run(network, params, cupy.asnumpy(xs), None, dtype=np.float64)
        result = program.run(xs)
        assert isinstance(result.outputs, cupy.ndarray)
        result.outputs = cupy.asnumpy(result.outputs)
        result.final_states = {k: cupy.asnumpy(v) for k, v in result.final_states.items()}
        assert_matches(result, ref, f"{schedule} T={steps} B={batch}")


def test_persistent_refuses_more_blocks_than_fit(cupy):
    network, params, *_ = make_case(engine.preset("lstm").cell, 3)
    with pytest.raises(CompileError, match="multiprocessors"):
        schedule_class("persistent")(network, params, config=TileConfig(1)).plan(10, 4)


def test_autotuner_picks_a_correct_schedule_and_caches_it(cupy, tmp_path, monkeypatch):
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path))
    network, params, x, states = make_case(engine.preset("lstm").cell, 2)
    choice = autotune.tune(network, params, 17, 3, repeats=3)
    assert choice.schedule in ("fused", "graph", "persistent") and not choice.cached
    assert "fastest" in choice.why and any("ms" in t for t in choice.timings)
    timed = [(t["ms"], t["candidate"]) for t in choice.timings if "ms" in t]
    ran_off = [t for t in choice.timings if "runoff_ms" in t]
    if len(autotune.finalists(timed)) > 1:                 # close candidates: timed again, the pick is the runoff's
        assert {t["candidate"] for t in ran_off} == set(autotune.finalists(timed)) and "runoff" in choice.why
        best = min(ran_off, key=lambda t: t["runoff_ms"])
        assert best["candidate"].startswith(choice.schedule)
    else:
        assert not ran_off and "runoff" not in choice.why
    again = autotune.tune(network, params, 17, 3, repeats=3)
    assert again.cached and again.schedule == choice.schedule and again.config == choice.config
    (tmp_path / "autotune.json").write_text("{not json")
    rebuilt = autotune.tune(network, params, 17, 3, repeats=2)
    assert not rebuilt.cached and list(tmp_path.glob("autotune.json.corrupt-*"))
    ref = reference.run(network, params, x, states, dtype=np.float64)
    result = engine.run(network, params, x, states, backend="auto")
    assert result.backend in ("fused", "graph", "persistent") and "fastest" in result.info["backend_reason"]
    assert_matches(result, ref, f"auto -> {result.backend}")


def test_schedules_reject_float64_by_name(cupy):
    network, params, *_ = make_case(engine.preset("lstm").cell, 1)
    for schedule in SCHEDULES:
        with pytest.raises(BackendError, match=f"schedule '{schedule}' computes in float32"):
            schedule_class(schedule)(network, params, np.float64)


@pytest.mark.parametrize("name", ["lstm", "gru_cho"])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_replayed_runs_equal_direct_runs(cupy, schedule, name):
    """From a shape's second run on, a schedule replays the whole run from CUDA graphs (engine/chunk_replay.py): each
    run on fresh inputs and states gives the outputs and final states of a program that never replays, bit for bit,
    with zero states, given states, one state given (the others zero), NumPy and CuPy inputs."""
    network, params, x, states = make_case(engine.preset(name).cell, num_layers=3, seed=7)
    replayed = schedule_class(schedule)(network, params)
    direct = schedule_class(schedule)(network, params, replay=False)
    rng = np.random.default_rng(8)
    one = {network.cell.state_names[0]: states[network.cell.state_names[0]]}
    for i, given in enumerate([None, None, states, one, None, states]):
        x = rng.standard_normal(x.shape)
        given = None if given is None else {k: rng.uniform(-0.8, 0.8, v.shape) for k, v in given.items()}
        xs = cupy.asarray(x, dtype=cupy.float32) if i % 2 else x
        got, want = replayed.run(xs, given), direct.run(xs, given)
        assert type(got.outputs) is type(want.outputs) and bool((got.outputs == want.outputs).all()), f"run {i}"
        assert sorted(got.final_states) == sorted(want.final_states)
        assert all(bool((got.final_states[k] == want.final_states[k]).all()) for k in want.final_states), f"run {i}"
        if i == 1:
            ref = reference.run(network, params, x, given, dtype=np.float64)
            assert_matches(RunResult(cupy.asnumpy(got.outputs), {
                k: cupy.asnumpy(v) for k, v in got.final_states.items()}), ref, f"{schedule} {name} replayed")
    assert replayed.replayed.startswith("replayed"), replayed.replayed
    assert got.info["replayed"] == replayed.replayed and direct.replayed.startswith("not replayed")


def test_a_run_that_cannot_be_captured_runs_directly(cupy, monkeypatch):
    """A run whose capture fails (CuPy refuses cuBLAS calls during capture: a one-layer network's input projection)
    runs directly, correctly, from then on, and the schedule says why."""
    from engine import chunk_replay

    def refuse(self, first):
        raise chunk_replay.CaptureError("RuntimeError: refused for the test")
    network, params, x, states = make_case(engine.preset("lstm").cell, num_layers=2, seed=9)
    ref = reference.run(network, params, x, states, dtype=np.float64)
    with monkeypatch.context() as patch:
        patch.setattr(chunk_replay.ChunkReplay, "_capture", refuse)
        program = schedule_class("persistent")(network, params)
        for _ in range(3):
            assert_matches(program.run(x, states), ref, "persistent, capture refused")
    assert program.replayed.startswith("not replayed: the run could not be captured") and program.replay is False
    assert "refused for the test" in program.replayed
    # One layer (its projection a cuBLAS call before the kernel): replayed or run directly, correct either way.
    network, params, x, states = make_case(engine.preset("lstm").cell, num_layers=1, seed=9)
    program = schedule_class("persistent")(network, params)
    ref = reference.run(network, params, x, states, dtype=np.float64)
    for _ in range(3):
        assert_matches(program.run(x, states), ref, "persistent, one layer")
    assert program.replayed.startswith(("replayed", "not replayed: the run could not be captured")), program.replayed
