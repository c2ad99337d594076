r"""GRU with layer normalization of its input and recurrent projections (Ba, Kiros & Hinton, 2016), in the form of
Haste's LayerNormGRU (lmnt-com/haste, frameworks/pytorch/layer_norm_gru.py):

    [x_z, x_r, x_g] = LN(W x_t; gamma_x) + b_x          (LN over the 3H units jointly, gain only)
    [h_z, h_r, h_g] = LN(R h_{t-1}; gamma_h) + b_h
    z = sigmoid(x_z + h_z),  r = sigmoid(x_r + h_r)
    g = tanh(x_g + r h_g)
    h_t = z h_{t-1} + (1 - z) g

The reset gate multiplies the normalized recurrent projection of the candidate (cuDNN's "linear before reset"
order); LN(v; gamma) = (v - mean(v)) / sqrt(var(v) + 1e-5) * gamma.
"""
from engine.dsl import W, b, cell, layer_norm, sigmoid, tanh, v
from engine.gallery import Preset

GATES = ("z", "r", "g")


@cell
def ln_gru(x, h):
    wx = layer_norm([W(f"W_{k}") @ x for k in GATES])        # over the 3H units together
    rh = layer_norm([W(f"R_{k}") @ h for k in GATES])
    z = sigmoid(wx[0] * v("gx_z") + b("bx_z") + rh[0] * v("gh_z") + b("bh_z"))
    r = sigmoid(wx[1] * v("gx_r") + b("bx_r") + rh[1] * v("gh_r") + b("bh_r"))
    g = tanh(wx[2] * v("gx_g") + b("bx_g") + r * (rh[2] * v("gh_g") + b("bh_g")))
    h_next = z * h + (1 - z) * g
    return {"h": h_next}


PRESET = Preset(
    cell=ln_gru,
    family="LayerNorm",
    title="LayerNorm GRU (Haste form)",
    citation="J. L. Ba, J. R. Kiros, G. E. Hinton. Layer Normalization. arXiv:1607.06450, 2016; in the form of "
             "Haste's LayerNormGRU (LMNT, github.com/lmnt-com/haste).",
    cudnn=None,
)
