r"""LSTM with a recurrent projection, LSTMP (Sak, Senior & Beaufays, 2014; torch.nn.LSTM's proj_size).

    i_t = sigmoid(W_ii x_t + b_ii + W_hi h_{t-1} + b_hi)
    f_t = sigmoid(W_if x_t + b_if + W_hf h_{t-1} + b_hf)
    g_t = tanh(W_ig x_t + b_ig + W_hg h_{t-1} + b_hg)
    o_t = sigmoid(W_io x_t + b_io + W_ho h_{t-1} + b_ho)
    c_t = f_t * c_{t-1} + i_t * g_t                  (size H)
    h_t = W_hr (o_t * tanh(c_t))                     (size P: W_hr is P x H)

The recurrent state and the output have the projection size P (Network(..., proj_size=P); P = H when left out), so
the four gates read h through H x P weights and the next layer reads a P-wide input: fewer recurrent weights for a
wide cell. The same function as cuDNN's projected LSTM (torch.nn.LSTM(proj_size=P)): the reference matches it to
1e-10 in float64 and the fused backend to fp32 rounding on the GPU (tests/gpu/test_projection_gpu.py). The
wavefront schedules and the export tile hidden units only and do not take P yet: `backend="auto"` runs it on the
fused backend.
"""
from engine.dsl import W, b, cell, sigmoid, tanh
from engine.gallery import Preset


@cell(state_dims={"h": "P"})
def lstm_proj(x, h, c):
    i = sigmoid(W("W_ii") @ x + b("b_ii") + W("W_hi") @ h + b("b_hi"))
    f = sigmoid(W("W_if") @ x + b("b_if") + W("W_hf") @ h + b("b_hf"))
    g = tanh(W("W_ig") @ x + b("b_ig") + W("W_hg") @ h + b("b_hg"))
    o = sigmoid(W("W_io") @ x + b("b_io") + W("W_ho") @ h + b("b_ho"))
    c_next = f * c + i * g
    h_next = W("W_hr", rows="P") @ (o * tanh(c_next))
    return {"h": h_next, "c": c_next}


PRESET = Preset(
    cell=lstm_proj,
    family="LSTM",
    title="LSTM with recurrent projection (LSTMP, torch.nn.LSTM proj_size)",
    citation="H. Sak, A. Senior, F. Beaufays. Long Short-Term Memory Recurrent Neural Network Architectures for "
             "Large Scale Acoustic Modeling. Interspeech 2014.",
    cudnn=None,
    notes="cuDNN computes it as torch.nn.LSTM(proj_size=P); the benchmark harness does not time that mode yet. "
          "Runs on the reference and the fused backend; the wavefront schedules and the export do not take P yet.",
)
