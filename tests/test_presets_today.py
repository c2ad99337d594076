"""The presets of cells after 2017 (issue #33) against PyTorch modules written here from the papers' equations, not
from the engine's cell graphs: forward outputs, final states and every gradient (x, the initial states, each
parameter), in float64, through engine.run and engine.bptt on the NumPy reference. Two layers, so the second layer
reads the first one's outputs. (The GPU backends are held to the reference by the GPU suite, which runs every
preset.)"""
from __future__ import annotations

import numpy as np
import pytest

import engine

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the presets are not checked against "
                                             "modules written in PyTorch (pip install -r requirements-test.txt)")

I, H, L, T, B = 5, 6, 2, 7, 3


def mingru(x, state, p):
    (h,) = state
    z = torch.sigmoid(x @ p["W_z"].T + p["b_z"])
    h_tilde = x @ p["W_h"].T + p["b_h"]
    h = (1 - z) * h + z * h_tilde
    return h, (h,)


def minlstm(x, state, p):
    (h,) = state
    f = torch.sigmoid(x @ p["W_f"].T + p["b_f"])
    i = torch.sigmoid(x @ p["W_i"].T + p["b_i"])
    h_tilde = x @ p["W_h"].T + p["b_h"]
    h = f / (f + i) * h + i / (f + i) * h_tilde
    return h, (h,)


def qrnn_f(x, state, p):
    h, c = state
    z = torch.tanh(x @ p["W_z"].T + p["b_z"])
    f = torch.sigmoid(x @ p["W_f"].T + p["b_f"])
    o = torch.sigmoid(x @ p["W_o"].T + p["b_o"])
    c = f * c + (1 - f) * z
    h = o * c
    return h, (h, c)


def mi_lstm(x, state, p):
    h, c = state

    def pre(k):
        wx, uh = x @ p[f"W_{k}"].T, h @ p[f"U_{k}"].T
        return p[f"alpha_{k}"] * wx * uh + p[f"beta1_{k}"] * uh + p[f"beta2_{k}"] * wx + p[f"b_{k}"]
    i, f, o, g = torch.sigmoid(pre("i")), torch.sigmoid(pre("f")), torch.sigmoid(pre("o")), torch.tanh(pre("g"))
    c = f * c + i * g
    h = o * torch.tanh(c)
    return h, (h, c)


MODULES = {"mingru": (mingru, ("h",)), "minlstm": (minlstm, ("h",)), "qrnn_f": (qrnn_f, ("h", "c")),
           "mi_lstm": (mi_lstm, ("h", "c"))}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_the_preset_equals_the_papers_equations_in_pytorch(name):
    step, state_names = MODULES[name]
    preset = engine.preset(name)
    assert preset.citation and preset.doc
    network = engine.Network(preset.cell, I, H, L)
    params = engine.init_params(network, seed=3)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((T, B, I))
    initial = {s: rng.uniform(-0.8, 0.8, (L, B, H)) for s in preset.cell.state_names}
    d_out = rng.standard_normal((T, B, H))
    d_final = {s: rng.standard_normal((L, B, H)) for s in preset.cell.state_names}

    tx = torch.tensor(x, requires_grad=True)
    t_init = {s: torch.tensor(v, requires_grad=True) for s, v in initial.items()}
    t_params = [{k: torch.tensor(v, requires_grad=True) for k, v in params[layer].items()} for layer in range(L)]
    layer_in, finals = tx, {s: [] for s in state_names}
    for layer in range(L):
        state = tuple(t_init[s][layer] for s in state_names)
        outputs = []
        for t in range(T):
            out, state = step(layer_in[t], state, t_params[layer])
            outputs.append(out)
        layer_in = torch.stack(outputs)
        for s, value in zip(state_names, state):
            finals[s].append(value)
    finals = {s: torch.stack(v) for s, v in finals.items()}
    loss = (layer_in * torch.tensor(d_out)).sum() + sum((finals[s] * torch.tensor(d_final[s])).sum()
                                                        for s in state_names)
    loss.backward()

    run = engine.run(network, params, x, initial, backend="reference", dtype=np.float64)
    np.testing.assert_allclose(run.outputs, layer_in.detach().numpy(), rtol=1e-12, atol=1e-13)
    for s in state_names:
        np.testing.assert_allclose(run.final_states[s], finals[s].detach().numpy(), rtol=1e-12, atol=1e-13)
    grads = engine.bptt(network, params, x, initial, d_outputs=d_out, d_final_states=d_final)
    np.testing.assert_allclose(grads.x, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    for s in state_names:        # a state nothing reads (qrnn_f's h) has no gradient in torch: zeros in the engine
        want = t_init[s].grad.numpy() if t_init[s].grad is not None else np.zeros_like(initial[s])
        np.testing.assert_allclose(grads.initial_states[s], want, rtol=1e-10, atol=1e-12)
    for layer in range(L):
        for k, tensor in t_params[layer].items():
            np.testing.assert_allclose(grads.params[layer][k], tensor.grad.numpy(), rtol=1e-10, atol=1e-12,
                                       err_msg=f"layer {layer} '{k}'")
