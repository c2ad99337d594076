"""The LSTM with a recurrent projection (states of size P) on the GPU: the fused backend against the float64
reference, and against cuDNN (torch.nn.LSTM(proj_size=...) on CUDA, TF32 off) with the same weights. The wavefront
schedules do not take P yet (their eligibility says so): `auto` picks the fused backend."""
from __future__ import annotations

import numpy as np
import pytest
from test_fused import relative_error
from test_projection import lstm_proj

import engine
from engine.backends import fused, reference

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("num_layers", [1, 3])
def test_fused_matches_the_reference(cupy, num_layers):
    net = engine.Network(lstm_proj(), 37, 129, num_layers, proj_size=45)
    params = engine.init_params(net, seed=num_layers)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((17, 3, 37))
    states = {"h": rng.uniform(-0.8, 0.8, (num_layers, 3, 45)), "c": rng.uniform(-0.8, 0.8, (num_layers, 3, 129))}
    ref = reference.run(net, params, x, states, dtype=np.float64)
    got = fused.prepare(net, params).run(x, states, poison=True)
    assert got.outputs.shape == (17, 3, 45)
    assert relative_error(got.outputs, ref.outputs) <= 1e-5
    for name in ("h", "c"):
        assert relative_error(got.final_states[name], ref.final_states[name]) <= 1e-5


def test_fused_matches_cudnn_lstm_with_proj_size(cupy):
    torch = pytest.importorskip("torch", reason="torch with CUDA is not installed: no cuDNN to compare with")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    I, H, P, L, T, B = 64, 128, 48, 2, 50, 8
    module = torch.nn.LSTM(I, H, L, proj_size=P).cuda()
    sd = {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}
    layers = []
    for layer in range(L):
        p = {"W_hr": sd[f"weight_hr_l{layer}"]}
        for k, gate in enumerate("ifgo"):
            rows = slice(k * H, (k + 1) * H)
            p.update({f"W_i{gate}": sd[f"weight_ih_l{layer}"][rows], f"W_h{gate}": sd[f"weight_hh_l{layer}"][rows],
                      f"b_i{gate}": sd[f"bias_ih_l{layer}"][rows], f"b_h{gate}": sd[f"bias_hh_l{layer}"][rows]})
        layers.append(p)
    net = engine.Network(lstm_proj(), I, H, L, proj_size=P)
    x = cupy.asarray(np.random.default_rng(0).standard_normal((T, B, I)), dtype=cupy.float32)
    ours = engine.run(net, engine.Params(layers), x, backend="auto")
    assert ours.backend == "fused"                      # the wavefront schedules do not take P yet
    with torch.no_grad():
        want, _ = module(torch.from_dlpack(x))
    assert relative_error(cupy.asnumpy(ours.outputs), want.cpu().numpy().astype(np.float64)) <= 1e-5
