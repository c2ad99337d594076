"""Networks of blocks (issue #11) on the GPU backends, against the float64 reference: the DeepSpeech block (LSTM
layers, max-pool over time by 2, LSTM layers) and a bidirectional block followed by a mean pool, on CuPy arrays from
block to block; outputs within float32 rounding of the reference (relative 2-norm 1e-5, as the fused suite)."""
from __future__ import annotations

import numpy as np
import pytest
from test_fused import relative_error

import engine
from engine.nets.data import Layers, Net, Pool
from engine.nets.pooling import pool_over_time

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("backend", ["fused", "graph", "persistent"])
def test_deepspeech_block_matches_the_reference(cupy, backend):
    net = engine.net_preset("deepspeech", input_size=37, hidden_size=129, layers=2)
    params = engine.init_net_params(net, seed=1)
    x = np.random.default_rng(2).standard_normal((17, 3, 37))
    want = engine.run_net(net, params, x).outputs
    got = engine.run_net(net, params, cupy.asarray(x, dtype=cupy.float32), backend=backend)
    assert isinstance(got.outputs, cupy.ndarray) and got.outputs.shape == (8, 3, 129)
    assert relative_error(got.outputs.get(), want) <= 1e-5


def test_bidirectional_then_mean_pool_on_the_persistent_schedule(cupy):
    net = Net(20, (Layers("gru", 33, 2, direction="bidirectional"), Pool("mean", 3, 2), Layers("lstm", 17)))
    params = engine.init_net_params(net, seed=3)
    x = np.random.default_rng(4).standard_normal((11, 5, 20))
    want = engine.run_net(net, params, x).outputs
    got = engine.run_net(net, params, cupy.asarray(x, dtype=cupy.float32), backend="persistent").outputs
    assert relative_error(got.get(), want) <= 1e-5


# ---- fuse_pools=True: pools folded into the layer below them, blocks joined into one wavefront -----------------
# (kernels/pool.cuh, engine/schedules/steps.py, engine.nets.fusion.fused_runs)

FOLDED = [("max", 2, 2), ("mean", 3, 2), ("max", 2, 3), ("mean", 1, 1)]


@pytest.mark.parametrize("op,window,stride", FOLDED)
@pytest.mark.parametrize("backend", ["graph", "persistent"])
def test_one_wavefront_through_a_pool_matches_the_reference(cupy, backend, op, window, stride):
    net = Net(37, (Layers("lstm", 129, 2), Pool(op, window, stride), Layers("lstm", 129, 2), Pool("max", 2, 2)))
    params = engine.init_net_params(net, seed=5)
    x = np.random.default_rng(6).standard_normal((13, 19, 37))
    want = engine.run_net(net, params, x)
    program = engine.prepare_net(net, params, backend=backend, fuse_pools=True)
    got = program.run(cupy.asarray(x, dtype=cupy.float32), poison=True)
    assert program.fused[0].startswith("blocks 0-3 ") and "pools after layers 1, 3 folded in" in program.fused[0]
    assert got.block_outputs[:3] == [None, None, None] and got.outputs.shape == want.outputs.shape
    assert relative_error(got.outputs.get(), want.outputs) <= 1e-5
    again = program.run(cupy.asarray(x, dtype=cupy.float32), poison=True)
    assert bool((again.outputs == got.outputs).all()), "a fused run reruns bit-identically"


@pytest.mark.parametrize("cell", ["gru_cho", "indrnn", "peephole_lstm"])
@pytest.mark.parametrize("batch", [2, 64], ids=["gemv", "tiles"])
def test_fused_pools_after_other_cells_and_batches(cupy, cell, batch):
    net = Net(24, (Layers(cell, 40, 2), Pool("max", 2, 2), Layers(cell, 40), Pool("mean", 2, 1)))
    params = engine.init_net_params(net, seed=7)
    x = np.random.default_rng(8).standard_normal((9, batch, 24))
    want = engine.run_net(net, params, x).outputs
    got = engine.run_net(net, params, cupy.asarray(x, dtype=cupy.float32), backend="persistent", fuse_pools=True)
    assert got.block_outputs[0] is None and got.outputs.shape == want.shape == (3, batch, 40)
    assert relative_error(got.outputs.get(), want) <= 1e-5


@pytest.mark.parametrize("config", [{}, {"layers_per_launch": 1}, {"layers_per_launch": 2}, {"sync": "layer"}],
                         ids=["one-launch", "layer-by-layer", "two-a-launch", "layer-sync"])
def test_pools_between_layers_on_the_persistent_schedules_variants(cupy, config):
    from engine.schedules import schedule_class
    from engine.schedules.tiling import TileConfig
    network = engine.Network(engine.preset("lstm").cell, 48, 96, 4)
    params = engine.init_params(network, seed=9)
    x = np.random.default_rng(10).standard_normal((23, 16, 48))
    pools = {0: Pool("mean", 3, 2), 2: Pool("max", 2, 3), 3: Pool("max", 2, 1)}
    want = x
    for layer in range(4):                       # the reference, layer by layer with the pools between
        single = engine.Network(network.cell, want.shape[2], 96, 1)
        want = engine.run(single, engine.Params([params.layers[layer]]), want, backend="reference").outputs
        if layer in pools:
            want = pool_over_time(want, pools[layer])
    program = schedule_class("persistent")(network, params, config=TileConfig(**config), pools=pools)
    got = program.run(cupy.asarray(x, dtype=cupy.float32), poison=True)
    assert got.outputs.shape == want.shape == (3, 16, 96)     # 23 -> 11 -> 4 -> 3 steps and got.info["pools"] == {p: v.label for p, v in pools.items()}
    assert relative_error(got.outputs.get(), want) <= 1e-5
    for state, value in got.final_states.items():     # each layer's final state is the one of its own last step
        assert bool(cupy.isfinite(value).all()), state


def test_auto_fuses_when_it_picks_a_wavefront_schedule(cupy, tmp_path, monkeypatch):
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path))
    net = engine.net_preset("deepspeech", input_size=32, hidden_size=64, layers=2)
    params = engine.init_net_params(net, seed=11)
    x = np.random.default_rng(12).standard_normal((10, 8, 32))
    want = engine.run_net(net, params, x).outputs
    program = engine.prepare_net(net, params, backend="auto", fuse_pools=True)
    got = program.run(cupy.asarray(x, dtype=cupy.float32))
    fused = program.programs[("fused", 0)] is not False
    assert program.fused[0].startswith("blocks 0-2 ") == fused, program.fused
    assert (got.block_outputs[0] is None) == fused
    assert relative_error(got.outputs.get(), want) <= 1e-5
