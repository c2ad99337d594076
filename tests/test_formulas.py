"""Presets against their papers' equations, written out again here in plain NumPy (float64, 1e-12).

Each formula below is transcribed from the paper (see the preset's docstring), not derived from the
cell graph: it reads the parameters by name and nothing else. The reference backend runs the graph;
the two must agree over several layers and steps from non-zero initial states. Presets that PyTorch
computes are checked against torch.nn instead (test_torch_parity.py).
"""
from __future__ import annotations

import numpy as np
import pytest

import engine


def sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def lin(p, name, value):
    """The paper's W v for a weight stored as (rows, cols), applied to a batch of row vectors (B, cols)."""
    return value @ p[name].T


# ---- the formulas ----------------------------------------------------------------------------
# Each takes (params of one layer, x_t (B, I), states {name: (B, H)}) and returns the next states.

def peephole_lstm(p, x, s):
    h, c = s["h"], s["c"]
    i = sigmoid(lin(p, "W_ii", x) + lin(p, "W_hi", h) + p["p_i"] * c + p["b_i"])
    f = sigmoid(lin(p, "W_if", x) + lin(p, "W_hf", h) + p["p_f"] * c + p["b_f"])
    g = np.tanh(lin(p, "W_ig", x) + lin(p, "W_hg", h) + p["b_g"])
    c_new = f * c + i * g
    o = sigmoid(lin(p, "W_io", x) + lin(p, "W_ho", h) + p["p_o"] * c_new + p["b_o"])
    return {"h": o * np.tanh(c_new), "c": c_new}


def lstm_proj(p, x, s):
    """Sak et al. (2014) / torch.nn.LSTM(proj_size): the LSTM's output projected by W_hr (P x H)."""
    h, c = s["h"], s["c"]
    i = sigmoid(lin(p, "W_ii", x) + p["b_ii"] + lin(p, "W_hi", h) + p["b_hi"])
    f = sigmoid(lin(p, "W_if", x) + p["b_if"] + lin(p, "W_hf", h) + p["b_hf"])
    g = np.tanh(lin(p, "W_ig", x) + p["b_ig"] + lin(p, "W_hg", h) + p["b_hg"])
    o = sigmoid(lin(p, "W_io", x) + p["b_io"] + lin(p, "W_ho", h) + p["b_ho"])
    c_new = f * c + i * g
    return {"h": lin(p, "W_hr", o * np.tanh(c_new)), "c": c_new}


def lstm_nofg(p, x, s):
    h, c = s["h"], s["c"]
    i = sigmoid(lin(p, "W_ii", x) + lin(p, "W_hi", h) + p["b_i"])
    g = np.tanh(lin(p, "W_ig", x) + lin(p, "W_hg", h) + p["b_g"])
    o = sigmoid(lin(p, "W_io", x) + lin(p, "W_ho", h) + p["b_o"])
    c_new = c + i * g
    return {"h": o * np.tanh(c_new), "c": c_new}


def gru_cho(p, x, s):
    h = s["h"]
    r = sigmoid(lin(p, "W_r", x) + lin(p, "U_r", h) + p["b_r"])
    z = sigmoid(lin(p, "W_z", x) + lin(p, "U_z", h) + p["b_z"])
    n = np.tanh(lin(p, "W_n", x) + p["b_n"] + lin(p, "U_n", r * h))
    return {"h": z * h + (1.0 - z) * n}


def mgu(p, x, s):
    h = s["h"]
    f = sigmoid(lin(p, "W_f", x) + lin(p, "U_f", h) + p["b_f"])
    h_tilde = np.tanh(lin(p, "W_h", x) + lin(p, "U_h", f * h) + p["b_h"])
    return {"h": (1.0 - f) * h + f * h_tilde}


def indrnn(p, x, s):
    return {"h": np.maximum(lin(p, "W", x) + p["u"] * s["h"] + p["b"], 0.0)}


def mingru(p, x, s):
    """Feng et al. 2024, Algorithm 2 (sequential): gate and candidate from the input only."""
    z = sigmoid(lin(p, "W_z", x) + p["b_z"])
    return {"h": (1.0 - z) * s["h"] + z * (lin(p, "W_h", x) + p["b_h"])}


def minlstm(p, x, s):
    """Feng et al. 2024, Algorithm 4 (sequential): forget and input gates normalised to sum to one."""
    f, i = sigmoid(lin(p, "W_f", x) + p["b_f"]), sigmoid(lin(p, "W_i", x) + p["b_i"])
    return {"h": (f * s["h"] + i * (lin(p, "W_h", x) + p["b_h"])) / (f + i)}


def qrnn_f(p, x, s):
    """Bradbury et al. 2017, fo-pooling (eq. 4) with width-1 convolutions."""
    z = np.tanh(lin(p, "W_z", x) + p["b_z"])
    f, o = sigmoid(lin(p, "W_f", x) + p["b_f"]), sigmoid(lin(p, "W_o", x) + p["b_o"])
    c = f * s["c"] + (1.0 - f) * z
    return {"c": c, "h": o * c}


def mi_lstm(p, x, s):
    """Wu et al. 2016, MI-LSTM: alpha * Wx * Uh + beta1 * Uh + beta2 * Wx + b for each gate."""
    def pre(k):
        wx, uh = lin(p, f"W_{k}", x), lin(p, f"U_{k}", s["h"])
        return p[f"alpha_{k}"] * wx * uh + p[f"beta1_{k}"] * uh + p[f"beta2_{k}"] * wx + p[f"b_{k}"]
    c = sigmoid(pre("f")) * s["c"] + sigmoid(pre("i")) * np.tanh(pre("g"))
    return {"c": c, "h": sigmoid(pre("o")) * np.tanh(c)}


def layer_norm(parts, eps=1e-5):
    """Ba et al. 2016: each row of the parts side by side, minus its mean, over its standard deviation (biased)."""
    joined = np.concatenate(parts, axis=-1)
    mean = joined.mean(axis=-1, keepdims=True)
    normed = (joined - mean) / np.sqrt(joined.var(axis=-1, keepdims=True) + eps)
    return np.split(normed, len(parts), axis=-1)


def ln_lstm(p, x, s):
    """Haste's LayerNormLSTM: LN over the 4H input and recurrent pre-activations (gains), LN of c (gain, bias)."""
    gates = ("i", "g", "f", "o")
    wx = layer_norm([lin(p, f"W_{k}", x) for k in gates])
    rh = layer_norm([lin(p, f"R_{k}", s["h"]) for k in gates])
    i, g, f, o = (a * p[f"gx_{k}"] + r * p[f"gh_{k}"] + p[f"b_{k}"] for a, r, k in zip(wx, rh, gates))
    c = sigmoid(f) * s["c"] + sigmoid(i) * np.tanh(g)
    return {"c": c, "h": sigmoid(o) * np.tanh(layer_norm([c])[0] * p["g_c"] + p["beta_c"])}


def ln_gru(p, x, s):
    """Haste's LayerNormGRU: LN over the 3H projections of x and of h (gains), each plus its own bias."""
    gates = ("z", "r", "g")
    wx = [a * p[f"gx_{k}"] + p[f"bx_{k}"] for a, k in zip(layer_norm([lin(p, f"W_{k}", x) for k in gates]), gates)]
    rh = [a * p[f"gh_{k}"] + p[f"bh_{k}"] for a, k in zip(layer_norm([lin(p, f"R_{k}", s["h"]) for k in gates]),
                                                          gates)]
    z, r = sigmoid(wx[0] + rh[0]), sigmoid(wx[1] + rh[1])
    return {"h": z * s["h"] + (1 - z) * np.tanh(wx[2] + r * rh[2])}


def slstm(p, x, s):
    """xLSTM's sLSTM (Beck et al. 2024, eqs. 8-17), 4 heads (block-diagonal R), with FlashRNN's n >= 1 floor and
    its first step: m = i~ where n < 1/2 (the zero start; n >= 1 after any step)."""
    def heads(name, value):
        k, r, c = p[name].shape
        return np.einsum("bhc,hrc->bhr", value.reshape(-1, k, c), p[name]).reshape(-1, k * r)
    pre = {k: lin(p, f"W_{k}", x) + heads(f"R_{k}", s["h"]) + p[f"b_{k}"] for k in "ifzo"}
    log_f_m = -np.logaddexp(0.0, -pre["f"]) + s["m"]
    m = np.where(s["n"] < 0.5, pre["i"], np.maximum(pre["i"], log_f_m))
    i, f = np.exp(pre["i"] - m), np.exp(log_f_m - m)
    c = f * s["c"] + i * np.tanh(pre["z"])
    n = np.maximum(f * s["n"] + i, 1.0)
    return {"h": sigmoid(pre["o"]) * c / n, "c": c, "n": n, "m": m}


def greff(variant):
    """Greff et al.'s vanilla LSTM (Sec. II) with one of the paper's eight modifications switched on."""
    def step(p, x, s):
        y, c = s["h"], s["c"]

        def gate(g, cell_state, extra=0.0):
            pre = lin(p, f"W_{g}", x) + lin(p, f"R_{g}", y) + p[f"b_{g}"] + extra
            if variant != "np":
                pre = pre + p[f"p_{g}"] * cell_state
            return sigmoid(pre)

        extra = {g: 0.0 for g in "ifo"}
        if variant == "fgr":   # R_ab: gate a at t-1 into gate b at t
            extra = {b: sum(lin(p, f"R_{a}{b}", s[a]) for a in "ifo") for b in "ifo"}
        z_pre = lin(p, "W_z", x) + lin(p, "R_z", y) + p["b_z"]
        z = z_pre if variant == "niaf" else np.tanh(z_pre)
        i = 1.0 if variant == "nig" else gate("i", c, extra["i"])
        if variant == "nfg":
            f = 1.0
        elif variant == "cifg":
            f = 1.0 - i
        else:
            f = gate("f", c, extra["f"])
        c_new = z * i + c * f
        o = 1.0 if variant == "nog" else gate("o", c_new, extra["o"])
        y_new = (c_new if variant == "noaf" else np.tanh(c_new)) * o
        out = {"h": y_new, "c": c_new}
        if variant == "fgr":
            out.update(i=i, f=f, o=o)
        return out
    return step


def lstm_cifg(p, x, s):
    """Written out in full (not through greff()) so that the coupling f = 1 - i is checked on its own."""
    y, c = s["h"], s["c"]
    z = np.tanh(lin(p, "W_z", x) + lin(p, "R_z", y) + p["b_z"])
    i = sigmoid(lin(p, "W_i", x) + lin(p, "R_i", y) + p["p_i"] * c + p["b_i"])
    f = 1.0 - i
    c_new = z * i + c * f
    o = sigmoid(lin(p, "W_o", x) + lin(p, "R_o", y) + p["p_o"] * c_new + p["b_o"])
    return {"h": np.tanh(c_new) * o, "c": c_new}


def lstm_fgr(p, x, s):
    """Written out in full: nine gate-to-gate matrices, gates of step t-1 carried as states i, f, o."""
    y, c, i_prev, f_prev, o_prev = s["h"], s["c"], s["i"], s["f"], s["o"]
    z = np.tanh(lin(p, "W_z", x) + lin(p, "R_z", y) + p["b_z"])
    i = sigmoid(lin(p, "W_i", x) + lin(p, "R_i", y) + p["p_i"] * c + p["b_i"]
                + lin(p, "R_ii", i_prev) + lin(p, "R_fi", f_prev) + lin(p, "R_oi", o_prev))
    f = sigmoid(lin(p, "W_f", x) + lin(p, "R_f", y) + p["p_f"] * c + p["b_f"]
                + lin(p, "R_if", i_prev) + lin(p, "R_ff", f_prev) + lin(p, "R_of", o_prev))
    c_new = z * i + c * f
    o = sigmoid(lin(p, "W_o", x) + lin(p, "R_o", y) + p["p_o"] * c_new + p["b_o"]
                + lin(p, "R_io", i_prev) + lin(p, "R_fo", f_prev) + lin(p, "R_oo", o_prev))
    return {"h": np.tanh(c_new) * o, "c": c_new, "i": i, "f": f, "o": o}


FORMULAS = {
    "peephole_lstm": peephole_lstm,
    "lstm_proj": lstm_proj,
    "lstm_nofg": lstm_nofg,
    "gru_cho": gru_cho,
    "mgu": mgu,
    "indrnn": indrnn,
    "mingru": mingru,
    "minlstm": minlstm,
    "qrnn_f": qrnn_f,
    "mi_lstm": mi_lstm,
    "ln_lstm": ln_lstm,
    "ln_gru": ln_gru,
    "slstm": slstm,
    "lstm_cifg": lstm_cifg,
    "lstm_fgr": lstm_fgr,
    "vanilla_lstm": greff("vanilla"),
    **{f"lstm_{v}": greff(v) for v in ("nig", "nfg", "nog", "niaf", "noaf", "np")},
}
# The Greff variants also go through greff() as a second, table-driven transcription.
GREFF_ALSO = {"lstm_cifg": greff("cifg"), "lstm_fgr": greff("fgr")}


def run_formula(step, case):
    """Stack layers and unroll time exactly as a network does: layer l reads layer l-1's outputs."""
    layer_in = case.x
    finals = {name: [] for name in case.preset.cell.state_names}
    for layer in range(case.network.num_layers):
        states = {name: case.initial_states[name][layer] for name in finals}
        outputs = []
        for t in range(layer_in.shape[0]):
            states = step(case.params[layer], layer_in[t], states)
            outputs.append(states["h"])
        layer_in = np.stack(outputs)
        for name in finals:
            finals[name].append(states[name])
    return layer_in, {name: np.stack(v) for name, v in finals.items()}


CHECKS = [(name, step, name) for name, step in FORMULAS.items()] + \
         [(name, step, f"{name}-table") for name, step in GREFF_ALSO.items()]


@pytest.mark.parametrize("name,step", [c[:2] for c in CHECKS], ids=[c[2] for c in CHECKS])
def test_preset_matches_paper_formula(name, step, make_case, run_reference):
    case = make_case(engine.preset(name), num_layers=3, seed=11)
    result = run_reference(case)
    outputs, finals = run_formula(step, case)
    np.testing.assert_allclose(result.outputs, outputs, rtol=0, atol=1e-12)
    for state, value in finals.items():
        np.testing.assert_allclose(result.final_states[state], value, rtol=0, atol=1e-12, err_msg=state)


@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_formula_check_is_sensitive(name, make_case, run_reference):
    """The comparison can fail: nudging one parameter of the graph's run moves it off the formula."""
    case = make_case(engine.preset(name), num_layers=1, seed=5)
    param = case.preset.cell.params[-1].name
    bumped = engine.Params([dict(layer) for layer in case.params.layers])
    bumped.layers[0][param] = bumped.layers[0][param] + 1e-3
    result = run_reference(case, params=bumped)
    outputs, _ = run_formula(FORMULAS[name], case)
    assert np.max(np.abs(result.outputs - outputs)) > 1e-8


def test_every_preset_has_an_independent_check():
    """A preset is checked against either its paper's formula here or torch.nn in test_torch_parity."""
    torch_checked = {name for name, p in engine.presets().items() if p.torch is not None}
    unchecked = set(engine.presets()) - set(FORMULAS) - torch_checked
    assert not unchecked, f"presets with no independent check: {sorted(unchecked)}"
