r"""Elman network (simple recurrent network) with relu, as computed by torch.nn.RNN and cuDNN.

    h_t = relu(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)

Elman (1990) feeds the hidden layer's previous activation back as "context units"; this is that
recurrence in the two-bias form of cuDNN (cudnnRNNMode_t CUDNN_RNN_RELU) and PyTorch
(torch.nn.RNN with nonlinearity='relu'). Elman's hidden units were logistic; relu is the
activation of this preset.
"""
from engine.dsl import W, b, cell, relu
from engine.gallery import Preset, TorchLayout


@cell
def elman_relu(x, h):
    h_next = relu(W("W_ih") @ x + b("b_ih") + W("W_hh") @ h + b("b_hh"))
    return {"h": h_next}


PRESET = Preset(
    cell=elman_relu,
    family="RNN",
    title="Elman RNN (relu)",
    citation="J. L. Elman. Finding Structure in Time. Cognitive Science 14(2):179-211, 1990; form of cuDNN's "
             "CUDNN_RNN_RELU and torch.nn.RNN(nonlinearity='relu').",
    cudnn="rnn_relu",
    torch=TorchLayout(
        module="RNN",
        weight_ih=("W_ih",),
        weight_hh=("W_hh",),
        bias_ih=("b_ih",),
        bias_hh=("b_hh",),
        nonlinearity="relu",
    ),
)
