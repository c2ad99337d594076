r"""Independently recurrent neural network, IndRNN (Li, Li, Cook, Zhu & Gao, 2018).

    h_t = relu(W x_t + u * h_{t-1} + b)

The recurrent weight u is a vector, applied elementwise (the Hadamard product of the paper): each
hidden unit only sees its own past, so there is no recurrent matmul at all. The paper constrains
|u| to keep gradients bounded over long sequences; that is a training choice, not part of the cell.
"""
from engine.dsl import W, b, cell, relu, v
from engine.gallery import Preset


@cell
def indrnn(x, h):
    h_next = relu(W("W") @ x + v("u") * h + b("b"))
    return {"h": h_next}


PRESET = Preset(
    cell=indrnn,
    family="RNN",
    title="IndRNN",
    citation="S. Li, W. Li, C. Cook, C. Zhu, Y. Gao. Independently Recurrent Neural Network (IndRNN): "
             "Building a Longer and Deeper RNN. CVPR 2018, Sec. 3.",
    cudnn=None,
)
