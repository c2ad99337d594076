r"""minGRU (Feng, Tung, Ahmed, Bengio & Hajimirsadeghi, 2024, "Were RNNs All We Needed?", Sec. 3.1, Algorithm 2):
a GRU whose gate and candidate read only the input, so that its state update is affine in the state.

    z_t       = sigmoid(W_z x_t + b_z)
    h_tilde_t = W_h x_t + b_h
    h_t       = (1 - z_t) * h_{t-1} + z_t * h_tilde_t

The paper's Linear layers carry biases (PyTorch's default). Its log-space parallel form additionally passes
h_tilde through g(x) = x + 1/2 for x >= 0, sigmoid(x) otherwise, to keep it positive for the logarithm; the
sequential form here, as the paper's Algorithm 2 writes it, has no g. Since h_t = a_t h_{t-1} + b_t with a_t and
b_t computed from x_t alone, the whole sequence is one associative scan over time.
"""
from engine.dsl import W, b, cell, sigmoid
from engine.gallery import Preset


@cell
def mingru(x, h):
    z = sigmoid(W("W_z") @ x + b("b_z"))
    h_tilde = W("W_h") @ x + b("b_h")
    h_next = (1 - z) * h + z * h_tilde
    return {"h": h_next}


PRESET = Preset(
    cell=mingru,
    family="min-RNN",
    title="minGRU",
    citation="L. Feng, F. Tung, M. O. Ahmed, Y. Bengio, H. Hajimirsadeghi. Were RNNs All We Needed? "
             "arXiv:2410.01201, 2024, Sec. 3.1 (Algorithm 2, sequential mode).",
    cudnn=None,
)
