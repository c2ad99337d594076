r"""LSTM with layer normalization (Ba, Kiros & Hinton, 2016, "Layer Normalization", Sec. 6.4 / eqs. 20-22), in the
form of Haste's LayerNormLSTM (lmnt-com/haste, frameworks/pytorch/layer_norm_lstm.py):

    [i~, g~, f~, o~] = LN(W x_t; gamma_x) + LN(R h_{t-1}; gamma_h) + b     (each LN over the 4H units jointly)
    i, f, o = sigmoid(i~), sigmoid(f~), sigmoid(o~);  g = tanh(g~)
    c_t = f c_{t-1} + i g
    h_t = o tanh(LN(c_t; gamma_c, beta_c))                                 (LN over the H units)

LN(v; gamma, beta) = (v - mean(v)) / sqrt(var(v) + 1e-5) * gamma + beta; the two pre-activation norms have a gain
and no bias (the gate bias b follows them), as in Haste.
"""
from engine.dsl import W, b, cell, layer_norm, sigmoid, tanh, v
from engine.gallery import Preset

GATES = ("i", "g", "f", "o")


@cell
def ln_lstm(x, h, c):
    wx = layer_norm([W(f"W_{k}") @ x for k in GATES])        # over the 4H units together
    rh = layer_norm([W(f"R_{k}") @ h for k in GATES])
    i = sigmoid(wx[0] * v("gx_i") + rh[0] * v("gh_i") + b("b_i"))
    g = tanh(wx[1] * v("gx_g") + rh[1] * v("gh_g") + b("b_g"))
    f = sigmoid(wx[2] * v("gx_f") + rh[2] * v("gh_f") + b("b_f"))
    o = sigmoid(wx[3] * v("gx_o") + rh[3] * v("gh_o") + b("b_o"))
    c_next = f * c + i * g
    h_next = o * tanh(layer_norm(c_next) * v("g_c") + b("beta_c"))
    return {"h": h_next, "c": c_next}


PRESET = Preset(
    cell=ln_lstm,
    family="LayerNorm",
    title="LayerNorm LSTM (Haste form)",
    citation="J. L. Ba, J. R. Kiros, G. E. Hinton. Layer Normalization. arXiv:1607.06450, 2016, Sec. 6.4; in the "
             "form of Haste's LayerNormLSTM (LMNT, github.com/lmnt-com/haste).",
    cudnn=None,
)
