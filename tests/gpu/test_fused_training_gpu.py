"""The fused training step on the GPU (bptt backend "fused", engine/autodiff/fused_tape.py) against the NumPy reference
in float64, on fresh random inputs: every preset, the unusual cells, random cells; work buffers poisoned with NaN
first; the backward ops' CUDA forms against their NumPy meanings; CellRNN on CUDA fp32 tensors runs it."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from test_autodiff import UNUSUAL
from test_fuzz_cells import cell_designs

import engine
from engine.autodiff import bptt, fused_cache, fused_planner, fused_runner, fused_tape
from engine.ops import GRAD_OPS

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("release_gpu_memory")]

TOL = 2e-4          # norm-relative, fp32 against float64 over a few steps (measured: 1e-7 .. 1e-5)


def relative(got, want) -> float:
    """Norm-relative error; values whose RMS is under 1e-2 are compared absolutely (to TOL * 1e-2): a cell such as
    s - tanh(s) cancels its O(1) terms to 1e-11, where fp32's rounding of the terms is all that is left."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-2 * np.sqrt(want.size)))


def case(cell, seed, layers=2, I=5, H=6, T=7, B=3, P=None):
    H = cell.fit_size(H)                     # a multiple of a cell's heads (slstm: 8)
    if cell.input_is_hidden:
        I = H
    network = engine.Network(cell, I, H, layers, proj_size=P)
    rng = np.random.default_rng(seed)
    return (network, engine.init_params(network, seed=seed), rng.standard_normal((T, B, I)),
            {s: rng.uniform(-0.8, 0.8, (layers, B, network.state_size(s))) for s in cell.state_names},
            rng.standard_normal((T, B, network.output_size)),
            {s: rng.standard_normal((layers, B, network.state_size(s))) for s in cell.state_names})


def check(cupy, cell, seed, poison=False, **sizes):
    network, params, x, initial, d_out, d_final = case(cell, seed, **sizes)
    want = bptt(network, params, x, initial, d_out, d_final)
    on_gpu = {s: cupy.asarray(v, dtype=cupy.float32) for s, v in initial.items()}
    d_final_gpu = {s: cupy.asarray(v, dtype=cupy.float32) for s, v in d_final.items()}
    if poison:      # every work buffer NaN first: a value read before it is written shows in the result
        tape = fused_tape.record(network, params, cupy.asarray(x, dtype=cupy.float32), on_gpu, poison=True)
        got = tape.backward(cupy.asarray(d_out, dtype=cupy.float32), d_final_gpu)
    else:
        got = bptt(network, params, cupy.asarray(x, dtype=cupy.float32), on_gpu,
                   cupy.asarray(d_out, dtype=cupy.float32), d_final_gpu, dtype=np.float32, backend="fused")
    assert isinstance(got.x, cupy.ndarray)
    assert_equal_reference(got, want, network)


def assert_equal_reference(got, want, network) -> None:
    """The GPU's outputs, final states and every gradient (CuPy) within TOL of the float64 reference's."""
    assert relative(got.outputs.get(), want.outputs) < TOL
    for s in network.cell.state_names:
        assert relative(got.final_states[s].get(), want.final_states[s]) < TOL, s
        assert relative(got.initial_states[s].get(), want.initial_states[s]) < TOL, s
    assert relative(got.x.get(), want.x) < TOL
    for layer in range(network.num_layers):
        for p, value in want.params[layer].items():
            assert relative(got.params[layer][p].get(), value) < TOL, (layer, p)


@pytest.mark.parametrize("name", sorted(engine.presets()))
def test_every_preset_equals_the_reference(cupy, name):
    cell = engine.preset(name).cell
    check(cupy, cell, seed=len(name), P=4 if cell.uses_projection else None)


@pytest.mark.parametrize("name", ["lstm", "gru", "gru_cho", "mgu", "lstm_fgr"])
def test_poisoned_buffers_three_layers(cupy, name):
    check(cupy, engine.preset(name).cell, seed=3, poison=True, layers=3, T=9, B=4)


@pytest.mark.parametrize("name", sorted(UNUSUAL))
def test_unusual_cells_equal_the_reference(cupy, name):
    check(cupy, UNUSUAL[name], seed=2, poison=True, I=4, H=4)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cell_designs())
def test_random_cells_equal_the_reference(cupy, design):
    cell = engine.from_dict(design)
    check(cupy, cell, seed=5, poison=True, I=3, H=4, T=4, B=2)


def test_larger_sizes_where_the_gemms_tile(cupy):
    """Sizes that are not multiples of anything, B > 1 block of threads, a real sequence."""
    check(cupy, engine.preset("lstm").cell, seed=9, layers=2, I=37, H=129, T=23, B=19)
    check(cupy, engine.preset("gru").cell, seed=9, layers=2, I=37, H=129, T=23, B=19)


def test_backward_ops_cuda_forms_equal_their_numpy_meaning(cupy):
    """Each op of GRAD_OPS with a CUDA form, on random values and on its kinks (relu at 0, hard sigmoid at +-3, abs
    at 0, max and min at ties: the third operand equals the second at a quarter of the points)."""
    from engine.autodiff.fused_codegen import statement_expr
    from engine.autodiff.fused_plan import Statement
    from engine.codegen.nvrtc import load_module
    rng = np.random.default_rng(0)
    kinks_a, kinks_b = [0.0, -0.0, 3.0, -3.0, 2.9999998, -2.9999998], [0.0, 1.0, 3.0, -3.0, 3.0, -3.0]
    a = np.concatenate([rng.standard_normal(1000) * 4, kinks_a]).astype(np.float32)
    b = np.concatenate([rng.standard_normal(1000) * 4, kinks_b]).astype(np.float32)
    c = np.where(rng.random(a.size) < 0.25, b, rng.standard_normal(a.size) * 4).astype(np.float32)
    operands = (a, b, c)
    for name, spec in GRAD_OPS.items():
        if spec.cuda is None:
            continue
        ports = ("a", "b", "c")[:spec.arity]
        expr = statement_expr(Statement("r", name, ports))
        source = ('extern "C" __global__ void f(const float* a, const float* b, const float* c, float* r, int n) {'
                  ' int i = blockIdx.x * blockDim.x + threadIdx.x; if (i >= n) return;'
                  f' const float v_a = a[i]; const float v_b = b[i]; const float v_c = c[i]; r[i] = {expr}; }}')
        kernel = load_module(cuda_helpers_source() + source).get_function("f")
        out = cupy.full(a.shape, np.nan, dtype=cupy.float32)
        kernel(((a.size + 255) // 256,), (256,), (*(cupy.asarray(v) for v in operands), out, np.int32(a.size)))
        args = operands[:spec.arity]
        if spec.cuda_helper:       # a helper computes several roundings (tanh, exp): held to the float64 meaning
            want = spec.numpy(*(v.astype(np.float64) for v in args))
            bound = 2e-6 * np.abs(want) + 1e-6 * np.abs(a)
        else:
            want = spec.numpy(*args)
            # NVRTC may contract 1 - y * y into one FMA (more exact than NumPy's two roundings): the bound is the
            # rounding of the terms, not of the result
            bound = 4e-7 * np.abs(want) + 2e-7 * np.abs(a) * (1.0 + b.astype(np.float64) ** 2)
        wrong = np.nonzero(np.abs(out.get() - want) > bound)[0]
        assert not wrong.size, (name, a[wrong[:3]], b[wrong[:3]], out.get()[wrong[:3]], want[wrong[:3]])


def cuda_helpers_source() -> str:
    """kernels/cell_ops.cuh, which the generated training kernels inline: the helpers the CUDA forms call."""
    from engine.codegen.cuda import helper_source
    return helper_source("cell_ops.cuh") + "\n"


def test_cell_rnn_float32_on_cuda_runs_the_fused_step(cupy):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from engine.torch_module import CellRNN
    rnn = CellRNN(engine.preset("gru_cho").cell, 5, 6, 2, seed=4).cuda()
    x = torch.randn(7, 3, 5, device="cuda", requires_grad=True)
    out, _ = rnn(x)
    assert rnn.last_backend == "fused"
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    want = engine.bptt(rnn.network, rnn.engine_params(), x.detach().double().cpu().numpy(),
                       d_outputs=weights.double().cpu().numpy())
    assert relative(x.grad.cpu().numpy(), want.x) < TOL
    for layer, tensors in enumerate(rnn.layer_parameters()):
        for p, tensor in zip(rnn.names[layer], tensors):
            assert relative(tensor.grad.cpu().numpy(), want.params[layer][p]) < TOL, (layer, p)


def test_graphs_are_captured_and_a_second_tape_gets_its_own_buffers(cupy):
    """The program's layers run as CUDA graphs; two tapes alive at once never share buffers; outputs are copies that
    the next step does not overwrite."""
    network, params, x, initial, d_out, d_final = case(engine.preset("lstm").cell, seed=11)
    want = bptt(network, params, x, initial, d_out, d_final)
    x_gpu = cupy.asarray(x, dtype=cupy.float32)
    first = engine.autodiff.record(network, params, x_gpu, dtype=np.float32, backend="fused",
                                   initial_states={s: cupy.asarray(v) for s, v in initial.items()})
    assert first.program.capture_error is None and first.program.graphs
    second = engine.autodiff.record(network, params, x_gpu * 0.5, dtype=np.float32, backend="fused")
    assert second.program is not first.program
    outputs = first.outputs.copy()
    g1 = first.backward(cupy.asarray(d_out, dtype=cupy.float32), {s: cupy.asarray(v) for s, v in d_final.items()})
    second.backward(cupy.asarray(d_out, dtype=cupy.float32))
    third = engine.autodiff.record(network, params, x_gpu * 2.0, dtype=np.float32, backend="fused")
    assert third.program is first.program or third.program is second.program      # reused once released
    assert cupy.array_equal(first.outputs, outputs)                                   # not overwritten
    assert relative(g1.x.get(), want.x) < TOL
    for p, value in want.params[1].items():
        assert relative(g1.params[1][p].get(), value) < TOL, p


@pytest.mark.parametrize("name", ["lstm", "lstm_fgr", "peephole_lstm", "gru_cho"])
def test_the_after_part_is_one_captured_graph_and_its_results_are_copies(cupy, name):
    """The wavefront's after part (weight, bias and peephole gradients, the initial states' adjoints) is one replayed
    graph into the program's buffers (Program.after); what backward returns are copies, which the program's next
    backward leaves alone."""
    network, params, x, initial, d_out, d_final = case(engine.preset(name).cell, seed=5, layers=2)
    want = bptt(network, params, x, initial, d_out, d_final)
    gpu = {s: cupy.asarray(v, dtype=cupy.float32) for s, v in initial.items()}
    tape = fused_tape.record(network, params, cupy.asarray(x, dtype=cupy.float32), gpu, poison=True)
    program = tape.program
    assert program.captures_after()
    got = tape.backward(cupy.asarray(d_out, dtype=cupy.float32),
                        {s: cupy.asarray(v, dtype=cupy.float32) for s, v in d_final.items()})
    assert program.after_graph is not None and program.after_error is None
    kept = {p: v.copy() for p, v in got.params[0].items()}
    kept_initial = {s: v.copy() for s, v in got.initial_states.items()}
    again = fused_tape.record(network, params, cupy.asarray(x * 3.0, dtype=cupy.float32), gpu, poison=True)
    assert again.program is program                          # the same program (and graph), replayed
    again.backward(cupy.asarray(d_out * -2.0, dtype=cupy.float32))
    for p, v in kept.items():
        assert cupy.array_equal(got.params[0][p], v), p
        assert got.params[0][p].data.ptr != program.grad_views[0][p].data.ptr
    for s, v in kept_initial.items():
        assert cupy.array_equal(got.initial_states[s], v), s
    for layer in range(network.num_layers):
        for p, value in want.params[layer].items():
            assert relative(got.params[layer][p].get(), value) < TOL, (layer, p)
    for s in network.cell.state_names:
        assert relative(got.initial_states[s].get(), want.initial_states[s]) < TOL, s


def test_a_cell_with_after_part_nodes_keeps_the_uncaptured_after_part(cupy):
    """every_op leaves nodes to the interpreter after the sweep (plan.after_rest): no captured after part, and its
    gradients still equal the reference."""
    cell = UNUSUAL["every_op"]
    network, params, x, initial, d_out, d_final = case(cell, seed=3, layers=2)
    tape = fused_tape.record(network, params, cupy.asarray(x, dtype=cupy.float32), None, poison=True)
    assert not tape.program.captures_after()
    got = tape.backward(cupy.asarray(d_out, dtype=cupy.float32))
    assert tape.program.after_graph is None
    want = bptt(network, params, x, None, d_out)
    for layer in range(network.num_layers):
        for p, value in want.params[layer].items():
            assert relative(got.params[layer][p].get(), value) < TOL, (layer, p)


def test_a_nan_parameter_on_the_gpu_is_named(cupy):
    """The inputs' finiteness check (one launch over all of them, read once the forward is queued) still names the
    bad value."""
    from engine.errors import BackendError
    network, params, x, *_ = case(engine.preset("gru").cell, seed=1)
    gpu = engine.Params([{k: cupy.asarray(v, dtype=cupy.float32) for k, v in layer.items()} for layer in params.layers])
    gpu.layers[1]["W_hz"][2, 3] = cupy.nan
    with pytest.raises(BackendError, match=r"params layer 1 'W_hz' has 1 NaN or Inf value\(s\), the first at index "
                                           r"\(2, 3\)"):
        bptt(network, gpu, cupy.asarray(x, dtype=cupy.float32), dtype=np.float32, backend="fused")


def test_bad_values_found_after_the_work_is_queued_are_named_and_nothing_is_lost(cupy):
    """The fused step asks its finiteness checks once the forward (or backward) is queued: a NaN in x or d_outputs
    is still named; the program is free for the next record, and a tape whose d_outputs was bad takes a corrected
    one and gives the reference's gradients."""
    from engine.errors import BackendError
    network, params, x, initial, d_out, _ = case(engine.preset("lstm").cell, seed=3)
    want = bptt(network, params, x, initial, d_out)
    gpu_initial = {s: cupy.asarray(v, dtype=cupy.float32) for s, v in initial.items()}
    bad_x = cupy.asarray(x, dtype=cupy.float32)
    bad_x[4, 1, 2] = cupy.inf
    with pytest.raises(BackendError, match=r"^x has 1 NaN or Inf value\(s\), the first at index \(4, 1, 2\)"):
        engine.autodiff.record(network, params, bad_x, gpu_initial, dtype=np.float32, backend="fused")
    tape = engine.autodiff.record(network, params, cupy.asarray(x, dtype=cupy.float32), gpu_initial,
                                  dtype=np.float32, backend="fused")
    bad_d = cupy.asarray(d_out, dtype=cupy.float32)
    bad_d[6, 2, 5] = cupy.nan
    with pytest.raises(BackendError, match=r"argument 'd_outputs' has 1 NaN or Inf value\(s\), the first at index "
                                           r"\(6, 2, 5\)"):
        tape.backward(bad_d)
    got = tape.backward(cupy.asarray(d_out, dtype=cupy.float32))
    assert relative(got.x.get(), want.x) < TOL
    for layer in range(network.num_layers):
        for p, value in want.params[layer].items():
            assert relative(got.params[layer][p].get(), value) < TOL, (layer, p)


def test_the_finiteness_check_finds_one_bad_value_among_many_arrays(cupy):
    """One launch over a table of arrays of three dtypes: a NaN or Inf anywhere in any of them (the last element
    of a large array, an fp16 Inf, a strided view) is found; all finite passes."""
    from engine.backends.common import _launch_all_finite
    rng = np.random.default_rng(5)
    arrays = [cupy.asarray(rng.standard_normal(n), dtype=dtype) for n, dtype in
              [(3_000_001, np.float32), (7, np.float64), (513, np.float16), (1, np.float32), (0, np.float32)]]
    arrays.append(cupy.asarray(rng.standard_normal((40, 30)), dtype=np.float32)[:, ::3])
    assert _launch_all_finite(arrays).all_finite()
    for which, index, bad in [(0, -1, np.nan), (1, 3, np.inf), (2, 512, np.inf), (3, 0, -np.inf), (5, (39, 9), np.nan)]:
        spoilt = [a.copy() for a in arrays]
        spoilt[which][index] = bad
        assert not _launch_all_finite(spoilt).all_finite(), (which, index)
    assert _launch_all_finite([arrays[0], np.zeros(3)]) is None     # a NumPy value: the caller looks value by value


def test_the_finiteness_and_copy_tables_kept_by_address_read_the_values_of_each_call(cupy):
    """The finiteness check and the copy launch keep their uploaded tables by the arrays' addresses (a step checks and
    loads the same arrays every time): a value made bad in place after a clean check is still found, and a source
    changed in place is copied with its new values."""
    from engine.autodiff.fused_cache import gpu_runner
    from engine.autodiff.fused_planner import training_plan
    from engine.backends.common import _launch_all_finite
    arrays = [cupy.arange(10, dtype=cupy.float32), cupy.ones(7, dtype=cupy.float32)]
    assert _launch_all_finite(arrays).all_finite()
    assert _launch_all_finite(arrays).all_finite()                    # the kept table
    arrays[1][3] = cupy.nan
    assert not _launch_all_finite(arrays).all_finite()
    arrays[1][3] = 1.0
    assert _launch_all_finite(arrays).all_finite()
    # two checks of the same arrays in flight at once: the second gets flags of its own (the first's are busy
    # until read), each result its own, and a read twice gives the same answer
    first = _launch_all_finite(arrays)
    arrays[0][9] = cupy.inf
    second = _launch_all_finite(arrays)
    arrays[0][9] = 9.0
    third_after = _launch_all_finite(arrays + [cupy.zeros(3, dtype=cupy.float64)])    # two dtypes, two launches
    assert first.all_finite() and not second.all_finite() and third_after.all_finite()
    assert first.all_finite() and not second.all_finite()
    both = [cupy.ones(5, dtype=cupy.float64), cupy.full(4, cupy.nan, dtype=cupy.float32)]
    assert not _launch_all_finite(both).all_finite()
    assert _launch_all_finite(arrays).all_finite()          # the kept flags again, after the busy ones
    runner = gpu_runner(training_plan(engine.preset("lstm").cell))
    source, target = cupy.arange(20_000, dtype=cupy.float32), cupy.zeros(20_000, dtype=cupy.float32)
    geometry = [runner.copy_geometry(target)]
    runner.copy([(target, source)], geometry)
    assert cupy.array_equal(target, source)
    source *= -2.0
    runner.copy([(target, source)], geometry)                         # the same addresses: the kept table
    assert cupy.array_equal(target, source)


def test_the_memory_check_refuses_a_new_program_and_a_cached_one_holds_its_memory(cupy, monkeypatch):
    """bptt.record's check of the saved values' memory runs where the fused step makes a program (its buffers are the
    allocation): a new shape that cannot fit is refused before allocating, naming T, B and L; a shape whose program is
    cached runs without asking the driver again."""
    import importlib

    from engine.autodiff import checks
    record = importlib.import_module("engine.autodiff.bptt").record       # the package's `bptt` is the function
    network, params, x, initial, d_out, d_final = case(engine.preset("gru").cell, 4, T=9, B=5)
    x = cupy.asarray(x, dtype=cupy.float32)
    asked = []
    real = checks.device_free_bytes
    monkeypatch.setattr(checks, "device_free_bytes", lambda: asked.append(1) or real())
    record(network, params, x, dtype=np.float32, backend="fused").backward(cupy.asarray(d_out, cupy.float32))
    assert asked == [1]
    monkeypatch.setattr(checks, "device_free_bytes", lambda: asked.append(1) or 1_000)
    record(network, params, x, dtype=np.float32, backend="fused").backward(cupy.asarray(d_out, cupy.float32))
    assert asked == [1]                     # the cached program: not asked
    with pytest.raises(engine.BackendError, match=r"bptt needs about [\d,]+ bytes of device memory .* T=9, B=4, L=2"):
        record(network, params, x[:, :4], dtype=np.float32, backend="fused")
    assert asked == [1, 1]


def test_the_copy_launch_fills_every_destination(cupy):
    """Runner.copy: pieces across COPY_CHUNK boundaries, zero fills, a destination that is not contiguous."""
    runner = fused_cache.gpu_runner(fused_planner.training_plan(engine.preset("lstm").cell))
    rng = np.random.default_rng(6)
    sizes = [1, fused_runner.COPY_CHUNK - 1, fused_runner.COPY_CHUNK, 3 * fused_runner.COPY_CHUNK + 5, 1000]
    sources = [cupy.asarray(rng.standard_normal(n), dtype=cupy.float32) for n in sizes]
    targets = [cupy.full(n, cupy.nan, dtype=cupy.float32) for n in sizes]
    zeros = cupy.full(2 * fused_runner.COPY_CHUNK + 1, cupy.nan, dtype=cupy.float32)
    strided = cupy.full((8, 6), cupy.nan, dtype=cupy.float32)
    block = cupy.asarray(rng.standard_normal((8, 3)), dtype=cupy.float32)
    # a block of a matrix over several pieces (pieces that start mid-row), a zero block, a destination that is not
    # rows of contiguous columns (filled on its own)
    grid = cupy.full((300, 100), cupy.nan, dtype=cupy.float32)
    wide = cupy.asarray(rng.standard_normal((300, 40)), dtype=cupy.float32)
    every_other = cupy.full((4, 10), cupy.nan, dtype=cupy.float32)
    runner.copy(list(zip(targets, sources)) + [(zeros, None), (strided[:, :3], block), (grid[:, 50:90], wide),
                                               (grid[:, 10:20], None), (every_other[:, ::2], block[:4, :]
                                                                        .repeat(2, axis=1)[:, :5])])
    for target, source in zip(targets, sources):
        assert cupy.array_equal(target, source)
    assert not cupy.any(zeros)
    assert cupy.array_equal(strided[:, :3], block) and cupy.isnan(strided[:, 3:]).all()
    assert cupy.array_equal(grid[:, 50:90], wide) and not cupy.any(grid[:, 10:20])
    assert cupy.isnan(grid[:, :10]).all() and cupy.isnan(grid[:, 20:50]).all() and cupy.isnan(grid[:, 90:]).all()
    assert cupy.array_equal(every_other[:, ::2], block[:4, :].repeat(2, axis=1)[:, :5])
    assert cupy.isnan(every_other[:, 1::2]).all()


def test_the_lay_out_launch_equals_stage_fusions_lay_out(cupy):
    """Runner.lay_out_weights (kernels/lay_out.cu): every layer's fused-stage weights in one launch, equal to
    stage_fusion.lay_out (interleaved and transposed, sizes off the 32 x 32 tiles, 1 to 4 members, several layers),
    and in a program the same arrays the NumPy assignment made, after a second load of new parameters."""
    from types import SimpleNamespace

    from engine.autodiff.stage_fusion import lay_out
    runner = fused_cache.gpu_runner(fused_planner.training_plan(engine.preset("lstm").cell))
    rng = np.random.default_rng(8)
    layers, wants = [], []
    for shape, layout, members in [((4 * 37, 45), "interleaved", 4), ((4 * 37, 45), "transposed", 1),
                                   ((70, 4 * 33), "transposed", 4), ((3, 1), "interleaved", 3),
                                   ((96, 64), "interleaved", 2), ((130, 66), "transposed", 2)]:
        stacked = cupy.asarray(rng.standard_normal(shape), dtype=cupy.float32)
        target = cupy.full(shape[::-1] if layout == "transposed" else shape, cupy.nan, dtype=cupy.float32)
        layers.append(SimpleNamespace(stacked={"w": stacked}, stage_weights={("w", layout, members): target}))
        wants.append((target, lay_out(np, stacked.get(), layout, members)))
    runner.lay_out_weights(layers, runner.lay_out_table(layers))
    for target, want in wants:
        np.testing.assert_array_equal(target.get(), want)

    for name in ("lstm", "lstm_fgr", "gru_cho"):
        network, params, x, initial, d_out, d_final = case(engine.preset(name).cell, 3, layers=2, I=5, H=36, B=2)
        tape = fused_tape.record(network, params, cupy.asarray(x, dtype=cupy.float32), None, poison=True)
        program = tape.program
        assert program.lay_out is not None, name
        for seed in (4, 5):        # a second load with new parameters: the same table, the new values
            params = engine.init_params(network, seed=seed)
            for layer in program.layers:
                for target in layer.stage_weights.values():
                    target.fill(cupy.nan)
            program.load(params, cupy.asarray(x, dtype=cupy.float32), None)
            for layer in program.layers:
                for (key, layout, members), target in layer.stage_weights.items():
                    want = lay_out(np, layer.stacked[key].get(), layout, members)
                    np.testing.assert_array_equal(target.get(), want, err_msg=f"{name} {key} {layout}")
        program.release()


def test_batch_sum_on_the_gpu_equals_numpy(cupy):
    """The bias gradients' sum over rows (a cuBLAS GEMV on the GPU) on a strided view, fp32 and fp64."""
    rng = np.random.default_rng(7)
    for dtype in (np.float32, np.float64):
        host = rng.standard_normal((6400, 96)).astype(dtype)
        got = GRAD_OPS["batch_sum"].numpy(cupy.asarray(host)[:, 16:80])
        assert got.shape == (64,) and got.dtype == dtype
        np.testing.assert_allclose(got.get(), host[:, 16:80].astype(np.float64).sum(axis=0), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("wavefront", [True, False], ids=["wavefront", "layers"])
@pytest.mark.parametrize("name", ["lstm", "gru_cho"])
def test_the_wavefronts_on_streams_and_layer_by_layer_equal_the_reference(cupy, name, wavefront, monkeypatch):
    """The layers' forward as a wavefront and their backward as a reverse one (a stream a layer, events between
    chunks, each captured as one graph), or layer by layer (a graph a layer and direction): the same gradients;
    the graphs are captured, and replayed for a second step."""
    from engine.autodiff import fused_program
    monkeypatch.setattr(fused_program, "WAVEFRONT_CHUNK", 3)
    network, params, x, initial, d_out, d_final = case(engine.preset(name).cell, seed=13, layers=3, T=10)
    want = bptt(network, params, x, initial, d_out, d_final)
    for _ in range(2):
        tape = fused_tape.record(network, params, cupy.asarray(x, dtype=cupy.float32),
                            {s: cupy.asarray(v, dtype=cupy.float32) for s, v in initial.items()},
                            wavefront=wavefront)
        forward, backward = (("forward", "wavefront", 0), ("backward", "wavefront", 0)) if wavefront else \
            ((0, "forward"), (0, "backward", True))
        assert tape.program.wavefront == wavefront and forward in tape.program.graphs
        got = tape.backward(cupy.asarray(d_out, dtype=cupy.float32),
                            {s: cupy.asarray(v, dtype=cupy.float32) for s, v in d_final.items()})
        assert backward in tape.program.graphs and tape.program.capture_error is None
        assert relative(got.outputs.get(), want.outputs) < TOL
        assert relative(got.x.get(), want.x) < TOL
        for layer in range(network.num_layers):
            for p, value in want.params[layer].items():
                assert relative(got.params[layer][p].get(), value) < TOL, (layer, p)


@pytest.mark.parametrize("wavefront", [True, False], ids=["wavefront", "layers"])
@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("name", ["lstm", "mingru"])
def test_without_the_input_gradient_layer_0s_input_gemm_is_left_out(cupy, name, layers, wavefront, monkeypatch):
    """backward(input_gradient=False): x's gradient is None and its buffer is left as it was (NaN here: layer 0's
    input adjoint GEMM did not run; minGRU's plan has no input GEMM, and its after part runs without the input
    adjoint's nodes), every other gradient bit for bit as with it; the two ways are graphs of their own on the one
    cached program, taken in either order."""
    from engine.autodiff import fused_program
    monkeypatch.setattr(fused_program, "WAVEFRONT_CHUNK", 3)
    pruned = []
    keep = fused_tape.gradient_nodes
    monkeypatch.setattr(fused_tape, "gradient_nodes", lambda nodes: pruned.append(len(nodes)) or keep(nodes))
    network, params, x, initial, d_out, d_final = case(engine.preset(name).cell, seed=17, layers=layers, T=10)
    want = bptt(network, params, x, initial, d_out, d_final)
    got = []
    for asked in (True, False, True):
        tape = fused_tape.record(network, params, cupy.asarray(x, dtype=cupy.float32),
                                 {s: cupy.asarray(v, dtype=cupy.float32) for s, v in initial.items()},
                                 wavefront=wavefront)
        if tape.program.d_input is not None:
            tape.program.d_input[...] = cupy.nan
        got.append(tape.backward(cupy.asarray(d_out, dtype=cupy.float32),
                                 {s: cupy.asarray(v, dtype=cupy.float32) for s, v in d_final.items()},
                                 input_gradient=asked))
        if tape.program.d_input is not None:
            assert bool(cupy.isnan(tape.program.d_input).all()) != asked
    if tape.program.d_input is None:      # the after part without the input adjoint's nodes, once
        assert len(pruned) == 1 and len(keep(tape.plan.after_layers)) < pruned[0]
    assert got[1].x is None and tape.program.capture_error is None
    assert relative(got[0].x.get(), want.x) < TOL and cupy.array_equal(got[2].x, got[0].x)
    for layer in range(layers):
        for p, value in want.params[layer].items():
            assert relative(got[1].params[layer][p].get(), value) < TOL, (layer, p)
            assert cupy.array_equal(got[1].params[layer][p], got[0].params[layer][p]), (layer, p)
    lean = bptt(network, params, cupy.asarray(x, dtype=cupy.float32), None, cupy.asarray(d_out, dtype=cupy.float32),
                dtype=np.float32, backend="fused", input_gradient=False)
    assert lean.x is None and all(lean.params[0][p].shape == v.shape for p, v in params[0].items())


def test_cell_rnn_leaves_x_s_gradient_out_where_autograd_does_not_ask_for_it(cupy):
    """x without requires_grad (data): CellRNN's backward skips its GEMM; the parameters' gradients are the same."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from engine.torch_module import CellRNN
    rnn = CellRNN(engine.preset("gru_cho").cell, 5, 6, 2, seed=4).cuda()
    data = torch.randn(7, 3, 5, device="cuda")
    grads = []
    for x in (data.clone().requires_grad_(), data):
        rnn.zero_grad()
        out, _ = rnn(x)
        (out * torch.linspace(-1, 1, out.numel(), device="cuda").reshape(out.shape)).sum().backward()
        grads.append([p.grad.clone() for p in rnn.parameters()])
    assert data.grad is None
    for with_x, without in zip(*grads):
        assert torch.equal(with_x, without)


def test_the_training_loop_on_the_gpu_follows_the_cpu_and_repeats(cupy):
    """engine.train(device="gpu"): the fused step, the readout, the loss and Adam on the GPU in float32. Its first
    losses equal the float64 CPU run's to fp32 rounding, it learns, a second run repeats it exactly, and the trained
    values come back as NumPy float64; cross-entropy tasks run too."""
    cpu = engine.train("lstm", "adding", hidden_size=16, num_layers=2, steps=40, batch=16, seq_len=12, seed=3)
    gpu = engine.train("lstm", "adding", hidden_size=16, num_layers=2, steps=40, batch=16, seq_len=12, seed=3,
                       device="gpu")
    again = engine.train("lstm", "adding", hidden_size=16, num_layers=2, steps=40, batch=16, seq_len=12, seed=3,
                         device="gpu")
    np.testing.assert_allclose(gpu.losses[:5], cpu.losses[:5], rtol=1e-4)
    assert gpu.eval_losses[-1] < gpu.eval_losses[0] and gpu.eval_steps == cpu.eval_steps
    assert gpu.losses == again.losses and gpu.eval_metrics == again.eval_metrics
    assert gpu.settings["device"] == "gpu" and gpu.settings["dtype"] == "float32"
    for layer in gpu.params.layers:
        assert all(isinstance(v, np.ndarray) and v.dtype == np.float64 for v in layer.values())
    parity = engine.compare(["gru", "mgu"], "parity", hidden_size=8, steps=5, batch=8, seq_len=6, device="gpu")
    assert all(np.isfinite(r.losses).all() and 0.0 <= r.final_metric <= 1.0 for r in parity)


def test_the_runner_cache_keeps_the_last_few_and_their_programs_go_with_them(cupy, monkeypatch):
    """Training cell after cell keeps MAX_RUNNERS runners (cuBLAS handles and workspaces), the most recently used;
    an evicted runner's idle programs are dropped with it, and a cell trained again gets a new runner that works."""
    from engine.autodiff.fused_planner import training_plan
    monkeypatch.setattr(fused_cache, "MAX_RUNNERS", 3)
    fused_cache.clear_runners()
    fused_cache.clear_cache()
    names = ["lstm", "gru", "mgu", "gru_cho", "elman_tanh"]
    for name in names:
        network, params, x, initial, d_out, d_final = case(engine.preset(name).cell, seed=1)
        fused_tape.record(network, params, cupy.asarray(x, dtype=cupy.float32), None).backward(
            cupy.asarray(d_out, dtype=cupy.float32))
    assert len(fused_cache._runners) == 3
    kept = {key[0].name for key in fused_cache._runners}
    assert kept == set(names[-3:])
    held = {p.runner.plan.cell.name for pool in fused_cache._programs.values() for p in pool}
    assert held <= kept, held
    runner = fused_cache.gpu_runner(training_plan(engine.preset("lstm").cell))
    assert runner.plan.cell.name == "lstm" and len(fused_cache._runners) == 3
    check(cupy, engine.preset("lstm").cell, seed=2)
