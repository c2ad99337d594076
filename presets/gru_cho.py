r"""GRU as written by Cho et al. (2014): the reset gate acts before the recurrent matmul.

    r_t = sigmoid(W_r x_t + U_r h_{t-1} + b_r)
    z_t = sigmoid(W_z x_t + U_z h_{t-1} + b_z)
    n_t = tanh(W_n x_t + b_n + U_n (r_t * h_{t-1}))
    h_t = z_t * h_{t-1} + (1 - z_t) * n_t

This is the paper's convention (Sec. 2.3, "Hidden Unit that Adaptively Remembers and Forgets"):
z_t close to 1 keeps the previous state, and r_t multiplies h_{t-1} before U_n. The paper leaves out
biases; one bias per gate is added here. cuDNN and torch.nn.GRU compute a different function (see
the `gru` preset): they apply r_t after U_n h_{t-1}, so U_n h_{t-1} can share one GEMM with the
other gates. Here U_n (r_t * h_{t-1}) needs its own matmul after r_t is known.
"""
from engine.dsl import W, b, cell, sigmoid, tanh
from engine.gallery import Preset


@cell
def gru_cho(x, h):
    r = sigmoid(W("W_r") @ x + W("U_r") @ h + b("b_r"))
    z = sigmoid(W("W_z") @ x + W("U_z") @ h + b("b_z"))
    n = tanh(W("W_n") @ x + b("b_n") + W("U_n") @ (r * h))
    h_next = z * h + (1 - z) * n
    return {"h": h_next}


PRESET = Preset(
    cell=gru_cho,
    family="GRU",
    title="GRU, original form (Cho et al. 2014)",
    citation="K. Cho, B. van Merrienboer, C. Gulcehre, D. Bahdanau, F. Bougares, H. Schwenk, Y. Bengio. "
             "Learning Phrase Representations using RNN Encoder-Decoder for Statistical Machine Translation. "
             "EMNLP 2014, Sec. 2.3.",
    cudnn=None,
    notes="Reset before the recurrent matmul; not cuDNN's CUDNN_GRU (that is the 'gru' preset).",
)
