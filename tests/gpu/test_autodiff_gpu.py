"""Gradients on the GPU (issue #13): bptt(backend="naive"), the backward graph interpreted through CuPy, against the
NumPy reference's bptt for every preset; CellRNN on CUDA tensors (DLPack, torch's stream) against the engine's own
gradients, and against cuDNN's backward (torch.nn.LSTM / GRU on the GPU, fp32, TF32 off) with the same weights."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.autodiff import bptt

pytestmark = pytest.mark.gpu

PRESETS = sorted(n for n, p in engine.presets().items() if not p.cell.uses_projection)


def relative(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def case(cell, seed, layers=2, I=5, H=6, T=7, B=3):
    H = cell.fit_size(H)                     # a multiple of a cell's heads (slstm: 8)
    network = engine.Network(cell, I, H, layers)
    rng = np.random.default_rng(seed)
    return (network, engine.init_params(network, seed=seed), rng.standard_normal((T, B, I)),
            {s: rng.uniform(-0.8, 0.8, (layers, B, H)) for s in cell.state_names},
            rng.standard_normal((T, B, H)), {s: rng.standard_normal((layers, B, H)) for s in cell.state_names})


@pytest.mark.parametrize("name", PRESETS)
def test_naive_gpu_bptt_equals_the_reference(cupy, name):
    network, params, x, initial, d_out, d_final = case(engine.preset(name).cell, seed=len(name))
    want = bptt(network, params, x, initial, d_out, d_final)
    got = bptt(network, params, cupy.asarray(x), {s: cupy.asarray(v) for s, v in initial.items()},
               cupy.asarray(d_out), {s: cupy.asarray(v) for s, v in d_final.items()}, backend="naive")
    assert isinstance(got.x, cupy.ndarray)
    assert relative(got.outputs.get(), want.outputs) < 1e-12
    assert relative(got.x.get(), want.x) < 1e-10
    for s in network.cell.state_names:
        assert relative(got.initial_states[s].get(), want.initial_states[s]) < 1e-10, s
    for layer in range(network.num_layers):
        for p, value in want.params[layer].items():
            assert relative(got.params[layer][p].get(), value) < 1e-10, (layer, p)


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


@pytest.mark.parametrize("name", ["lstm", "gru", "gru_cho", "mgu", "peephole_lstm"])
def test_cell_rnn_on_cuda_tensors_equals_the_engines_gradients(cupy, torch, name):
    from engine.torch_module import CellRNN
    cell = engine.preset(name).cell
    rnn = CellRNN(cell, 5, 6, 2, seed=4, dtype=torch.float64).cuda()
    rng = np.random.default_rng(5)
    x = torch.from_numpy(rng.standard_normal((7, 3, 5))).cuda().requires_grad_()
    d_out = rng.standard_normal((7, 3, 6))
    out, states = rnn(x)
    assert out.is_cuda and all(v.is_cuda for v in states.values())
    (out * torch.from_numpy(d_out).cuda()).sum().backward()
    assert x.grad.is_cuda
    want = engine.bptt(rnn.network, rnn.engine_params(), x.detach().cpu().numpy(), d_outputs=d_out)
    assert relative(out.detach().cpu().numpy(), want.outputs) < 1e-12
    assert relative(x.grad.cpu().numpy(), want.x) < 1e-10
    for layer, tensors in enumerate(rnn.layer_parameters()):
        for p, tensor in zip(rnn.names[layer], tensors):
            assert relative(tensor.grad.cpu().numpy(), want.params[layer][p]) < 1e-10, (layer, p)


@pytest.mark.parametrize("module,name", [("LSTM", "lstm"), ("GRU", "gru")])
def test_cell_rnn_float32_matches_cudnn_backward(cupy, torch, module, name):
    """fp32 on both sides, TF32 off: cuDNN's backward and the engine's agree to fp32 rounding."""
    from engine.torch_layout import from_torch_state_dict
    from engine.torch_module import CellRNN
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    reference = getattr(torch.nn, module)(16, 32, 2).cuda()
    rnn = CellRNN(engine.preset(name).cell, 16, 32, 2).cuda()
    state_dict = {k: v.detach().cpu().numpy() for k, v in reference.state_dict().items()}
    loaded = from_torch_state_dict(rnn.network, state_dict, engine.preset(name).torch)
    with torch.no_grad():
        for layer, names in enumerate(rnn.names):
            for p in names:
                getattr(rnn, f"layer{layer}_{p}").copy_(torch.from_numpy(loaded[layer][p]))
    x = torch.randn(20, 8, 16, device="cuda")
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, _ = reference(x1)
    out, _ = rnn(x2)
    weights = torch.randn_like(out)
    (out_ref * weights).sum().backward()
    (out * weights).sum().backward()
    assert relative(out.detach().cpu(), out_ref.detach().cpu()) < 1e-5
    assert relative(x2.grad.cpu(), x1.grad.cpu()) < 1e-4
    theirs = {k: v.grad.detach().cpu().numpy() for k, v in reference.named_parameters()}
    mine = from_torch_state_dict(rnn.network, theirs, engine.preset(name).torch)   # torch's grads in our layout
    for layer, tensors in enumerate(rnn.layer_parameters()):
        for p, tensor in zip(rnn.names[layer], tensors):
            assert relative(tensor.grad.cpu().numpy(), mine[layer][p]) < 1e-4, (layer, p)


@pytest.mark.parametrize("name", ["lstm", "gru", "slstm"])
def test_naive_gpu_bptt_with_lengths_equals_the_reference(cupy, name):
    """A batch padded at the end (lengths=): the CuPy interpreter freezes the states and passes the adjoints
    through the padding as the NumPy reference does."""
    network, params, x, initial, d_out, d_final = case(engine.preset(name).cell, seed=11)
    lengths = [7, 3, 5]
    want = bptt(network, params, x, initial, d_out, d_final, lengths=lengths)
    got = bptt(network, params, cupy.asarray(x), {s: cupy.asarray(v) for s, v in initial.items()},
               cupy.asarray(d_out), {s: cupy.asarray(v) for s, v in d_final.items()}, backend="naive",
               lengths=lengths)
    assert relative(got.outputs.get(), want.outputs) < 1e-12 and not got.outputs[3:, 1].any()
    assert relative(got.x.get(), want.x) < 1e-10
    for s in network.cell.state_names:
        assert relative(got.final_states[s].get(), want.final_states[s]) < 1e-12, s
        assert relative(got.initial_states[s].get(), want.initial_states[s]) < 1e-10, s
    for layer, grads in enumerate(want.params):
        for k, v in grads.items():
            assert relative(got.params[layer][k].get(), v) < 1e-10, (layer, k)
