"""bptt against torch autograd on the CPU in float64: torch.nn.LSTM, GRU and RNN (tanh, relu) with 2 layers, and the
LSTM with proj_size, loaded with the same weights (engine.torch_layout). The gradients of every parameter, of the
input and of the initial states must agree to 1e-10. Also the kink conventions of relu and hard_sigmoid.
"""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.autodiff import bptt
from engine.ops import apply_backward
from engine.torch_layout import to_torch_state_dict

TORCH_PRESETS = sorted(name for name, p in engine.presets().items() if p.torch is not None)
TOL = 1e-10


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed: gradients are not compared with torch "
                                               "autograd (pip install -r requirements-test.txt)")


def random_adjoints(rng, network, steps, batch):
    d_outputs = rng.standard_normal((steps, batch, network.output_size))
    d_final = {s: rng.standard_normal((network.num_layers, batch, network.state_size(s)))
               for s in network.cell.state_names}
    return d_outputs, d_final


def torch_gradients(torch, module, x, initial, d_outputs, d_final, state_order):
    """Gradients of sum(d_outputs * out) + sum(d_final * final states) by autograd: (params by name, x, states)."""
    x_t = torch.from_numpy(x).requires_grad_()
    hx = [torch.from_numpy(initial[s]).requires_grad_() for s in state_order]
    out, final = module(x_t, tuple(hx) if len(hx) > 1 else hx[0])
    final = final if isinstance(final, tuple) else (final,)
    loss = (out * torch.from_numpy(d_outputs)).sum()
    for s, value in zip(state_order, final):
        loss = loss + (value * torch.from_numpy(d_final[s])).sum()
    loss.backward()
    params = {name: p.grad.numpy() for name, p in module.named_parameters()}
    return params, x_t.grad.numpy(), {s: h.grad.numpy() for s, h in zip(state_order, hx)}


@pytest.mark.parametrize("name", TORCH_PRESETS)
def test_gradients_equal_torch_autograd(name, torch):
    preset = engine.preset(name)
    layout = preset.torch
    network = engine.Network(preset.cell, input_size=5, hidden_size=6, num_layers=2)
    params = engine.init_params(network, seed=11)
    rng = np.random.default_rng(12)
    T, B = 7, 3
    x = rng.standard_normal((T, B, 5))
    initial = {s: rng.uniform(-0.8, 0.8, (2, B, 6)) for s in preset.cell.state_names}
    d_outputs, d_final = random_adjoints(rng, network, T, B)

    kwargs = {"nonlinearity": layout.nonlinearity} if layout.module == "RNN" else {}
    module = getattr(torch.nn, layout.module)(5, 6, 2, **kwargs).double()
    module.load_state_dict({k: torch.from_numpy(v) for k, v in to_torch_state_dict(network, params, layout).items()})
    order = [ours for _, ours in layout.state_map]
    want_params, want_x, want_states = torch_gradients(torch, module, x, initial, d_outputs, d_final, order)

    g = bptt(network, params, x, initial, d_outputs, d_final)
    got_params = to_torch_state_dict(network, engine.Params(g.params), layout)     # the same packing as weights
    assert set(got_params) == set(want_params)
    for key, value in want_params.items():
        np.testing.assert_allclose(got_params[key], value, rtol=0, atol=TOL, err_msg=key)
    np.testing.assert_allclose(g.x, want_x, rtol=0, atol=TOL)
    for s, value in want_states.items():
        np.testing.assert_allclose(g.initial_states[s], value, rtol=0, atol=TOL, err_msg=s)
    assert np.abs(g.params[0][layout.weight_hh[0]]).max() > 1e-3                 # not trivially zero


def test_gradients_equal_torch_lstm_with_proj_size(torch):
    I, H, P, L, T, B = 4, 6, 3, 2, 5, 3
    network = engine.Network(engine.preset("lstm_proj").cell, I, H, L, proj_size=P)
    params = engine.init_params(network, seed=4)
    module = torch.nn.LSTM(I, H, L, proj_size=P).double()
    state = {}
    for layer in range(L):
        p = params[layer]
        for key, names in (("weight_ih", "W_ii W_if W_ig W_io"), ("weight_hh", "W_hi W_hf W_hg W_ho"),
                           ("bias_ih", "b_ii b_if b_ig b_io"), ("bias_hh", "b_hi b_hf b_hg b_ho")):
            state[f"{key}_l{layer}"] = torch.from_numpy(np.concatenate([p[n] for n in names.split()]))
        state[f"weight_hr_l{layer}"] = torch.from_numpy(p["W_hr"])
    module.load_state_dict(state)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((T, B, I))
    initial = {"h": rng.uniform(-0.8, 0.8, (L, B, P)), "c": rng.uniform(-0.8, 0.8, (L, B, H))}
    d_outputs, d_final = random_adjoints(rng, network, T, B)
    want_params, want_x, want_states = torch_gradients(torch, module, x, initial, d_outputs, d_final, ["h", "c"])

    g = bptt(network, params, x, initial, d_outputs, d_final)
    for layer in range(L):
        got = g.params[layer]
        np.testing.assert_allclose(got["W_hr"], want_params[f"weight_hr_l{layer}"], rtol=0, atol=TOL)
        for k, gate in enumerate("ifgo"):
            rows = slice(k * H, (k + 1) * H)
            for ours, theirs in ((f"W_i{gate}", "weight_ih"), (f"W_h{gate}", "weight_hh"), (f"b_i{gate}", "bias_ih"),
                                 (f"b_h{gate}", "bias_hh")):
                np.testing.assert_allclose(got[ours], want_params[f"{theirs}_l{layer}"][rows], rtol=0, atol=TOL,
                                           err_msg=f"layer {layer} {ours}")
    np.testing.assert_allclose(g.x, want_x, rtol=0, atol=TOL)
    for s in ("h", "c"):
        np.testing.assert_allclose(g.initial_states[s], want_states[s], rtol=0, atol=TOL, err_msg=s)


def test_kinks_follow_torch(torch):
    """At relu's 0 and hard_sigmoid's -3 and 3 (and around them) the rules give what autograd gives."""
    points = np.array([-4.0, -3.0, -3.0 + 1e-12, -1e-300, 0.0, 1e-300, 3.0 - 1e-12, 3.0, 4.0])
    dy = np.linspace(0.5, 1.5, points.size)
    for op, forward in (("relu", torch.relu), ("hard_sigmoid", torch.nn.functional.hardsigmoid)):
        x = torch.from_numpy(points.copy()).requires_grad_()
        y = forward(x)
        y.backward(torch.from_numpy(dy))
        saved = y.detach().numpy() if op == "relu" else points              # what each rule reads: y, or x
        ours, theirs = apply_backward(f"{op}_grad", [dy, saved], {}), x.grad.numpy()
        np.testing.assert_array_equal(ours == 0, theirs == 0, err_msg=op)
        # torch's hardsigmoid_backward multiplies by 1.0f / 6.0f, a float32 constant even in float64
        np.testing.assert_allclose(ours, theirs, rtol=1e-7, atol=0, err_msg=op)
