r"""GRU as computed by cuDNN and torch.nn.GRU: the reset gate is applied after the recurrent matmul.

    r_t = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)
    z_t = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)
    n_t = tanh(W_in x_t + b_in + r_t * (W_hn h_{t-1} + b_hn))
    h_t = (1 - z_t) * n_t + z_t * h_{t-1}

Cho et al. (2014) in the form of cuDNN (cudnnRNNMode_t CUDNN_GRU) and PyTorch (torch.nn.GRU docs),
which moves r_t outside U h so that all three recurrent matmuls read h_{t-1} and share one GEMM.
"""
from engine.dsl import W, b, cell, sigmoid, tanh
from engine.gallery import Preset, TorchLayout


@cell
def gru(x, h):
    r = sigmoid(W("W_ir") @ x + b("b_ir") + W("W_hr") @ h + b("b_hr"))
    z = sigmoid(W("W_iz") @ x + b("b_iz") + W("W_hz") @ h + b("b_hz"))
    n = tanh(W("W_in") @ x + b("b_in") + r * (W("W_hn") @ h + b("b_hn")))
    h_next = (1 - z) * n + z * h
    return {"h": h_next}


PRESET = Preset(
    cell=gru,
    family="GRU",
    title="GRU (cuDNN / PyTorch)",
    citation="K. Cho et al. Learning Phrase Representations using RNN Encoder-Decoder for Statistical "
             "Machine Translation. EMNLP 2014; form of cuDNN's CUDNN_GRU and torch.nn.GRU.",
    cudnn="gru",
    torch=TorchLayout(
        module="GRU",
        weight_ih=("W_ir", "W_iz", "W_in"),
        weight_hh=("W_hr", "W_hz", "W_hn"),
        bias_ih=("b_ir", "b_iz", "b_in"),
        bias_hh=("b_hr", "b_hz", "b_hn"),
    ),
)
