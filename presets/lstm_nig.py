r"""Greff et al.'s variant NIG (No Input Gate): the vanilla LSTM with i_t = 1.

    z_t = tanh(W_z x_t + R_z h_{t-1} + b_z)
    f_t = sigmoid(W_f x_t + R_f h_{t-1} + p_f * c_{t-1} + b_f)
    c_t = z_t + c_{t-1} * f_t
    o_t = sigmoid(W_o x_t + R_o h_{t-1} + p_o * c_t + b_o)
    h_t = tanh(c_t) * o_t

With the input gate fixed at 1 its weights W_i, R_i, p_i, b_i disappear and the block input is
always written into the cell.
"""
from engine.dsl import W, b, cell, sigmoid, tanh, v
from engine.gallery import Preset


@cell
def lstm_nig(x, h, c):
    z = tanh(W("W_z") @ x + W("R_z") @ h + b("b_z"))
    f = sigmoid(W("W_f") @ x + W("R_f") @ h + v("p_f") * c + b("b_f"))
    c_next = z + c * f
    o = sigmoid(W("W_o") @ x + W("R_o") @ h + v("p_o") * c_next + b("b_o"))
    h_next = tanh(c_next) * o
    return {"h": h_next, "c": c_next}


PRESET = Preset(
    cell=lstm_nig,
    family="LSTM",
    title="LSTM variant NIG: no input gate",
    citation="K. Greff, R. K. Srivastava, J. Koutnik, B. R. Steunebrink, J. Schmidhuber. LSTM: A Search Space "
             "Odyssey. IEEE Transactions on Neural Networks and Learning Systems 28(10):2222-2232, 2017 "
             "(online 2016). Variant NIG (no input gate).",
    cudnn=None,
)
