"""Networks of blocks (issue #11) on the GPU backends, against the float64 reference: the DeepSpeech block (LSTM
layers, max-pool over time by 2, LSTM layers) and a bidirectional block followed by a mean pool, on CuPy arrays from
block to block; outputs within float32 rounding of the reference (relative 2-norm 1e-5, as the fused suite)."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.blocks import Layers, Net, Pool, pool_over_time
from test_fused import relative_error

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


# ---- a pool folded into the kernel of the block before it (fuse_pools=True, kernels/pool.cuh) ----------------

FOLDED = [("max", 2, 2), ("mean", 3, 2), ("max", 2, 3), ("mean", 1, 1)]


@pytest.mark.parametrize("op,window,stride", FOLDED)
@pytest.mark.parametrize("backend", ["graph", "persistent"])
def test_a_folded_pool_matches_the_reference(cupy, backend, op, window, stride):
    net = Net(37, (Layers("lstm", 129, 2), Pool(op, window, stride), Layers("gru", 33)))
    params = engine.init_net_params(net, seed=5)
    x = np.random.default_rng(6).standard_normal((13, 19, 37))
    want = engine.run_net(net, params, x)
    program = engine.prepare_net(net, params, backend=backend, fuse_pools=True)
    got = program.run(cupy.asarray(x, dtype=cupy.float32), poison=True)
    assert program.fused == {0: "'" + net.blocks[1].label + "' folded into the kernel of '" + net.blocks[0].label + "'"}
    assert got.block_outputs[0] is None and got.block_outputs[1].shape == want.block_outputs[1].shape
    assert relative_error(got.block_outputs[1].get(), want.block_outputs[1]) <= 1e-5
    assert relative_error(got.outputs.get(), want.outputs) <= 1e-5
    again = program.run(cupy.asarray(x, dtype=cupy.float32), poison=True)
    assert bool((again.outputs == got.outputs).all()), "a folded pool reruns bit-identically"


@pytest.mark.parametrize("cell", ["gru_cho", "indrnn", "peephole_lstm"])
@pytest.mark.parametrize("batch", [2, 64], ids=["gemv", "tiles"])
def test_a_folded_pool_after_other_cells_and_batches(cupy, cell, batch):
    net = Net(24, (Layers(cell, 40, 3), Pool("max", 2, 2)))
    params = engine.init_net_params(net, seed=7)
    x = np.random.default_rng(8).standard_normal((9, batch, 24))
    want = engine.run_net(net, params, x).outputs
    got = engine.run_net(net, params, cupy.asarray(x, dtype=cupy.float32), backend="persistent", fuse_pools=True)
    assert got.block_outputs[0] is None and got.outputs.shape == want.shape == (4, batch, 40)
    assert relative_error(got.outputs.get(), want) <= 1e-5


@pytest.mark.parametrize("config", [{"layers_per_launch": 1}, {"sync": "layer"}], ids=["layer-by-layer", "layer-sync"])
def test_a_folded_pool_on_the_persistent_schedules_variants(cupy, config):
    from engine.schedules import schedule_class
    from engine.schedules.tiling import TileConfig
    network = engine.Network(engine.preset("lstm").cell, 48, 96, 3)
    params = engine.init_params(network, seed=9)
    x = np.random.default_rng(10).standard_normal((12, 16, 48))
    pool = Pool("mean", 4, 3)
    want = pool_over_time(engine.run(network, params, x, backend="reference").outputs, pool)
    program = schedule_class("persistent")(network, params, config=TileConfig(**config), pool=pool)
    got = program.run(cupy.asarray(x, dtype=cupy.float32), poison=True)
    assert got.outputs.shape == want.shape == (3, 16, 96) and got.info["pool"] == pool.label
    assert relative_error(got.outputs.get(), want) <= 1e-5


def test_auto_folds_the_pool_when_it_picks_a_wavefront_schedule(cupy, tmp_path, monkeypatch):
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path))
    net = engine.net_preset("deepspeech", input_size=32, hidden_size=64, layers=2)
    params = engine.init_net_params(net, seed=11)
    x = np.random.default_rng(12).standard_normal((10, 8, 32))
    want = engine.run_net(net, params, x).outputs
    program = engine.prepare_net(net, params, backend="auto", fuse_pools=True)
    got = program.run(cupy.asarray(x, dtype=cupy.float32))
    chosen = program.programs[(0,)]
    folded = getattr(chosen, "pool", None) is not None
    assert program.fused[0].startswith("'") == folded, program.fused
    assert (got.block_outputs[0] is None) == folded
    assert relative_error(got.outputs.get(), want) <= 1e-5
