r"""Greff et al.'s variant NFG (No Forget Gate): the vanilla LSTM with f_t = 1.

    z_t = tanh(W_z x_t + R_z h_{t-1} + b_z)
    i_t = sigmoid(W_i x_t + R_i h_{t-1} + p_i * c_{t-1} + b_i)
    c_t = z_t * i_t + c_{t-1}
    o_t = sigmoid(W_o x_t + R_o h_{t-1} + p_o * c_t + b_o)
    h_t = tanh(c_t) * o_t

With the forget gate fixed at 1 the cell never decays (the 1997 LSTM's constant error carousel,
here with peepholes on the input and output gates).
"""
from engine.dsl import W, b, cell, sigmoid, tanh, v
from engine.gallery import Preset


@cell
def lstm_nfg(x, h, c):
    z = tanh(W("W_z") @ x + W("R_z") @ h + b("b_z"))
    i = sigmoid(W("W_i") @ x + W("R_i") @ h + v("p_i") * c + b("b_i"))
    c_next = z * i + c
    o = sigmoid(W("W_o") @ x + W("R_o") @ h + v("p_o") * c_next + b("b_o"))
    h_next = tanh(c_next) * o
    return {"h": h_next, "c": c_next}


PRESET = Preset(
    cell=lstm_nfg,
    family="LSTM",
    title="LSTM variant NFG: no forget gate",
    citation="K. Greff, R. K. Srivastava, J. Koutnik, B. R. Steunebrink, J. Schmidhuber. LSTM: A Search Space "
             "Odyssey. IEEE Transactions on Neural Networks and Learning Systems 28(10):2222-2232, 2017 "
             "(online 2016). Variant NFG (no forget gate).",
    cudnn=None,
)
