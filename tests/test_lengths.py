"""Variable-length batches (issue #35, item 1) on the NumPy reference: a batch padded at the end with `lengths`
computes what each sequence computes alone, truncated to its own steps (outputs, final states and every gradient),
for every preset; the backends that run one length refuse lengths by name; CellRNN takes a PackedSequence as nn.LSTM
does and matches nn.LSTM and nn.GRU with pack_padded_sequence, forward and gradients. CPU, float64."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.errors import BackendError

PRESETS = sorted(engine.presets())


def case(name: str, lengths=(5, 2, 4), layers: int = 2, seed: int = 0):
    cell = engine.preset(name).cell
    network = engine.Network(cell, 3, 4, layers, proj_size=2 if cell.uses_projection else None)
    params = engine.init_params(network, seed=seed)
    rng = np.random.default_rng(seed + 1)
    T, B = max(lengths), len(lengths)
    x = rng.standard_normal((T, B, 3))
    for b, n in enumerate(lengths):
        x[n:, b] = rng.standard_normal((T - n, 3)) * 10          # padding that must not matter
    initial = {s: rng.uniform(-0.5, 0.5, (layers, B, network.state_size(s))) for s in cell.state_names}
    return network, params, x, initial, list(lengths)


def alone(initial: dict, b: int) -> dict:
    return {s: v[:, b:b + 1] for s, v in initial.items()}


@pytest.mark.parametrize("name", PRESETS)
def test_a_padded_batch_runs_each_sequence_as_it_runs_alone(name):
    network, params, x, initial, lengths = case(name)
    got = engine.run(network, params, x, initial, backend="reference", dtype=np.float64, lengths=lengths)
    for b, n in enumerate(lengths):
        want = engine.run(network, params, x[:n, b:b + 1], alone(initial, b), backend="reference", dtype=np.float64)
        np.testing.assert_allclose(got.outputs[:n, b], want.outputs[:, 0], rtol=1e-12, atol=1e-13)
        assert not got.outputs[n:, b].any()                                  # zero past the end
        for s in network.cell.state_names:
            np.testing.assert_allclose(got.final_states[s][:, b], want.final_states[s][:, 0], rtol=1e-12,
                                       atol=1e-13, err_msg=s)


@pytest.mark.parametrize("name", PRESETS)
def test_the_gradients_of_a_padded_batch_are_the_sum_of_each_sequences_own(name):
    network, params, x, initial, lengths = case(name, seed=3)
    rng = np.random.default_rng(9)
    d_out = rng.standard_normal((x.shape[0], x.shape[1], network.output_size))
    d_final = {s: rng.standard_normal(v.shape) for s, v in initial.items()}
    got = engine.bptt(network, params, x, initial, d_out, d_final, lengths=lengths)
    total = [{k: np.zeros_like(v) for k, v in layer.items()} for layer in got.params]
    for b, n in enumerate(lengths):
        want = engine.bptt(network, params, x[:n, b:b + 1], alone(initial, b), d_out[:n, b:b + 1],
                           {s: v[:, b:b + 1] for s, v in d_final.items()})
        np.testing.assert_allclose(got.x[:n, b], want.x[:, 0], rtol=1e-10, atol=1e-12)
        assert not got.x[n:, b].any()                                        # the padding affects nothing
        for s in network.cell.state_names:
            np.testing.assert_allclose(got.initial_states[s][:, b], want.initial_states[s][:, 0], rtol=1e-10,
                                       atol=1e-12, err_msg=s)
        for layer, grads in enumerate(want.params):
            for k, v in grads.items():
                total[layer][k] += v
    for layer, grads in enumerate(got.params):
        for k, v in grads.items():
            np.testing.assert_allclose(v, total[layer][k], rtol=1e-10, atol=1e-12, err_msg=f"layer {layer} {k}")


@pytest.mark.parametrize("lengths, says", [([5, 2], "must be 3 integers"), ([5, 0, 1], r"must lie in 1 \.\. 5"),
                                           ([6, 1, 1], r"must lie in 1 \.\. 5"), ([1.5, 2, 3], "must be 3 integers"),
                                           ("abc", "must be 3 integers")])
def test_bad_lengths_are_refused_naming_the_argument(lengths, says):
    network, params, x, initial, _ = case("gru", lengths=(5, 2, 4))
    for call in (lambda: engine.run(network, params, x, backend="reference", lengths=lengths),
                 lambda: engine.bptt(network, params, x, lengths=lengths)):
        with pytest.raises(BackendError, match=f"argument 'lengths' {says}"):
            call()


def test_without_a_gpu_auto_runs_the_reference_and_what_runs_one_length_refuses_by_name(monkeypatch):
    """The GPU schedules and the fp32 training step take lengths (tests/test_lengths_kernels.py on the CPU,
    tests/gpu/test_lengths_gpu.py on the GPU); the CuPy interpreter's forward and the scan refuse them by name."""
    from engine import backends, execute
    network, params, x, initial, lengths = case("lstm")
    monkeypatch.setattr(backends, "gpu_status", lambda: (False, "no CUDA device (test)"))
    result = engine.run(network, params, x, backend="auto", dtype=np.float32, lengths=lengths)
    assert result.backend == "reference" and "no CUDA device" in result.info["backend_reason"]
    assert not result.outputs[2:, 1].any() and result.outputs.dtype == np.float32
    monkeypatch.setattr(execute.backends, "select", lambda name: (name, "chosen"))     # as where a GPU is
    with pytest.raises(BackendError, match=r"lengths= runs on 'reference', 'fused', 'graph', 'persistent', not "
                                           r"'naive'; hint"):
        engine.run(network, params, x, backend="naive", lengths=lengths)
    with pytest.raises(BackendError, match=r"schedule 'scan' runs batches of one length.*'reference', 'naive', "
                                           r"'fused'; hint"):
        engine.bptt(engine.Network(engine.preset("mingru").cell, 3, 4, 1), None, x, backend="scan", lengths=lengths)


# ---- CellRNN with a PackedSequence, against nn.LSTM and nn.GRU ----------------------------------------------------

@pytest.mark.parametrize("name, module", [("lstm", "LSTM"), ("gru", "GRU")])
@pytest.mark.parametrize("enforce_sorted", [False, True])
def test_cellrnn_takes_a_packed_sequence_as_torch_does(name, module, enforce_sorted):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -r requirements-test.txt)")
    from engine.torch_layout import from_torch_state_dict
    from engine.torch_module import CellRNN
    rnn_utils = torch.nn.utils.rnn
    torch.manual_seed(0)
    reference = getattr(torch.nn, module)(3, 5, 2).double()
    rnn = CellRNN(engine.preset(name).cell, 3, 5, 2, dtype=torch.float64)
    layout = engine.preset(name).torch
    loaded = from_torch_state_dict(rnn.network, {k: v.detach().numpy() for k, v in reference.state_dict().items()},
                                   layout)
    with torch.no_grad():
        for layer, names in enumerate(rnn.names):
            for p in names:
                getattr(rnn, f"layer{layer}_{p}").copy_(torch.from_numpy(loaded[layer][p]))
    lengths = [6, 4, 6, 2] if enforce_sorted else [4, 6, 2, 6]
    lengths = sorted(lengths, reverse=True) if enforce_sorted else lengths
    padded = torch.randn(6, 4, 3, dtype=torch.float64)
    x_ref, x_ours = padded.clone().requires_grad_(), padded.clone().requires_grad_()
    out_ref, finals_ref = reference(rnn_utils.pack_padded_sequence(x_ref, lengths, enforce_sorted=enforce_sorted))
    out, states = rnn(rnn_utils.pack_padded_sequence(x_ours, lengths, enforce_sorted=enforce_sorted))
    assert isinstance(out, rnn_utils.PackedSequence)
    torch.testing.assert_close(out.data, out_ref.data, rtol=0, atol=1e-12)
    assert torch.equal(out.batch_sizes, out_ref.batch_sizes)
    h_ref = finals_ref[0] if module == "LSTM" else finals_ref
    torch.testing.assert_close(states["h"], h_ref, rtol=0, atol=1e-12)
    if module == "LSTM":
        torch.testing.assert_close(states["c"], finals_ref[1], rtol=0, atol=1e-12)
    weights = torch.randn_like(out.data)
    (out_ref.data * weights).sum().add(h_ref.square().sum()).backward()
    (out.data * weights).sum().add(states["h"].square().sum()).backward()
    torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=0, atol=1e-12)
    grads = from_torch_state_dict(rnn.network, {k: p.grad.numpy() for k, p in reference.named_parameters()}, layout)
    for layer, names in enumerate(rnn.names):
        for p in names:
            np.testing.assert_allclose(getattr(rnn, f"layer{layer}_{p}").grad.numpy(), grads[layer][p], rtol=0,
                                       atol=1e-11, err_msg=f"layer {layer} {p}")


# ---- networks of blocks ----------------------------------------------------------------------------------------

def test_a_net_runs_each_padded_sequence_as_it_runs_alone():
    """A bidirectional LSTM (its backward direction reverses each sequence's own steps), a max pool (windows
    wholly within each sequence) and a GRU: each sequence of the padded batch gets what it gets alone."""
    from engine.nets.data import Layers, Net, Pool
    net = Net(3, (Layers("lstm", 4, 2, direction="bidirectional"), Pool("max", window=2, stride=2),
                  Layers("gru", 5)))
    params = engine.init_net_params(net, seed=4)
    rng = np.random.default_rng(5)
    lengths = [9, 4, 7, 2]
    x = rng.standard_normal((9, 4, 3))
    for b, n in enumerate(lengths):
        x[n:, b] = 100.0                                                    # padding that must not matter
    got = engine.run_net(net, params, x, lengths=lengths)
    assert list(got.lengths) == [4, 2, 3, 1]
    for b, n in enumerate(lengths):
        want = engine.run_net(net, params, x[:n, b:b + 1]).outputs[:, 0]
        assert want.shape[0] == got.lengths[b]
        np.testing.assert_allclose(got.outputs[:len(want), b], want, rtol=1e-12, atol=1e-13)
        assert not got.outputs[len(want):, b].any()


def test_a_net_refuses_lengths_a_pool_cannot_take_or_a_gpu_backend():
    from engine.nets.data import Layers, Net, Pool
    net = Net(3, (Layers("gru", 4), Pool("max", window=3, stride=3), Layers("gru", 4)))
    params = engine.init_net_params(net, seed=0)
    x = np.zeros((6, 2, 3))
    with pytest.raises(BackendError, match=r"sequence 1 has 2 step\(s\) when it reaches pool .* window of 3"):
        engine.run_net(net, params, x, lengths=[6, 2])
    from engine.nets.runner import NetProgram
    with pytest.raises(BackendError, match="net '.*': lengths= runs on 'reference', not 'fused'"):
        NetProgram(net, params, "fused").run(x.astype(np.float32), lengths=[6, 3])
