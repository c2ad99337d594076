r"""Greff et al.'s variant NOAF (No Output Activation Function): the cell state is not squashed.

    z_t = tanh(W_z x_t + R_z h_{t-1} + b_z)
    i_t = sigmoid(W_i x_t + R_i h_{t-1} + p_i * c_{t-1} + b_i)
    f_t = sigmoid(W_f x_t + R_f h_{t-1} + p_f * c_{t-1} + b_f)
    c_t = z_t * i_t + c_{t-1} * f_t
    o_t = sigmoid(W_o x_t + R_o h_{t-1} + p_o * c_t + b_o)
    h_t = c_t * o_t

The paper's h(.) is the identity. The block output is then unbounded whenever c_t is, which the
paper found hurts most when the forget gate cannot keep c_t small.
"""
from engine.dsl import W, b, cell, sigmoid, tanh, v
from engine.gallery import Preset


@cell
def lstm_noaf(x, h, c):
    z = tanh(W("W_z") @ x + W("R_z") @ h + b("b_z"))
    i = sigmoid(W("W_i") @ x + W("R_i") @ h + v("p_i") * c + b("b_i"))
    f = sigmoid(W("W_f") @ x + W("R_f") @ h + v("p_f") * c + b("b_f"))
    c_next = z * i + c * f
    o = sigmoid(W("W_o") @ x + W("R_o") @ h + v("p_o") * c_next + b("b_o"))
    h_next = c_next * o
    return {"h": h_next, "c": c_next}


PRESET = Preset(
    cell=lstm_noaf,
    family="LSTM",
    title="LSTM variant NOAF: no output activation function",
    citation="K. Greff, R. K. Srivastava, J. Koutnik, B. R. Steunebrink, J. Schmidhuber. LSTM: A Search Space "
             "Odyssey. IEEE Transactions on Neural Networks and Learning Systems 28(10):2222-2232, 2017 "
             "(online 2016). Variant NOAF (no output activation function).",
    cudnn=None,
)
