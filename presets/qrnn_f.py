r"""QRNN with fo-pooling (Bradbury, Merity, Xiong & Socher, 2017, "Quasi-Recurrent Neural Networks", Sec. 2), its
input side a plain projection (a convolution of width 1):

    z_t = tanh(W_z x_t + b_z)
    f_t = sigmoid(W_f x_t + b_f)
    o_t = sigmoid(W_o x_t + b_o)
    c_t = f_t * c_{t-1} + (1 - f_t) * z_t
    h_t = o_t * c_t

Nothing reads h_{t-1}: the recurrence is the pooling of c, affine in c, and the rest is computed per step. The
paper's convolutions of width k > 1 read k inputs back; they are not a cell of one step.
"""
from engine.dsl import W, b, cell, sigmoid, tanh
from engine.gallery import Preset


@cell
def qrnn_f(x, h, c):
    z = tanh(W("W_z") @ x + b("b_z"))
    f = sigmoid(W("W_f") @ x + b("b_f"))
    o = sigmoid(W("W_o") @ x + b("b_o"))
    c_next = f * c + (1 - f) * z
    h_next = o * c_next
    return {"h": h_next, "c": c_next}


PRESET = Preset(
    cell=qrnn_f,
    family="min-RNN",
    title="QRNN, fo-pooling",
    citation="J. Bradbury, S. Merity, C. Xiong, R. Socher. Quasi-Recurrent Neural Networks. ICLR 2017, Sec. 2 "
             "(fo-pooling, eq. 4; convolution width 1).",
    cudnn=None,
)
