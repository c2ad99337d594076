"""Schedule 'scan' on the GPU (engine/schedules/scan.py, kernels/scan.cu) against the float64 reference: every cell
that qualifies, odd sizes (T below, at and past one chunk, chains not a multiple of a block), float32 and float64,
poisoned outputs; the float32 error at T = 4096 against what the step-by-step float32 run has; and the autotuner
timing it beside the sequential schedules."""
from __future__ import annotations

import numpy as np
import pytest
from test_scan import CASES, diagonal_linear

import engine
from engine.schedules import scan, scan_kernel

pytestmark = pytest.mark.gpu


def relative(got, want) -> float:
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def case(graph, I=5, H=37, L=2, T=130, B=3, seed=0):
    network = engine.Network(graph, I, H, L)
    params = engine.init_params(network, seed=seed)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((T, B, I))
    initial = {s: rng.uniform(-0.8, 0.8, (L, B, H)) for s in graph.state_names}
    return network, params, x, initial


@pytest.mark.parametrize("walk", [False, True], ids=["passes", "walk"])
@pytest.mark.parametrize("graph", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("T", [1, 5, scan.CHUNK, 130])
def test_scan_equals_the_reference(cupy, monkeypatch, graph, T, walk):
    """Every qualifying cell, its scan in three passes and walking (scan_walk, through WalkCall where the cell fits
    it); a cell whose coefficients are not formed inside the scan (qrnn_f) takes kernels/scan.cu either way."""
    monkeypatch.setattr(scan, "FORCE_WALK", walk)
    network, params, x, initial = case(graph, T=T)
    want = engine.run(network, params, x, initial, backend="reference", dtype=np.float64)
    got = scan.prepare(network, params).run(x.astype(np.float32), initial, poison=True)
    assert relative(cupy.asnumpy(got.outputs), want.outputs) <= 1e-5
    for s in graph.state_names:
        assert relative(cupy.asnumpy(got.final_states[s]), want.final_states[s]) <= 1e-5, s
    exact = engine.run(network, params, x, initial, backend="scan", dtype=np.float64)
    assert relative(cupy.asnumpy(exact.outputs), want.outputs) <= 1e-12


@pytest.mark.parametrize("walk", [True, False], ids=["walk", "passes"])
@pytest.mark.parametrize("T", [1, 31, 255, 256, 257, 1000])
def test_the_scan_that_forms_its_coefficients_in_either_form(cupy, monkeypatch, T, walk):
    """minGRU forms its coefficients inside the scan's kernels: scan_walk (a block per 32 chains walks the sequence in
    tiles of 16 x 16 steps: T below, at and past one tile and over many) or the three passes (chunks of 64). 5 x 300
    chains (47 blocks of 32, the last partial), two layers, poisoned output, against the float64 reference; reruns
    bit-identical (each form's order of operations is fixed)."""
    monkeypatch.setattr(scan, "FORCE_WALK", walk)
    assert scan_kernel.WALK == (16, 16)
    network, params, x, initial = case(engine.preset("mingru").cell, I=7, H=300, L=2, T=T, B=5, seed=4)
    program = scan.prepare(network, params)
    assert program.plan.inline
    want = engine.run(network, params, x, initial, backend="reference", dtype=np.float64)
    first = program.run(x.astype(np.float32), initial, poison=True)
    assert relative(cupy.asnumpy(first.outputs), want.outputs) <= 1e-5
    assert relative(cupy.asnumpy(first.final_states["h"]), want.final_states["h"]) <= 1e-5
    again = program.run(x.astype(np.float32), initial, poison=True)
    assert bool((again.outputs == first.outputs).all())


def test_the_walk_is_taken_where_the_chains_fill_the_gpu_or_the_sequence_is_short(cupy):
    """scan.walks: one block per 32 chains, taken where they fill WALK_FILL of the SMs (minGRU's 4,096 chains at
    B = 8, H = 512 on a 132-SM H100 or H200: 128 blocks) or the sequence is at most WALK_TILES tiles long; the three
    passes for few chains over a long sequence."""
    sms = cupy.cuda.runtime.deviceGetAttribute(cupy.cuda.runtime.cudaDevAttrMultiProcessorCount, 0)
    tile = scan_kernel.WALK[0] * scan_kernel.WALK[1]
    long = tile * scan.WALK_TILES + 1
    assert scan.FORCE_WALK is None
    assert scan.walks(32 * sms, long, cupy)
    assert scan.walks(32, tile * scan.WALK_TILES, cupy)
    assert not scan.walks(32 * int(sms * scan.WALK_FILL) - 32, long, cupy)


def test_a_long_sequence_stays_within_the_float32_error_of_the_step_by_step_run(cupy):
    """T = 4096: the scan reassociates the recurrence (chunk maps), the step-by-step float32 run does not. Against
    float64, the scan's error is at most twice the step-by-step run's, plus one float32 rounding of the result."""
    network, params, x, initial = case(engine.preset("mingru").cell, I=16, H=64, L=1, T=4096, B=4, seed=3)
    want = engine.run(network, params, x, initial, backend="reference", dtype=np.float64).outputs
    steps = engine.run(network, params, x, initial, backend="reference", dtype=np.float32).outputs
    got = cupy.asnumpy(engine.run(network, params, x.astype(np.float32), initial, backend="scan").outputs)
    step_error, scan_error = relative(steps, want), relative(got, want)
    assert scan_error <= 2 * step_error + 6e-8, (scan_error, step_error)


def test_the_autotuner_times_the_scan_for_a_cell_that_qualifies(cupy, tmp_path, monkeypatch):
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path))
    from engine.schedules import autotune
    network, params, x, _ = case(engine.preset("mingru").cell, L=1, T=256, B=4)
    choice = autotune.tune(network, params, 256, 4, repeats=3)
    assert any(t["candidate"] == "scan" and "ms" in t for t in choice.timings), choice.timings
    result = engine.run(network, params, x.astype(np.float32))
    want = engine.run(network, params, x, backend="reference", dtype=np.float64).outputs
    assert relative(cupy.asnumpy(result.outputs), want) <= 1e-5


def test_a_diagonal_linear_rnn_scans_with_a_parameter_as_its_coefficient(cupy):
    network, params, x, initial = case(diagonal_linear, T=300)
    want = engine.run(network, params, x, initial, backend="reference", dtype=np.float64)
    got = engine.run(network, params, x.astype(np.float32), initial, backend="scan")
    assert relative(cupy.asnumpy(got.outputs), want.outputs) <= 1e-5


@pytest.mark.parametrize("walk", [False, None], ids=["scans", "rule"])
@pytest.mark.parametrize("graph", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("dtype, tolerance", [(np.float64, 1e-10), (np.float32, 2e-5)])
def test_the_gradients_as_scans_on_the_gpu_equal_bptt(cupy, monkeypatch, graph, dtype, tolerance, walk):
    """By the rule (the walks, scan_grad.walk_gradients, for every cell but qrnn_f: 111 chains over one tile) and
    with the walks off (fast_gradients' scans, or the general path for qrnn_f)."""
    from engine.schedules.scan_grad import scan_gradients
    monkeypatch.setattr(scan, "FORCE_WALK", walk)
    network, params, x, initial = case(graph, T=150, L=2)
    rng = np.random.default_rng(9)
    d_out = rng.standard_normal((150, 3, 37))
    want = engine.bptt(network, params, x, initial, d_outputs=d_out)
    got = scan_gradients(network, params, cupy.asarray(x, dtype=dtype), initial, cupy.asarray(d_out, dtype=dtype),
                         dtype=dtype, xp=cupy)
    assert relative(cupy.asnumpy(got.outputs), want.outputs) <= tolerance
    assert relative(cupy.asnumpy(got.x), want.x) <= tolerance
    for s in graph.state_names:
        assert relative(cupy.asnumpy(got.initial_states[s]), want.initial_states[s]) <= tolerance, s
        assert relative(cupy.asnumpy(got.final_states[s]), want.final_states[s]) <= tolerance, s
    for layer in range(2):
        for name, value in want.params[layer].items():
            assert relative(cupy.asnumpy(got.params[layer][name]), value) <= tolerance, (layer, name)


@pytest.mark.parametrize("T", [1, 127, 128, 300])
def test_the_gradients_walk_back_over_tiles_chain_blocks_and_the_final_states_adjoint(cupy, T):
    """scan_walk_back over T within, at and past a tile of 16 x 8 steps, 5 x 300 chains (47 blocks, the last partial),
    two layers, given initial states and an adjoint of the final states: every gradient against the step-by-step
    bptt in float64, in float32 and float64; reruns bit-identical."""
    from engine.schedules.scan_backward_kernel import BACK
    from engine.schedules.scan_grad import scan_gradients
    assert BACK == (16, 8) and scan.FORCE_WALK is None
    network, params, x, initial = case(engine.preset("mingru").cell, I=7, H=300, L=2, T=T, B=5, seed=6)
    rng = np.random.default_rng(7)
    d_out, d_final = rng.standard_normal((T, 5, 300)), {"h": rng.standard_normal((2, 5, 300))}
    want = engine.bptt(network, params, x, initial, d_outputs=d_out, d_final_states=d_final)
    for dtype, tolerance in ((np.float32, 2e-5), (np.float64, 1e-10)):
        def run(dtype=dtype):
            return scan_gradients(network, params, cupy.asarray(x, dtype=dtype), initial,
                                  cupy.asarray(d_out, dtype=dtype), d_final, dtype=dtype, xp=cupy)
        got = run()
        assert relative(cupy.asnumpy(got.outputs), want.outputs) <= tolerance
        assert relative(cupy.asnumpy(got.final_states["h"]), want.final_states["h"]) <= tolerance
        assert relative(cupy.asnumpy(got.x), want.x) <= tolerance
        assert relative(cupy.asnumpy(got.initial_states["h"]), want.initial_states["h"]) <= tolerance
        for layer in range(2):
            for name, value in want.params[layer].items():
                assert relative(cupy.asnumpy(got.params[layer][name]), value) <= tolerance, (layer, name)
        again = run()
        assert bool((again.x == got.x).all()) and bool((again.params[0]["b_z"] == got.params[0]["b_z"]).all())


def test_without_the_input_gradient_the_walks_give_the_same_parameter_gradients(cupy):
    """input_gradient=False through the walks (two layers: layer 1's input adjoint still feeds layer 0): x's gradient
    is None, every other gradient bit for bit as with it; engine.bptt(backend='scan') and CellRNN take it."""
    from engine.schedules.scan_grad import scan_gradients
    network, params, x, initial = case(engine.preset("mingru").cell, I=7, H=300, L=2, T=130, B=5, seed=9)
    d_out = cupy.asarray(np.random.default_rng(10).standard_normal((130, 5, 300)), dtype=cupy.float32)
    x_gpu = cupy.asarray(x, dtype=cupy.float32)
    full, lean = (scan_gradients(network, params, x_gpu, initial, d_out, dtype=np.float32, xp=cupy,
                                 input_gradient=asked) for asked in (True, False))
    assert lean.x is None and full.x is not None
    for layer in range(2):
        for name, value in full.params[layer].items():
            assert cupy.array_equal(lean.params[layer][name], value), (layer, name)
    assert cupy.array_equal(lean.initial_states["h"], full.initial_states["h"])
    assert engine.bptt(network, params, x_gpu, initial, d_outputs=d_out, dtype=np.float32, backend="scan",
                       input_gradient=False).x is None
    with pytest.raises(engine.BackendError, match="'input_gradient'"):
        engine.bptt(network, params, x_gpu, backend="scan", input_gradient=1)
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from engine.torch_module import CellRNN
    rnn = CellRNN(engine.preset("mingru").cell, 7, 300, 2, seed=4).cuda()
    data = torch.from_numpy(x.astype(np.float32)).cuda()
    grads = []
    for given in (data.clone().requires_grad_(), data):
        rnn.zero_grad()
        out, _ = rnn(given)
        assert rnn.last_backend == "scan"
        (out * torch.as_tensor(d_out, device="cuda")).sum().backward()
        grads.append([p.grad.clone() for p in rnn.parameters()])
    for with_x, without in zip(*grads):
        assert torch.equal(with_x, without)


@pytest.mark.parametrize("graph", CASES, ids=[c.name for c in CASES])
def test_engine_bptt_with_the_scan_equals_the_step_by_step_bptt(cupy, graph):
    network, params, x, initial = case(graph, T=64, L=2)
    weights = np.random.default_rng(11).standard_normal((64, 3, 37))
    want = engine.bptt(network, params, x, initial, d_outputs=weights)
    got = engine.bptt(network, params, x, initial, d_outputs=lambda out: cupy.asarray(weights) + 0 * out,
                      backend="scan")
    assert relative(cupy.asnumpy(got.x), want.x) <= 1e-10
    for layer in range(2):
        for name, value in want.params[layer].items():
            assert relative(cupy.asnumpy(got.params[layer][name]), value) <= 1e-10, (layer, name)


def test_a_layer_normed_min_gru_with_heads_scans_on_the_gpu(cupy):
    """Reductions and heads in the state-free part: the scan runs the dense form (engine/dense.py), forward and the
    gradients, which come back in the cell's own shapes (W_h as its 2 blocks)."""
    from test_heads_reductions import ln_mingru
    network, params, x, initial = case(ln_mingru, I=6, H=38)
    want = engine.run(network, params, x, initial, backend="reference", dtype=np.float64)
    got = scan.prepare(network, params).run(x.astype(np.float32), initial, poison=True)
    assert relative(cupy.asnumpy(got.outputs), want.outputs) <= 1e-5
    d_out = np.random.default_rng(3).standard_normal(want.outputs.shape)
    grads = engine.bptt(network, params, x, initial, d_outputs=d_out, backend="scan")
    step = engine.bptt(network, params, x, initial, d_outputs=d_out)
    for layer in range(network.num_layers):
        for name, value in step.params[layer].items():
            assert grads.params[layer][name].shape == value.shape, name
            assert relative(cupy.asnumpy(grads.params[layer][name]), value) <= 1e-9, name


@pytest.mark.parametrize("T", [1, 5, scan.CHUNK, 130])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_reverse_scan_with_the_shifted_coefficient(cupy, T, dtype):
    """kernels/scan.cu with reverse=1, a_shift=1: g[t] = b[t] + a[t+1] g[t+1] from g[T] = initial, the adjoint's scan,
    on the forward's arrays as they are (poisoned output)."""
    rng = np.random.default_rng(T)
    a, b, initial = rng.uniform(-1, 1, (T, 3, 7)), rng.standard_normal((T, 3, 7)), rng.standard_normal((3, 7))
    want, g = np.empty_like(b), initial
    for t in reversed(range(T)):
        g = b[t] + (a[t + 1] * g if t + 1 < T else 0.0 * g)
        want[t] = g
    got = scan.cuda_scan(dtype)(*(cupy.asarray(v, dtype=dtype) for v in (a, b, initial)), cupy, poison=True,
                                reverse=True, a_shift=1)
    assert relative(cupy.asnumpy(got), want) <= (1e-12 if dtype == np.float64 else 1e-5)


@pytest.mark.parametrize("name", ["mingru", "minlstm"])
def test_cell_rnn_trains_a_linear_recurrence_as_a_scan(cupy, name):
    """CellRNN on CUDA fp32: a cell whose scan walks trains through scan_grad.walk_record (last_backend "scan"),
    with given initial states and the final states in the loss, against the engine's float64 bptt; scan=False
    keeps the step-by-step training step."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from engine.torch_module import CellRNN
    cell = engine.preset(name).cell
    rnn = CellRNN(cell, 5, 40, 2, seed=4).cuda()
    rng = np.random.default_rng(8)
    x = torch.from_numpy(rng.standard_normal((300, 3, 5)).astype(np.float32)).cuda().requires_grad_()
    h0 = {s: torch.from_numpy(rng.uniform(-0.5, 0.5, (2, 3, 40)).astype(np.float32)).cuda().requires_grad_()
          for s in cell.state_names}
    w_out, w_final = rng.standard_normal((300, 3, 40)), rng.standard_normal((2, 3, 40))
    out, states = rnn(x, h0)
    assert rnn.last_backend == "scan"
    state = cell.state_names[0]
    ((out * torch.from_numpy(w_out).float().cuda()).sum()
     + (states[state] * torch.from_numpy(w_final).float().cuda()).sum()).backward()
    want = engine.bptt(rnn.network, rnn.engine_params(), x.detach().double().cpu().numpy(),
                       {s: v.detach().double().cpu().numpy() for s, v in h0.items()}, d_outputs=w_out,
                       d_final_states={state: w_final})
    assert relative(out.detach().cpu().numpy(), want.outputs) < 2e-5
    assert relative(x.grad.cpu().numpy(), want.x) < 2e-5
    assert relative(h0[state].grad.cpu().numpy(), want.initial_states[state]) < 2e-5
    for layer, tensors in enumerate(rnn.layer_parameters()):
        for p, tensor in zip(rnn.names[layer], tensors):
            assert relative(tensor.grad.cpu().numpy(), want.params[layer][p]) < 2e-5, (layer, p)
    stepped = CellRNN(cell, 5, 40, 2, seed=4, scan=False).cuda()
    again, _ = stepped(x, h0)
    assert stepped.last_backend == "fused"
    assert relative(again.detach().cpu().numpy(), want.outputs) < 2e-5


def test_the_training_loop_trains_a_min_gru_as_a_scan_on_the_gpu(cupy, monkeypatch):
    """engine.train(device="gpu") takes the walk's tape for minGRU (scan_grad.walk_record, counted here): its first
    losses follow the float64 CPU run's, it learns, and a second run repeats it exactly."""
    from engine.schedules import scan_grad
    from engine.training import loop
    taken = []

    def counted(*args, **kwargs):
        tape = scan_grad.walk_record(*args, **kwargs)
        taken.append(tape is not None)
        return tape
    monkeypatch.setattr(loop, "walk_record", counted)
    settings = dict(hidden_size=16, num_layers=2, steps=40, batch=16, seq_len=12, seed=3)
    cpu = engine.train("mingru", "adding", **settings)
    gpu = engine.train("mingru", "adding", **settings, device="gpu")
    again = engine.train("mingru", "adding", **settings, device="gpu")
    assert taken and all(taken)
    np.testing.assert_allclose(gpu.losses[:5], cpu.losses[:5], rtol=1e-4)
    assert gpu.eval_losses[-1] < gpu.eval_losses[0]
    assert gpu.losses == again.losses and gpu.eval_metrics == again.eval_metrics


def test_the_scan_gives_outputs_of_the_kind_it_was_given(cupy):
    """NumPy in, NumPy out; CuPy in, CuPy out (as the wavefront schedules): engine.run(backend="auto") may pick the
    scan for a NumPy caller."""
    network, params, x, initial = case(engine.preset("mingru").cell, T=40)
    program = scan.prepare(network, params)
    host = program.run(x.astype(np.float32), initial)
    assert isinstance(host.outputs, np.ndarray) and all(isinstance(v, np.ndarray) for v in host.final_states.values())
    device = program.run(cupy.asarray(x, dtype=cupy.float32), initial)
    assert isinstance(device.outputs, cupy.ndarray)
    assert bool((cupy.asarray(host.outputs) == device.outputs).all())
