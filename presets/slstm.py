r"""sLSTM, the scalar-memory cell of xLSTM (Beck, Pöppel, Spanring, Auer, Prudnikova, Kopp, Klambauer, Brandstetter
& Hochreiter, 2024, "xLSTM: Extended Long Short-Term Memory", Sec. 2.2, eqs. 8-17), with 4 heads, in the stabilized
form of FlashRNN's sLSTM (Pöppel, Beck & Hochreiter, 2024; flashrnn 1.0.8, flashrnn/vanilla/slstm.py):

    i~, f~, z~, o~ = W_* x_t + R_* h_{t-1} + b_*      (R_* block-diagonal: 4 heads of H/4 x H/4)
    m_t = max(i~, log sigmoid(f~) + m_{t-1})          (the stabilizer; m_t = i~ where n_{t-1} < 1/2, see below)
    i_t = exp(i~ - m_t),  f_t = exp(log sigmoid(f~) + m_{t-1} - m_t)
    c_t = f_t c_{t-1} + i_t tanh(z~)
    n_t = max(f_t n_{t-1} + i_t, 1)                   (the normalizer, kept >= 1 as FlashRNN does)
    h_t = sigmoid(o~) c_t / n_t

The exponential input gate is safe because m_t is subtracted inside every exp. FlashRNN takes m_1 = i~ when every
n is 0 (the zero initial state). The cell takes m_t = i~ per unit where n_{t-1} < 1/2, written as a term that is
about -1e30 there and exactly 0 where n >= 1/2 (n is >= 1 after any step), so the two agree from the zero start and
from any start with n >= 1, gradients included (the term's gradient is 0 on both sides).
"""
from engine.dsl import W, b, cell, const, exp, log_sigmoid, sigmoid, tanh
from engine.dsl import max as maximum
from engine.dsl import min as minimum
from engine.gallery import Preset

HEADS = 4


@cell
def slstm(x, h, c, n, m):
    i_pre = W("W_i") @ x + W("R_i", heads=HEADS) @ h + b("b_i")
    f_pre = W("W_f") @ x + W("R_f", heads=HEADS) @ h + b("b_f")
    z_pre = W("W_z") @ x + W("R_z", heads=HEADS) @ h + b("b_z")
    o_pre = W("W_o") @ x + W("R_o", heads=HEADS) @ h + b("b_o")
    log_f_m = log_sigmoid(f_pre) + m
    start = 1 - 2 * minimum(n, const(0.5))            # 1 at the zero start (n = 0), 0 once n >= 1/2
    m_next = maximum(i_pre, log_f_m - 1e30 * start)
    i = exp(i_pre - m_next)
    f = exp(log_f_m - m_next)
    c_next = f * c + i * tanh(z_pre)
    n_next = maximum(f * n + i, const(1.0))
    h_next = sigmoid(o_pre) * c_next / n_next
    return {"h": h_next, "c": c_next, "n": n_next, "m": m_next}


PRESET = Preset(
    cell=slstm,
    family="xLSTM",
    title="sLSTM (xLSTM, 4 heads)",
    citation="M. Beck, K. Pöppel, M. Spanring, A. Auer, O. Prudnikova, M. Kopp, G. Klambauer, J. Brandstetter, "
             "S. Hochreiter. xLSTM: Extended Long Short-Term Memory. NeurIPS 2024, Sec. 2.2; stabilized as "
             "K. Pöppel, M. Beck, S. Hochreiter. FlashRNN: I/O-Aware Optimization of Traditional RNNs on modern "
             "hardware. arXiv:2412.07752, 2024.",
    cudnn=None,
    test_sizes={"input_size": 5, "hidden_size": 8, "batch": 3, "steps": 6},
)
