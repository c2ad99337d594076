r"""LSTM with multiplicative integration (Wu, Zhang, Zhang, Bengio & Salakhutdinov, 2016, "On Multiplicative
Integration with Recurrent Neural Networks", Sec. 3 and Appendix): each pre-activation joins the input and the
recurrent projection with a Hadamard product besides the usual sum, each term with its own gating vector.

    pre_k = alpha_k * (W_k x_t) * (U_k h_{t-1}) + beta1_k * (U_k h_{t-1}) + beta2_k * (W_k x_t) + b_k,
            k in {i, f, o, g}
    i, f, o = sigmoid(pre_i), sigmoid(pre_f), sigmoid(pre_o);  g = tanh(pre_g)
    c_t = f * c_{t-1} + i * g
    h_t = o * tanh(c_t)
"""
from engine.dsl import W, b, cell, sigmoid, tanh, v
from engine.gallery import Preset


def integrated(x, h, k):
    """The multiplicative-integration pre-activation of gate k."""
    wx, uh = W(f"W_{k}") @ x, W(f"U_{k}") @ h
    return v(f"alpha_{k}") * wx * uh + v(f"beta1_{k}") * uh + v(f"beta2_{k}") * wx + b(f"b_{k}")


@cell
def mi_lstm(x, h, c):
    i = sigmoid(integrated(x, h, "i"))
    f = sigmoid(integrated(x, h, "f"))
    o = sigmoid(integrated(x, h, "o"))
    g = tanh(integrated(x, h, "g"))
    c_next = f * c + i * g
    h_next = o * tanh(c_next)
    return {"h": h_next, "c": c_next}


PRESET = Preset(
    cell=mi_lstm,
    family="LSTM",
    title="LSTM with multiplicative integration (MI-LSTM)",
    citation="Y. Wu, S. Zhang, Y. Zhang, Y. Bengio, R. Salakhutdinov. On Multiplicative Integration with Recurrent "
             "Neural Networks. NeurIPS 2016, Sec. 3 and Appendix A (MI-LSTM).",
    cudnn=None,
)
