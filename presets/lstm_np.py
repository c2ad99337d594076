r"""Greff et al.'s variant NP (No Peepholes): the vanilla LSTM without p_i, p_f, p_o.

    z_t = tanh(W_z x_t + R_z h_{t-1} + b_z)
    i_t = sigmoid(W_i x_t + R_i h_{t-1} + b_i)
    f_t = sigmoid(W_f x_t + R_f h_{t-1} + b_f)
    c_t = z_t * i_t + c_{t-1} * f_t
    o_t = sigmoid(W_o x_t + R_o h_{t-1} + b_o)
    h_t = tanh(c_t) * o_t

This is the function of cuDNN's and PyTorch's LSTM with a single bias per gate (their b_ih + b_hh
summed into one); the parameters are separate per gate here, so it carries no TorchLayout.
"""
from engine.dsl import W, b, cell, sigmoid, tanh
from engine.gallery import Preset


@cell
def lstm_np(x, h, c):
    z = tanh(W("W_z") @ x + W("R_z") @ h + b("b_z"))
    i = sigmoid(W("W_i") @ x + W("R_i") @ h + b("b_i"))
    f = sigmoid(W("W_f") @ x + W("R_f") @ h + b("b_f"))
    c_next = z * i + c * f
    o = sigmoid(W("W_o") @ x + W("R_o") @ h + b("b_o"))
    h_next = tanh(c_next) * o
    return {"h": h_next, "c": c_next}


PRESET = Preset(
    cell=lstm_np,
    family="LSTM",
    title="LSTM variant NP: no peepholes",
    citation="K. Greff, R. K. Srivastava, J. Koutnik, B. R. Steunebrink, J. Schmidhuber. LSTM: A Search Space "
             "Odyssey. IEEE Transactions on Neural Networks and Learning Systems 28(10):2222-2232, 2017 "
             "(online 2016). Variant NP (no peepholes).",
    cudnn=None,
)
