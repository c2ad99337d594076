r"""LSTM as computed by cuDNN and torch.nn.LSTM.

    i_t = sigmoid(W_ii x_t + b_ii + W_hi h_{t-1} + b_hi)
    f_t = sigmoid(W_if x_t + b_if + W_hf h_{t-1} + b_hf)
    g_t = tanh(W_ig x_t + b_ig + W_hg h_{t-1} + b_hg)
    o_t = sigmoid(W_io x_t + b_io + W_ho h_{t-1} + b_ho)
    c_t = f_t * c_{t-1} + i_t * g_t
    h_t = o_t * tanh(c_t)

Hochreiter & Schmidhuber (1997) with the forget gate of Gers et al. (2000), in the two-bias form
of cuDNN (NVIDIA cuDNN documentation, cudnnRNNMode_t CUDNN_LSTM) and PyTorch (torch.nn.LSTM docs).
"""
from engine.dsl import W, b, cell, sigmoid, tanh
from engine.gallery import Preset, TorchLayout


@cell
def lstm(x, h, c):
    i = sigmoid(W("W_ii") @ x + b("b_ii") + W("W_hi") @ h + b("b_hi"))
    f = sigmoid(W("W_if") @ x + b("b_if") + W("W_hf") @ h + b("b_hf"))
    g = tanh(W("W_ig") @ x + b("b_ig") + W("W_hg") @ h + b("b_hg"))
    o = sigmoid(W("W_io") @ x + b("b_io") + W("W_ho") @ h + b("b_ho"))
    c_next = f * c + i * g
    h_next = o * tanh(c_next)
    return {"h": h_next, "c": c_next}


PRESET = Preset(
    cell=lstm,
    family="LSTM",
    title="LSTM (cuDNN / PyTorch)",
    citation="S. Hochreiter, J. Schmidhuber. Long Short-Term Memory. Neural Computation 9(8), 1997; "
             "F. Gers, J. Schmidhuber, F. Cummins. Learning to Forget. Neural Computation 12(10), 2000.",
    cudnn="lstm",
    torch=TorchLayout(
        module="LSTM",
        weight_ih=("W_ii", "W_if", "W_ig", "W_io"),
        weight_hh=("W_hi", "W_hf", "W_hg", "W_ho"),
        bias_ih=("b_ii", "b_if", "b_ig", "b_io"),
        bias_hh=("b_hi", "b_hf", "b_hg", "b_ho"),
        state_map=(("h", "h"), ("c", "c")),
    ),
)
