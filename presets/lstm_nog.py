r"""Greff et al.'s variant NOG (No Output Gate): the vanilla LSTM with o_t = 1.

    z_t = tanh(W_z x_t + R_z h_{t-1} + b_z)
    i_t = sigmoid(W_i x_t + R_i h_{t-1} + p_i * c_{t-1} + b_i)
    f_t = sigmoid(W_f x_t + R_f h_{t-1} + p_f * c_{t-1} + b_f)
    c_t = z_t * i_t + c_{t-1} * f_t
    h_t = tanh(c_t)

With the output gate fixed at 1 its weights W_o, R_o, p_o, b_o disappear; the block output is the
squashed cell state.
"""
from engine.dsl import W, b, cell, sigmoid, tanh, v
from engine.gallery import Preset


@cell
def lstm_nog(x, h, c):
    z = tanh(W("W_z") @ x + W("R_z") @ h + b("b_z"))
    i = sigmoid(W("W_i") @ x + W("R_i") @ h + v("p_i") * c + b("b_i"))
    f = sigmoid(W("W_f") @ x + W("R_f") @ h + v("p_f") * c + b("b_f"))
    c_next = z * i + c * f
    h_next = tanh(c_next)
    return {"h": h_next, "c": c_next}


PRESET = Preset(
    cell=lstm_nog,
    family="LSTM",
    title="LSTM variant NOG: no output gate",
    citation="K. Greff, R. K. Srivastava, J. Koutnik, B. R. Steunebrink, J. Schmidhuber. LSTM: A Search Space "
             "Odyssey. IEEE Transactions on Neural Networks and Learning Systems 28(10):2222-2232, 2017 "
             "(online 2016). Variant NOG (no output gate).",
    cudnn=None,
)
