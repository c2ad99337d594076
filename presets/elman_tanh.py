r"""Elman network (simple recurrent network) with tanh, as computed by torch.nn.RNN and cuDNN.

    h_t = tanh(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)

Elman (1990) feeds the hidden layer's previous activation back as "context units"; this is that
recurrence in the two-bias form of cuDNN (cudnnRNNMode_t CUDNN_RNN_TANH) and PyTorch
(torch.nn.RNN with nonlinearity='tanh'). Elman's hidden units were logistic; tanh is the
activation of this preset.
"""
from engine.dsl import W, b, cell, tanh
from engine.gallery import Preset, TorchLayout


@cell
def elman_tanh(x, h):
    h_next = tanh(W("W_ih") @ x + b("b_ih") + W("W_hh") @ h + b("b_hh"))
    return {"h": h_next}


PRESET = Preset(
    cell=elman_tanh,
    family="RNN",
    title="Elman RNN (tanh)",
    citation="J. L. Elman. Finding Structure in Time. Cognitive Science 14(2):179-211, 1990; form of cuDNN's "
             "CUDNN_RNN_TANH and torch.nn.RNN(nonlinearity='tanh').",
    cudnn="rnn_tanh",
    torch=TorchLayout(
        module="RNN",
        weight_ih=("W_ih",),
        weight_hh=("W_hh",),
        bias_ih=("b_ih",),
        bias_hh=("b_hh",),
        nonlinearity="tanh",
    ),
)
