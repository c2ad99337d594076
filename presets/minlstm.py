r"""minLSTM (Feng, Tung, Ahmed, Bengio & Hajimirsadeghi, 2024, "Were RNNs All We Needed?", Sec. 3.2, Algorithm 4):
an LSTM whose gates read only the input, with the forget and input gates normalised to sum to one and no output
gate, so that its state update is affine in the state.

    f_t       = sigmoid(W_f x_t + b_f)
    i_t       = sigmoid(W_i x_t + b_i)
    h_tilde_t = W_h x_t + b_h
    f'_t, i'_t = f_t / (f_t + i_t), i_t / (f_t + i_t)
    h_t       = f'_t * h_{t-1} + i'_t * h_tilde_t

Sequential form as the paper's Algorithm 4 writes it (its log-space parallel form adds g to h_tilde, as minGRU's).
"""
from engine.dsl import W, b, cell, sigmoid
from engine.gallery import Preset


@cell
def minlstm(x, h):
    f = sigmoid(W("W_f") @ x + b("b_f"))
    i = sigmoid(W("W_i") @ x + b("b_i"))
    h_tilde = W("W_h") @ x + b("b_h")
    total = f + i
    h_next = f / total * h + i / total * h_tilde
    return {"h": h_next}


PRESET = Preset(
    cell=minlstm,
    family="min-RNN",
    title="minLSTM",
    citation="L. Feng, F. Tung, M. O. Ahmed, Y. Bengio, H. Hajimirsadeghi. Were RNNs All We Needed? "
             "arXiv:2410.01201, 2024, Sec. 3.2 (Algorithm 4, sequential mode).",
    cudnn=None,
)
