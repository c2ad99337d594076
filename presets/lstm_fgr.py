r"""Greff et al.'s variant FGR (Full Gate Recurrence): every gate also sees all gates of step t-1.

    z_t = tanh(W_z x_t + R_z h_{t-1} + b_z)
    i_t = sigmoid(W_i x_t + R_i h_{t-1} + p_i * c_{t-1} + b_i + R_ii i_{t-1} + R_fi f_{t-1} + R_oi o_{t-1})
    f_t = sigmoid(W_f x_t + R_f h_{t-1} + p_f * c_{t-1} + b_f + R_if i_{t-1} + R_ff f_{t-1} + R_of o_{t-1})
    c_t = z_t * i_t + c_{t-1} * f_t
    o_t = sigmoid(W_o x_t + R_o h_{t-1} + p_o * c_t + b_o + R_io i_{t-1} + R_fo f_{t-1} + R_oo o_{t-1})
    h_t = tanh(c_t) * o_t

The vanilla LSTM plus nine recurrent matrices between the gates, as in the original formulation of
the LSTM with forget gate (Gers et al. 2000). R_ab carries gate a at t-1 into gate b at t, the
paper's naming. Because the gates of step t-1 are needed at step t, the cell has five states:
h and c as usual, and i, f, o, whose next values are the current gate activations (the paper's
i^{t-1}, f^{t-1}, o^{t-1}). They start at zero unless initial states are given.
"""
from engine.dsl import W, b, cell, sigmoid, tanh, v
from engine.gallery import Preset


@cell
def lstm_fgr(x, h, c, i, f, o):
    i_prev, f_prev, o_prev = i, f, o
    z = tanh(W("W_z") @ x + W("R_z") @ h + b("b_z"))
    i = sigmoid(W("W_i") @ x + W("R_i") @ h + v("p_i") * c + b("b_i")
                + W("R_ii") @ i_prev + W("R_fi") @ f_prev + W("R_oi") @ o_prev)
    f = sigmoid(W("W_f") @ x + W("R_f") @ h + v("p_f") * c + b("b_f")
                + W("R_if") @ i_prev + W("R_ff") @ f_prev + W("R_of") @ o_prev)
    c_next = z * i + c * f
    o = sigmoid(W("W_o") @ x + W("R_o") @ h + v("p_o") * c_next + b("b_o")
                + W("R_io") @ i_prev + W("R_fo") @ f_prev + W("R_oo") @ o_prev)
    h_next = tanh(c_next) * o
    return {"h": h_next, "c": c_next, "i": i, "f": f, "o": o}


PRESET = Preset(
    cell=lstm_fgr,
    family="LSTM",
    title="LSTM variant FGR: full gate recurrence",
    citation="K. Greff, R. K. Srivastava, J. Koutnik, B. R. Steunebrink, J. Schmidhuber. LSTM: A Search Space "
             "Odyssey. IEEE Transactions on Neural Networks and Learning Systems 28(10):2222-2232, 2017 "
             "(online 2016). Variant FGR (full gate recurrence).",
    cudnn=None,
    notes="Gate activations of step t-1 are the extra states i, f, o.",
)
