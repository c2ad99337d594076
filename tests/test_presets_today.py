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

I, H, L, T, B = 5, 8, 2, 7, 3
F = torch.nn.functional


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


def cat(p, names):
    return torch.cat([p[k] for k in names], dim=-1)


def ln_lstm(x, state, p):
    """Haste's LayerNormLSTM step: LN over the 4H pre-activations (gain only), then LN of c before its tanh."""
    h, c = state
    gates = ("i", "g", "f", "o")
    wx = F.layer_norm(torch.cat([x @ p[f"W_{k}"].T for k in gates], -1), (4 * H,),
                      weight=cat(p, [f"gx_{k}" for k in gates]))
    rh = F.layer_norm(torch.cat([h @ p[f"R_{k}"].T for k in gates], -1), (4 * H,),
                      weight=cat(p, [f"gh_{k}" for k in gates]))
    i, g, f, o = torch.chunk(wx + rh + cat(p, [f"b_{k}" for k in gates]), 4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(F.layer_norm(c, (H,), weight=p["g_c"], bias=p["beta_c"]))
    return h, (h, c)


def ln_gru(x, state, p):
    """Haste's LayerNormGRU step: LN over the 3H projections of x and of h (gain only), each plus its bias."""
    (h,) = state
    gates = ("z", "r", "g")
    wx = F.layer_norm(torch.cat([x @ p[f"W_{k}"].T for k in gates], -1), (3 * H,),
                      weight=cat(p, [f"gx_{k}" for k in gates])) + cat(p, [f"bx_{k}" for k in gates])
    rh = F.layer_norm(torch.cat([h @ p[f"R_{k}"].T for k in gates], -1), (3 * H,),
                      weight=cat(p, [f"gh_{k}" for k in gates])) + cat(p, [f"bh_{k}" for k in gates])
    x_z, x_r, x_g = torch.chunk(wx, 3, dim=-1)
    h_z, h_r, h_g = torch.chunk(rh, 3, dim=-1)
    z, r = torch.sigmoid(x_z + h_z), torch.sigmoid(x_r + h_r)
    h = z * h + (1 - z) * torch.tanh(x_g + r * h_g)
    return h, (h,)


def heads_matmul(weight, value):
    """A block-diagonal weight stored as (heads, rows/heads, cols/heads) times each row of value."""
    heads, rows, cols = weight.shape
    return torch.einsum("bhc,hrc->bhr", value.reshape(-1, heads, cols), weight).reshape(-1, heads * rows)


def slstm(x, state, p):
    """sLSTM (xLSTM eqs. 8-17) with FlashRNN's normalizer floor max(n, 1), from a state with n >= 1."""
    h, c, n, m = state
    pre = {k: x @ p[f"W_{k}"].T + heads_matmul(p[f"R_{k}"], h) + p[f"b_{k}"] for k in "ifzo"}
    log_f_m = F.logsigmoid(pre["f"]) + m
    m_new = torch.maximum(pre["i"], log_f_m)
    i, f = torch.exp(pre["i"] - m_new), torch.exp(log_f_m - m_new)
    c = f * c + i * torch.tanh(pre["z"])
    n = torch.maximum(f * n + i, torch.ones_like(n))
    h = torch.sigmoid(pre["o"]) * c / n
    return h, (h, c, n, m_new)


MODULES = {"mingru": (mingru, ("h",)), "minlstm": (minlstm, ("h",)), "qrnn_f": (qrnn_f, ("h", "c")),
           "mi_lstm": (mi_lstm, ("h", "c")), "ln_lstm": (ln_lstm, ("h", "c")), "ln_gru": (ln_gru, ("h",)),
           "slstm": (slstm, ("h", "c", "n", "m"))}


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
    if name == "slstm":                  # a normalizer the cell can hold (n >= 1 after any step)
        initial["n"] = rng.uniform(1.0, 2.0, (L, B, H))
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


def test_slstm_equals_flashrnn_vanilla_from_the_zero_start():
    """The slstm preset against FlashRNN's own PyTorch sLSTM (flashrnn 1.0.8, backend="vanilla": NX-AI's code, not
    written here), from the zero initial state FlashRNN starts from (its m_1 = i~_1 branch), forward and the
    gradients of x, every W, R and b. The GPU suite holds the engine's GPU paths to the reference."""
    flashrnn = pytest.importorskip("flashrnn", reason="flashrnn is not installed (pip install flashrnn==1.0.8): "
                                                      "the slstm preset is not checked against FlashRNN's sLSTM")
    preset = engine.preset("slstm")
    heads = preset.cell["R_i"].attr("heads")
    network = engine.Network(preset.cell, I, H, 1)
    params = engine.init_params(network, seed=5)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((T, B, I))
    d_out = rng.standard_normal((T, B, H))
    gates, d = "ifzo", H // heads
    tx = torch.tensor(x, requires_grad=True)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params[0].items()}
    wx = torch.stack([tx @ tp[f"W_{k}"].T for k in gates], dim=2)                    # (T, B, gates, H)
    wx = wx.reshape(T, B, 4, heads, d).permute(1, 0, 2, 3, 4)                        # FlashRNN's (B, T, G, N, D)
    r = torch.stack([tp[f"R_{k}"] for k in gates])                                   # (G, N, D, D)
    bias = torch.stack([tp[f"b_{k}"].reshape(heads, d) for k in gates])              # (G, N, D)
    states, _ = flashrnn.flashrnn(wx, r, bias, states=None, function="slstm", backend="vanilla", dtype="float64")
    y = states[0].permute(1, 0, 2, 3).reshape(T, B, H)                               # state 0 is h, (T, B, H)
    (y * torch.tensor(d_out)).sum().backward()

    run = engine.run(network, params, x, backend="reference", dtype=np.float64)
    np.testing.assert_allclose(run.outputs, y.detach().numpy(), rtol=1e-12, atol=1e-13)
    grads = engine.bptt(network, params, x, d_outputs=d_out)
    np.testing.assert_allclose(grads.x, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    for k, tensor in tp.items():
        np.testing.assert_allclose(grads.params[0][k], tensor.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=k)


def test_the_slstm_input_gate_bias_has_no_gradient_from_the_zero_start():
    """From zero c and n, scaling unit j's input gate by e^delta at every step scales its c and n alike, and
    h = o c / n does not move: dL/db_i is 0 in exact arithmetic (the stabilizer m cancels in c / n). So a comparison
    of b_i's gradients between precisions or implementations measures rounding alone (benchmarks/cells_today.py leaves
    such gradients out of its largest relative difference). Every other parameter's gradient is not small."""
    network = engine.Network(engine.preset("slstm").cell, 16, 32, 1)
    params = engine.init_params(network, seed=1)
    rng = np.random.default_rng(0)
    grads = engine.bptt(network, params, rng.standard_normal((50, 4, 16)),
                        d_outputs=rng.standard_normal((50, 4, 32))).params[0]
    norms = {k: np.linalg.norm(g) for k, g in grads.items()}
    largest = max(norms.values())
    assert norms["b_i"] <= 1e-14 * largest
    assert all(n >= 1e-3 * largest for k, n in norms.items() if k != "b_i"), norms
