"""Schedule 'scan' in the precision modes on the GPU (engine/schedules/scan_modes.py): the forward (WalkCall and the
general path, through cublasLt on rounded operands, float32x3 as three TF32 GEMMs), the gradients (the walks, the
fast path and the general path, cuBLAS GemmEx on rounded operands), CellRNN and the autotuner, each against the
reference's emulation of the mode (tests/gpu/test_precision_gpu.py's measure: close to the emulation, and the
emulation explains nearly all of the divergence from float64, so a missing or wrong rounding fails)."""
from __future__ import annotations

import numpy as np
import pytest
from test_heads_reductions import case as heads_case
from test_heads_reductions import ln_mingru
from test_precision_gpu import EMULATED_TOLERANCE, UNEXPLAINED, check_mode
from test_scan import CASES

import engine
from engine.schedules import scan
from engine.schedules.scan_grad import scan_gradients

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("release_gpu_memory")]

REDUCED = ("tf32", "float16", "bfloat16")
GRAPHS = [*CASES, ln_mingru]
FP32_SLACK = 1.5                   # times the strict fp32 scan's own gradient error, for what fp32 sums leave
ORDER_SLACK = 2.0                  # times the emulation's own move from float64 to float32 arithmetic


def case(graph, I=24, H=40, L=2, T=130, B=5):
    """tests/test_heads_reductions.py's case at sizes of the GPU's (odd K for the 16-bit operands)."""
    return heads_case(graph, I=I, H=H, L=L, T=T, B=B)


def relative(got, want) -> float:
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def norm_relative(got, want) -> float:
    """As test_precision_gpu measures a mode: a value that an fp32 difference rounds to the other side moves one
    element by a 10-bit step, which the norm weighs by its share."""
    return float(np.linalg.norm(np.asarray(got, dtype=np.float64) - want) / max(np.linalg.norm(want), 1e-30))


@pytest.mark.parametrize("walk", [False, True], ids=["passes", "walk"])
@pytest.mark.parametrize("precision", REDUCED)
@pytest.mark.parametrize("graph", GRAPHS, ids=[g.name for g in GRAPHS])
def test_the_scan_in_a_mode_equals_the_emulation(cupy, monkeypatch, graph, precision, walk):
    """Odd sizes (K = 24 and 40 for the 16-bit operands), outputs poisoned; the walking cells through WalkCall."""
    monkeypatch.setattr(scan, "FORCE_WALK", walk)
    network, params, x, states, _ = case(graph)
    program = scan.prepare(network, params, precision=precision)
    if walk and graph.name == "mingru":
        assert program.walk is not None, "minGRU's forward walks through WalkCall in every mode"
    result = program.run(x.astype(np.float32), states, poison=True)
    check_mode(result, network, params, x, states, precision, f"scan {graph.name} {precision}")


@pytest.mark.parametrize("walk", [False, True], ids=["passes", "walk"])
def test_float32x3_keeps_fp32_accuracy(cupy, monkeypatch, walk):
    monkeypatch.setattr(scan, "FORCE_WALK", walk)
    network, params, x, states, _ = case(engine.preset("mingru").cell, I=256, H=256, T=300)
    want = engine.run(network, params, x, states, backend="reference", dtype=np.float64)
    strict = scan.prepare(network, params).run(x.astype(np.float32), states)
    got = scan.prepare(network, params, precision="float32x3").run(x.astype(np.float32), states, poison=True)
    bf16 = scan.prepare(network, params, precision="bfloat16").run(x.astype(np.float32), states)
    assert relative(got.outputs, want.outputs) <= 2 * max(relative(strict.outputs, want.outputs), 1e-7)
    assert relative(got.outputs, want.outputs) < 0.01 * relative(bf16.outputs, want.outputs)


def gradient_gap(got, want, network) -> float:
    """The worst norm-relative distance over x's, the initial states' and every parameter's gradient."""
    worst = norm_relative(got.x, want.x)
    for s in network.cell.state_names:
        worst = max(worst, norm_relative(got.initial_states[s], want.initial_states[s]))
    for layer in range(network.num_layers):
        for name, value in want.params[layer].items():
            worst = max(worst, norm_relative(got.params[layer][name], value))
    return worst


def host(grads, cupy):
    """The gradients (CuPy arrays) on the host."""
    grads.x = cupy.asnumpy(grads.x)
    grads.initial_states = {k: cupy.asnumpy(v) for k, v in grads.initial_states.items()}
    grads.params = [{k: cupy.asnumpy(v) for k, v in layer.items()} for layer in grads.params]
    return grads


@pytest.mark.parametrize("path", ["walk", "fast", "general"])
@pytest.mark.parametrize("precision", REDUCED)
@pytest.mark.parametrize("graph", GRAPHS, ids=[g.name for g in GRAPHS])
def test_the_scans_gradients_in_a_mode_equal_the_emulation(cupy, monkeypatch, graph, precision, path):
    """bptt(backend='scan', precision=...) through each of the three gradient paths that applies to the cell,
    against engine.bptt's emulation of the mode in float64. The part the emulation leaves unexplained may be what
    fp32 arithmetic alone makes: the strict fp32 scan's own distance from float64, or the emulation's own move when
    it runs in float32 (an operand computed in fp32 rounds to the other side of a 10-bit boundary now and then: the
    decaying cell's gradients move 1.6e-4 that way in tf32 and float16 alike, a quarter of the modes' divergence). A
    missing rounding would add the mode's whole divergence."""
    network, params, x, states, d_out = case(graph, T=70)
    monkeypatch.setattr(scan, "FORCE_WALK", path == "walk")
    if path == "general":
        from engine.schedules import scan_grad
        monkeypatch.setattr(scan_grad, "fast_path_fits", lambda cell: False)
    emulated = engine.bptt(network, params, x, states, d_outputs=d_out, precision=precision)
    strict = engine.bptt(network, params, x, states, d_outputs=d_out)
    got = host(engine.bptt(network, params, x.astype(np.float32), states, d_outputs=d_out, backend="scan",
                           dtype=np.float32, precision=precision), cupy)
    fp32 = host(engine.bptt(network, params, x.astype(np.float32), states, d_outputs=d_out, backend="scan",
                            dtype=np.float32), cupy)
    single = {k: v.astype(np.float32) for k, v in states.items()}
    emulated32 = scan_gradients(network, params, x.astype(np.float32), single, d_out.astype(np.float32),
                                dtype=np.float32, precision=precision)          # NumPy, the mode in float32
    near, far = gradient_gap(got, emulated, network), gradient_gap(got, strict, network)
    own, order = gradient_gap(fp32, strict, network), gradient_gap(emulated32, emulated, network)
    assert np.isfinite(near) and near <= EMULATED_TOLERANCE, f"{precision} {path}: {near:.3g} from the emulation"
    assert near <= max(UNEXPLAINED * far, FP32_SLACK * own, ORDER_SLACK * order), (
        f"{precision} {path}: {near:.3g} from the emulation, {far:.3g} from float64 (strict fp32: {own:.3g}; the "
        f"emulation in float32: {order:.3g})")


def test_the_walks_gemms_take_the_mode(cupy):
    """minGRU's training walks (scan_grad.walk_record) in bf16: the tape's backward equals the general path's
    gradients in the mode to fp32 summation, and not the strict walks' gradients."""
    from engine.schedules.scan_grad import walk_record
    network, params, x, states, d_out = case(engine.preset("mingru").cell, T=64)
    xs = cupy.asarray(x, dtype=cupy.float32)
    tape = walk_record(network, params, xs, {k: cupy.asarray(v, dtype=cupy.float32) for k, v in states.items()},
                       xp=cupy, precision="bfloat16")
    assert tape is not None, "minGRU at T = 64 walks"
    walked = host(tape.backward(cupy.asarray(d_out, dtype=cupy.float32)), cupy)
    general = scan_gradients(network, params, x, states, d_out, precision="bfloat16")     # NumPy, float64
    strict = scan_gradients(network, params, x, states, d_out)
    assert gradient_gap(walked, general, network) <= UNEXPLAINED * gradient_gap(walked, strict, network)


def test_cellrnn_trains_a_linear_recurrence_as_a_scan_in_bf16(cupy):
    torch = pytest.importorskip("torch")
    from engine.torch_module import CellRNN
    cell = engine.preset("mingru").cell
    rnn = CellRNN(cell, 24, 40, 2, seed=3, precision="bfloat16").cuda()
    x = torch.randn(64, 5, 24, device="cuda", requires_grad=True)
    out, *_ = rnn(x)
    assert rnn.last_backend == "scan"
    d_out = torch.randn_like(out)
    out.backward(d_out)
    params = rnn.engine_params()
    emulated = engine.bptt(rnn.network, params, x.detach().double().cpu().numpy(),
                           d_outputs=d_out.double().cpu().numpy(), precision="bfloat16")
    strict = engine.bptt(rnn.network, params, x.detach().double().cpu().numpy(), d_outputs=d_out.double().cpu().numpy())
    got_x = x.grad.double().cpu().numpy()
    assert relative(got_x, emulated.x) <= EMULATED_TOLERANCE
    # As test_the_scans_gradients_in_a_mode_equal_the_emulation measures: in the norm (a single value that fp32 sums
    # round to the other side moves by a whole bf16 step), with the emulation's own move from float64 to float32.
    emulated32 = scan_gradients(rnn.network, params, x.detach().cpu().numpy(), None, d_out.cpu().numpy(),
                                dtype=np.float32, precision="bfloat16")
    near, far = norm_relative(got_x, emulated.x), norm_relative(got_x, strict.x)
    order = norm_relative(emulated32.x, emulated.x)
    assert near <= max(UNEXPLAINED * far, ORDER_SLACK * order), (near, far, order)
    for layer, tensors in enumerate(rnn.layer_parameters()):
        for p, tensor in zip(rnn.names[layer], tensors):
            assert relative(tensor.grad.double().cpu().numpy(), emulated.params[layer][p]) <= EMULATED_TOLERANCE, \
                (layer, p)


def test_auto_takes_the_scan_in_bf16(cupy, tmp_path, monkeypatch):
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path))
    network, params, x, states, _ = case(engine.preset("mingru").cell, I=128, H=128, L=1, T=512, B=8)
    result = engine.run(network, params, x.astype(np.float32), backend="auto", precision="bfloat16")
    assert result.info["precision"] == "bfloat16"
    check_mode(result, network, params, x, None, "bfloat16", f"auto ({result.backend})")
