r"""The vanilla LSTM of Greff et al. (2016): forget gate, peepholes, one bias per gate.

    z_t = tanh(W_z x_t + R_z h_{t-1} + b_z)
    i_t = sigmoid(W_i x_t + R_i h_{t-1} + p_i * c_{t-1} + b_i)
    f_t = sigmoid(W_f x_t + R_f h_{t-1} + p_f * c_{t-1} + b_f)
    c_t = z_t * i_t + c_{t-1} * f_t
    o_t = sigmoid(W_o x_t + R_o h_{t-1} + p_o * c_t + b_o)
    h_t = tanh(c_t) * o_t

z_t is the block input, c_t the cell state and h_t the block output (the paper's y_t). The
peephole weights p_i, p_f, p_o are vectors applied elementwise; the output gate peeks at the new c_t.
The paper's g and h activations are tanh and its gate activation is the logistic sigmoid. Written
after Sec. II ("Vanilla LSTM", forward pass) of the paper; the eight `lstm_*` presets of the same
family each change one thing, as in the paper's list of variants.
"""
from engine.dsl import W, b, cell, sigmoid, tanh, v
from engine.gallery import Preset


@cell
def vanilla_lstm(x, h, c):
    z = tanh(W("W_z") @ x + W("R_z") @ h + b("b_z"))
    i = sigmoid(W("W_i") @ x + W("R_i") @ h + v("p_i") * c + b("b_i"))
    f = sigmoid(W("W_f") @ x + W("R_f") @ h + v("p_f") * c + b("b_f"))
    c_next = z * i + c * f
    o = sigmoid(W("W_o") @ x + W("R_o") @ h + v("p_o") * c_next + b("b_o"))
    h_next = tanh(c_next) * o
    return {"h": h_next, "c": c_next}


PRESET = Preset(
    cell=vanilla_lstm,
    family="LSTM",
    title="Vanilla LSTM (Greff et al.)",
    citation="K. Greff, R. K. Srivastava, J. Koutnik, B. R. Steunebrink, J. Schmidhuber. LSTM: A Search Space "
             "Odyssey. IEEE Transactions on Neural Networks and Learning Systems 28(10):2222-2232, 2017 "
             "(online 2016). Sec. II (vanilla LSTM).",
    cudnn=None,
)
