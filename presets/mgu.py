r"""Minimal gated unit (Zhou, Wu, Zhang & Zhou, 2016): a GRU with one gate.

    f_t       = sigmoid(W_f x_t + U_f h_{t-1} + b_f)
    h_tilde_t = tanh(W_h x_t + U_h (f_t * h_{t-1}) + b_h)
    h_t       = (1 - f_t) * h_{t-1} + f_t * h_tilde_t

The single forget gate f_t plays both GRU roles: it resets h_{t-1} before the candidate's recurrent
matmul (as the GRU's reset gate) and mixes old and new state (as the GRU's update gate, with the
convention that f_t close to 1 takes the candidate). The paper writes W_f [h_{t-1}, x_t]; here the
concatenated weight is split into U_f (on h) and W_f (on x).
"""
from engine.dsl import W, b, cell, sigmoid, tanh
from engine.gallery import Preset


@cell
def mgu(x, h):
    f = sigmoid(W("W_f") @ x + W("U_f") @ h + b("b_f"))
    h_tilde = tanh(W("W_h") @ x + W("U_h") @ (f * h) + b("b_h"))
    h_next = (1 - f) * h + f * h_tilde
    return {"h": h_next}


PRESET = Preset(
    cell=mgu,
    family="GRU",
    title="Minimal gated unit (MGU)",
    citation="G.-B. Zhou, J. Wu, C.-L. Zhang, Z.-H. Zhou. Minimal Gated Unit for Recurrent Neural Networks. "
             "International Journal of Automation and Computing 13(3):226-234, 2016.",
    cudnn=None,
)
