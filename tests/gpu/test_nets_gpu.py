"""Networks of blocks (issue #11) on the GPU backends, against the float64 reference: the DeepSpeech block (LSTM
layers, max-pool over time by 2, LSTM layers) and a bidirectional block followed by a mean pool, on CuPy arrays from
block to block; outputs within float32 rounding of the reference (relative 2-norm 1e-5, as the fused suite)."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.blocks import Layers, Net, Pool
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
