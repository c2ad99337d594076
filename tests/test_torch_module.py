"""engine.torch_module.CellRNN on the CPU: any cell as a torch.nn.Module whose autograd runs the engine's backward
pass. Its outputs equal the reference's, its gradients equal engine.bptt's (float64, 1e-12) for every preset the
schedules take, and torch's own nn.GRU with the same weights; an optimizer trains it. The CUDA path (CuPy on the
tensors' memory) is tests/gpu/test_autodiff_gpu.py's."""
from __future__ import annotations

import numpy as np
import pytest

import engine

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -r requirements-test.txt)")
from engine.torch_layout import from_torch_state_dict  # noqa: E402
from engine.torch_module import CellRNN  # noqa: E402

PRESETS = sorted(n for n, p in engine.presets().items() if not p.cell.uses_projection)


def adjoint_loss(out, states, d_out, d_states):
    loss = (out * d_out).sum()
    for name, value in states.items():
        loss = loss + (value * d_states[name]).sum()
    return loss


@pytest.mark.parametrize("name", PRESETS)
def test_outputs_and_gradients_equal_the_engines(name):
    cell = engine.preset(name).cell
    rnn = CellRNN(cell, input_size=3, hidden_size=4, num_layers=2, seed=2, dtype=torch.float64)
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.standard_normal((5, 2, 3))).requires_grad_()
    initial = {s: torch.from_numpy(rng.uniform(-0.8, 0.8, (2, 2, 4))).requires_grad_() for s in cell.state_names}
    d_out = rng.standard_normal((5, 2, 4))
    d_states = {s: rng.standard_normal((2, 2, 4)) for s in cell.state_names}

    out, states = rnn(x, initial)
    adjoint_loss(out, states, torch.from_numpy(d_out), {s: torch.from_numpy(v) for s, v in d_states.items()}).backward()

    params = rnn.engine_params()
    numpy_initial = {s: v.detach().numpy() for s, v in initial.items()}
    want = engine.bptt(rnn.network, params, x.detach().numpy(), numpy_initial, d_out, d_states)
    assert np.allclose(out.detach().numpy(), want.outputs, rtol=0, atol=1e-12)
    for s in cell.state_names:
        assert np.allclose(states[s].detach().numpy(), want.final_states[s], rtol=0, atol=1e-12)
        assert np.allclose(initial[s].grad.numpy(), want.initial_states[s], rtol=0, atol=1e-12), s
    assert np.allclose(x.grad.numpy(), want.x, rtol=0, atol=1e-12)
    for layer, tensors in enumerate(rnn.layer_parameters()):
        for p_name, tensor in zip(rnn.names[layer], tensors):
            assert tensor.grad is not None, f"layer {layer} '{p_name}' got no gradient"
            assert np.allclose(tensor.grad.numpy(), want.params[layer][p_name], rtol=0, atol=1e-12), (layer, p_name)


def test_only_the_gradients_autograd_asks_for_come_back():
    """A loss of the final states alone (the outputs' gradient is None: not materialized as zeros), x as data, a
    frozen parameter: those get no gradient, and every other one equals engine.bptt's with a zero outputs' adjoint."""
    cell = engine.preset("lstm").cell
    rnn = CellRNN(cell, input_size=3, hidden_size=4, num_layers=2, seed=5, dtype=torch.float64)
    frozen = rnn.layer_parameters()[0][0]
    frozen.requires_grad_(False)
    rng = np.random.default_rng(6)
    x = torch.from_numpy(rng.standard_normal((5, 2, 3)))
    d_h = rng.standard_normal((2, 2, 4))
    _, states = rnn(x)
    (states["h"] * torch.from_numpy(d_h)).sum().backward()
    want = engine.bptt(rnn.network, rnn.engine_params(), x.numpy(), d_final_states={"h": d_h})
    assert x.grad is None and frozen.grad is None
    for layer, tensors in enumerate(rnn.layer_parameters()):
        for p_name, tensor in zip(rnn.names[layer], tensors):
            if tensor is frozen:
                continue
            assert np.allclose(tensor.grad.numpy(), want.params[layer][p_name], rtol=0, atol=1e-12), (layer, p_name)


def test_the_gru_matches_torch_nn_gru_with_the_same_weights():
    reference = torch.nn.GRU(3, 5, 2).double()
    rnn = CellRNN(engine.preset("gru").cell, 3, 5, 2, dtype=torch.float64)
    state_dict = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
    loaded = from_torch_state_dict(rnn.network, state_dict, engine.preset("gru").torch)
    with torch.no_grad():
        for layer, names in enumerate(rnn.names):
            for name in names:
                getattr(rnn, f"layer{layer}_{name}").copy_(torch.from_numpy(loaded[layer][name]))
    x = torch.randn(6, 4, 3, dtype=torch.float64)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, _ = reference(x1)
    out, _ = rnn(x2)
    assert torch.allclose(out, out_ref, atol=1e-12)
    out_ref.pow(2).sum().backward()
    out.pow(2).sum().backward()
    assert torch.allclose(x2.grad, x1.grad, atol=1e-12)


def test_an_optimizer_trains_it_in_place_of_nn_lstm():
    """The two-line swap: a training loop written for nn.LSTM, with CellRNN instead."""
    torch.manual_seed(0)
    rnn = CellRNN(engine.preset("lstm").cell, input_size=2, hidden_size=8)       # was: nn.LSTM(2, 8)
    head = torch.nn.Linear(8, 1)
    optimizer = torch.optim.Adam([*rnn.parameters(), *head.parameters()], lr=0.02)
    task = engine.training.get_task("adding")
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(60):
        batch = task.batch(rng, 16, 6)
        out, _ = rnn(torch.from_numpy(batch.x).float())
        loss = torch.nn.functional.mse_loss(head(out[-1]), torch.from_numpy(batch.targets[0]).float())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10]), losses


def test_bad_inputs_are_refused_by_name():
    rnn = CellRNN(engine.preset("gru").cell, 3, 4)
    with pytest.raises(engine.BackendError, match=r"\(T, B, 3\)"):
        rnn(torch.zeros(5, 2, 7))
    with pytest.raises(engine.BackendError, match="float64.*to"):
        rnn(torch.zeros(5, 2, 3, dtype=torch.float64))
    with pytest.raises(engine.BackendError, match="not states"):
        rnn(torch.zeros(5, 2, 3), {"c": torch.zeros(1, 2, 4)})


def test_a_precision_mode_is_checked_and_runs_the_emulation_on_the_cpu():
    """precision= takes the modes by name (short names too), fp32 parameters only; on the CPU the reference emulates
    the mode (its gradients are engine.bptt's with the same precision, in float32)."""
    cell = engine.preset("lstm").cell
    with pytest.raises(engine.BackendError, match="argument 'precision' is 'fp8'"):
        CellRNN(cell, 3, 4, precision="fp8")
    with pytest.raises(engine.BackendError, match="keeps float32 parameters"):
        CellRNN(cell, 3, 4, precision="bf16", dtype=torch.float64)
    rnn = CellRNN(cell, 3, 4, num_layers=2, seed=1, precision="bf16")
    assert rnn.precision == "bfloat16"
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((5, 2, 3)).astype(np.float32)).requires_grad_()
    out, _ = rnn(x)
    out.sum().backward()
    want = engine.bptt(rnn.network, rnn.engine_params(), x.detach().numpy(), d_outputs=np.ones((5, 2, 4)),
                       dtype=np.float32, precision="bfloat16")
    assert np.allclose(x.grad.numpy(), want.x, rtol=0, atol=1e-6)
    strict = engine.bptt(rnn.network, rnn.engine_params(), x.detach().numpy(), d_outputs=np.ones((5, 2, 4)),
                         dtype=np.float32)
    assert not np.allclose(x.grad.numpy(), strict.x, rtol=0, atol=1e-6)      # the mode rounded something
    with pytest.raises(engine.BackendError, match="runs float32 tensors"):
        rnn.double()(x.detach().double())
