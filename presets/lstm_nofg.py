r"""The original LSTM without a forget gate (Hochreiter & Schmidhuber, 1997).

    i_t = sigmoid(W_ii x_t + W_hi h_{t-1} + b_i)
    g_t = tanh(W_ig x_t + W_hg h_{t-1} + b_g)
    o_t = sigmoid(W_io x_t + W_ho h_{t-1} + b_o)
    c_t = c_{t-1} + i_t * g_t
    h_t = o_t * tanh(c_t)

The cell state is a constant error carousel: it is never decayed, only added to, which is why it
can grow without bound on long sequences (the problem the forget gate of Gers et al. 2000 solves).
The 1997 paper squashes the cell input with a sigmoid scaled to [-2, 2] and the cell output with one
scaled to [-1, 1]; as is usual today these are replaced by tanh, and the gates use the logistic
sigmoid. One bias per gate, as in the paper.
"""
from engine.dsl import W, b, cell, sigmoid, tanh
from engine.gallery import Preset


@cell
def lstm_nofg(x, h, c):
    i = sigmoid(W("W_ii") @ x + W("W_hi") @ h + b("b_i"))
    g = tanh(W("W_ig") @ x + W("W_hg") @ h + b("b_g"))
    o = sigmoid(W("W_io") @ x + W("W_ho") @ h + b("b_o"))
    c_next = c + i * g
    h_next = o * tanh(c_next)
    return {"h": h_next, "c": c_next}


PRESET = Preset(
    cell=lstm_nofg,
    family="LSTM",
    title="Original LSTM, no forget gate (1997)",
    citation="S. Hochreiter, J. Schmidhuber. Long Short-Term Memory. Neural Computation 9(8):1735-1780, 1997.",
    cudnn=None,
    notes="No forget gate: c_t accumulates. Squashing functions are sigmoid/tanh instead of the paper's "
          "scaled sigmoids.",
)
