r"""LSTM with forget gate and peephole connections (Gers & Schmidhuber, 2000).

    i_t = sigmoid(W_ii x_t + W_hi h_{t-1} + p_i * c_{t-1} + b_i)
    f_t = sigmoid(W_if x_t + W_hf h_{t-1} + p_f * c_{t-1} + b_f)
    g_t = tanh(W_ig x_t + W_hg h_{t-1} + b_g)
    c_t = f_t * c_{t-1} + i_t * g_t
    o_t = sigmoid(W_io x_t + W_ho h_{t-1} + p_o * c_t + b_o)
    h_t = o_t * tanh(c_t)

Peepholes let the gates see the cell state: p_i, p_f and p_o are vectors (diagonal weights), applied
elementwise. The input and forget gates look at c_{t-1}; the output gate looks at the new c_t, so
it is computed after the cell update. Gate and cell-output squashing are sigmoid/tanh.
"""
from engine.dsl import W, b, cell, sigmoid, tanh, v
from engine.gallery import Preset


@cell
def peephole_lstm(x, h, c):
    i = sigmoid(W("W_ii") @ x + W("W_hi") @ h + v("p_i") * c + b("b_i"))
    f = sigmoid(W("W_if") @ x + W("W_hf") @ h + v("p_f") * c + b("b_f"))
    g = tanh(W("W_ig") @ x + W("W_hg") @ h + b("b_g"))
    c_next = f * c + i * g
    o = sigmoid(W("W_io") @ x + W("W_ho") @ h + v("p_o") * c_next + b("b_o"))
    h_next = o * tanh(c_next)
    return {"h": h_next, "c": c_next}


PRESET = Preset(
    cell=peephole_lstm,
    family="LSTM",
    title="Peephole LSTM (Gers & Schmidhuber 2000)",
    citation="F. A. Gers, J. Schmidhuber. Recurrent Nets that Time and Count. Proc. IJCNN 2000, vol. 3, "
             "pp. 189-194.",
    cudnn=None,
)
