"""The pipelined run of a net (engine/pipeline.py) on GPUs: two pipeline stages on one GPU (devices [0, 0]: the
chunking, the carried states and the hand-over on the GPU code path, on any GPU machine), and on two GPUs where the
host has them (peer copies between devices). Outputs within float32 rounding of the one-piece reference run."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.pipeline import PipelineProgram, plan_pipeline
from test_fused import relative_error

pytestmark = pytest.mark.gpu


def case():
    net = engine.net_preset("deepspeech", input_size=37, hidden_size=129, layers=2)
    params = engine.init_net_params(net, seed=2)
    x = np.random.default_rng(3).standard_normal((21, 4, 37))
    return net, params, x, engine.run_net(net, params, x).outputs


@pytest.mark.parametrize("backend", ["fused", "persistent"])
def test_two_stages_on_one_gpu(cupy, backend):
    net, params, x, want = case()
    plan = plan_pipeline(net, 2, 21, 4, chunk=6)
    got = PipelineProgram(net, params, plan, backend=backend, devices=[0, 0]).run(cupy.asarray(x, dtype=cupy.float32))
    assert relative_error(cupy.asnumpy(got.outputs), want) <= 1e-5


def test_two_gpus(cupy):
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("this host has one GPU: the two-GPU pipeline is checked on a two-GPU machine")
    net, params, x, want = case()
    plan = plan_pipeline(net, 2, 21, 4, chunk=6, available=cupy.cuda.runtime.getDeviceCount())
    got = PipelineProgram(net, params, plan, backend="persistent").run(cupy.asarray(x, dtype=cupy.float32))
    assert relative_error(cupy.asnumpy(got.outputs), want) <= 1e-5
