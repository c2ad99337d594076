"""Variable-length batches (issue #35, item 1) on the GPU: every backend that takes lengths against the float64
reference with the same lengths (engine/backends/lengths.py). Lengths are drawn in [1, T], the longest and a single
step among them, unsorted; work buffers are poisoned with NaN first; the forward's padding is NaN too (a held row
must select, not multiply: nothing computed past the end may leak), the training step's is large noise and its
loss gradient past the ends 100 times the rest (ignored). Forward: the graph and persistent schedules (every preset
they take, 1 and 3 layers; the tilings, barriers, layer groups, clusters and reduced precisions), the fused backend,
backend='auto' and the autotuner, replays whose lengths change from run to run. Training: bptt(backend="fused")
(every preset; fused stages, split K, the wavefronts, persistent launches, a program reused with new lengths), and
CellRNN on CUDA fp32 with a PackedSequence. The CPU side: tests/test_lengths_kernels.py."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from test_autodiff import UNUSUAL
from test_fused import TOLERANCE, make_case, relative_error
from test_fused_training_gpu import TOL, assert_equal_reference, case, relative
from test_precision_gpu import EMULATED_TOLERANCE, UNEXPLAINED
from test_schedules import TILINGS

import engine
from engine.autodiff import bptt, fused_program, fused_tape, persistent
from engine.backends import fused, reference
from engine.schedules import autotune, schedule_class
from engine.schedules.tiling import TileConfig

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("release_gpu_memory")]

PRESETS = sorted(n for n, p in engine.presets().items() if not p.cell.uses_projection)
SCHEDULES = ("graph", "persistent")
ADJOINT_READERS = {"every_op", "projection_only", "linear_states"}     # refused by name (tests/test_lengths_kernels.py)


def draw_lengths(T: int, B: int, seed: int) -> np.ndarray:
    """B lengths in [1, T]: T and 1 among them (from B = 2), unsorted (from B = 3: a middle one is T, the last 1,
    the first under T)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, B)
    if B == 2:
        lengths[:] = (1, T) if seed % 2 else (T, 1)
    elif B >= 3:
        lengths[0] = max(1, T // 2) if T > 1 else 1
        lengths[B // 2], lengths[-1] = T, 1
    return lengths


def nan_padded(x, lengths):
    """x with NaN past each sequence's end."""
    x = np.array(x, dtype=np.float64)
    for b, n in enumerate(lengths):
        x[n:, b] = np.nan
    return x


def forward_case(name, layers, seed, sizes=None):
    network, params, x, states = make_case(engine.preset(name).cell, layers, seed=seed,
                                           **({"sizes": sizes} if sizes else {}))
    lengths = draw_lengths(x.shape[0], x.shape[1], seed)
    return network, params, nan_padded(x, lengths), states, lengths


def check_forward(result, network, params, x, states, lengths, what, precision="float32"):
    """Within the reference's tolerance (fp32: test_fused's; a reduced precision: its emulation's, which must explain
    the divergence from float64), zero past every end, no NaN anywhere."""
    outputs = np.asarray(result.outputs.get() if hasattr(result.outputs, "get") else result.outputs)
    finals = {k: np.asarray(v.get() if hasattr(v, "get") else v) for k, v in result.final_states.items()}
    assert not np.isnan(outputs).any(), f"{what}: NaN in the outputs (the padding or a poisoned value leaked)"
    for b, n in enumerate(lengths):
        assert not outputs[n:, b].any(), f"{what}: sequence {b} has outputs past its end ({n} steps)"
    ref = reference.run(network, params, x, states, dtype=np.float64, precision=precision, lengths=lengths)
    errors = {"outputs": relative_error(outputs, ref.outputs)}
    errors |= {f"final {k}": relative_error(finals[k], v) for k, v in ref.final_states.items()}
    worst = max(errors, key=errors.get)
    limit = TOLERANCE if precision == "float32" else EMULATED_TOLERANCE
    assert errors[worst] <= limit, f"{what}: {worst} relative error {errors[worst]:.3g} > {limit}"
    if precision != "float32":
        strict = reference.run(network, params, x, states, dtype=np.float64, lengths=lengths)
        assert errors["outputs"] <= UNEXPLAINED * relative_error(outputs, strict.outputs), what
    for k, v in ref.final_states.items():       # each sequence's own last state: compare the short ones alone too
        short = [b for b, n in enumerate(lengths) if n < x.shape[0]]
        assert relative_error(finals[k][:, short], v[:, short]) <= limit, f"{what}: final {k} of the short sequences"


# ---- the forward schedules ------------------------------------------------------------------------------------

@pytest.mark.parametrize("num_layers", [1, 3])
@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_preset_with_lengths_matches_the_reference(cupy, schedule, name, num_layers):
    network, params, x, states, lengths = forward_case(name, num_layers, seed=num_layers)
    result = schedule_class(schedule)(network, params).run(x, states, poison=True, lengths=lengths)
    assert result.backend == schedule and result.info["lengths"] is True
    check_forward(result, network, params, x, states, lengths, f"{schedule} {name} L={num_layers}")


@pytest.mark.parametrize("label,sizes,config", TILINGS, ids=[t[0] for t in TILINGS])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_tilings_with_lengths(cupy, schedule, label, sizes, config):
    from dataclasses import replace
    size = {"input_size": 45, "hidden_size": 150, "batch": 3, "steps": 9} | sizes
    if schedule != "persistent":
        config = replace(config, layers_per_launch=None)
    for name in ("lstm", "gru", "gru_cho"):
        network, params, x, states, lengths = forward_case(name, 2, seed=7, sizes=size)
        result = schedule_class(schedule)(network, params, config=config).run(x, states, poison=True,
                                                                                lengths=lengths)
        check_forward(result, network, params, x, states, lengths, f"{schedule} {name} {label}")


BARRIERS = [("grid barriers", 19, TileConfig(sync="grid")), ("layer counters", 19, TileConfig(sync="layer")),
            ("layer counters, GEMV", 3, TileConfig(sync="layer")),
            ("a layer a launch", 19, TileConfig(None, 4, 4, layers_per_launch=1)),
            ("two layers a launch", 9, TileConfig(None, 4, 4, layers_per_launch=2, sync="layer"))]


@pytest.mark.parametrize("label,batch,config", BARRIERS, ids=[b[0] for b in BARRIERS])
def test_persistent_barriers_and_layer_groups_with_lengths(cupy, label, batch, config):
    size = {"input_size": 40, "hidden_size": 96, "batch": batch, "steps": 15}
    for name in ("lstm", "gru", "gru_cho"):
        network, params, x, states, lengths = forward_case(name, 4, seed=batch, sizes=size)
        result = schedule_class("persistent")(network, params, config=config).run(x, states, poison=True,
                                                                                   lengths=lengths)
        check_forward(result, network, params, x, states, lengths, f"persistent {name} {label}")


PRECISION_CASES = [("lstm", 2, 19, TileConfig(), "tf32", 129), ("gru_cho", 2, 19, TileConfig(), "float16", 129),
                   ("lstm", 2, 40, TileConfig(), "bfloat16", 128),            # the bulk pipeline (whole chunks)
                   ("gru", 3, 24, TileConfig(layers_per_launch=1), "bfloat16", 128),
                   ("lstm", 2, 4, TileConfig(resident=False), "float16", 96),   # the warp GEMV, streamed weights
                   ("slstm", 2, 16, TileConfig(sync="head"), "bfloat16", 256),
                   ("slstm", 1, 16, TileConfig(sync="cluster"), "bfloat16", 256),
                   ("lstm", 2, 16, TileConfig(sync="cluster"), "bfloat16", 256),
                   ("gru_cho", 1, 24, TileConfig(units_per_block=12, sync="cluster"), "bfloat16", 192)]


@pytest.mark.parametrize("name,layers,batch,config,precision,hidden", PRECISION_CASES,
                         ids=[f"{c[0]}-{c[4]}-{c[3].sync or 'grid'}-B{c[2]}" for c in PRECISION_CASES])
def test_reduced_precisions_head_counters_and_clusters_with_lengths(cupy, name, layers, batch, config, precision,
                                                                     hidden):
    """The 16-bit copies of h the GEMMs read hold past the end too (in cluster mode the block's own copy in shared
    memory): against the reference that emulates the mode, with lengths."""
    size = {"input_size": 64, "hidden_size": hidden, "batch": batch, "steps": 21}
    network, params, x, states, lengths = forward_case(name, layers, seed=batch + hidden, sizes=size)
    schedule = schedule_class("persistent")(network, params, config=config, precision=precision)
    result = schedule.run(x, states, poison=True, lengths=lengths)
    check_forward(result, network, params, x, states, lengths, f"persistent {name} {precision} {config.label()}",
                  precision)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_replays_take_each_runs_lengths(cupy, schedule):
    """From a shape's second run the whole run replays from CUDA graphs: each run's lengths go into the build's
    buffer first, so every run gets its own; runs without lengths (another build) and with them again alternate."""
    network, params, x, states = make_case(engine.preset("lstm").cell, 3, seed=5)
    program = schedule_class(schedule)(network, params)
    T, B = x.shape[:2]
    for i in range(6):
        lengths = None if i == 3 else draw_lengths(T, B, seed=20 + i)
        x_run = x if lengths is None else nan_padded(x, lengths)
        xs = cupy.asarray(x_run, dtype=cupy.float32) if i % 2 else x_run
        result = program.run(xs, states, lengths=lengths)
        if lengths is None:
            ref = reference.run(network, params, x, states, dtype=np.float64)
            assert relative_error(cupy.asnumpy(result.outputs), ref.outputs) <= TOLERANCE, f"run {i}"
        else:
            check_forward(result, network, params, x_run, states, lengths, f"{schedule} run {i}")
    assert program.replayed.startswith("replayed") and "with lengths" in program.replayed, program.replayed


def test_the_fused_backend_with_lengths(cupy):
    for name in ("lstm", "gru", "gru_cho", "peephole_lstm", "lstm_proj", "slstm"):
        cell = engine.preset(name).cell
        network, params, x, states = make_case(cell, 3, seed=2)
        if cell.uses_projection:
            network = engine.Network(cell, network.input_size, network.hidden_size, 3, proj_size=64)
            params = engine.init_params(network, seed=2)
            states = {s: np.zeros((3, x.shape[1], network.state_size(s))) for s in cell.state_names}
        lengths = draw_lengths(x.shape[0], x.shape[1], seed=2)
        x = nan_padded(x, lengths)
        result = fused.run(network, params, x, states, poison=True, lengths=lengths)
        assert result.info["lengths"] is True
        check_forward(result, network, params, x, states, lengths, f"fused {name}")


def test_auto_tunes_among_what_takes_lengths(cupy, tmp_path, monkeypatch):
    """backend='auto' with lengths: the autotuner times the candidates that take them (not the scan) with lengths,
    caches that choice apart from the one without, and the run matches the reference."""
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path))
    for name in ("lstm", "mingru"):
        network, params, x, states, lengths = forward_case(name, 2, seed=4)
        choice = autotune.tune(network, params, x.shape[0], x.shape[1], repeats=2, lengths=True)
        assert choice.schedule in ("fused", "graph", "persistent") and not any(
            t["candidate"] == "scan" for t in choice.timings)
        result = engine.run(network, params, x, states, backend="auto", lengths=lengths)
        assert result.backend == choice.schedule and "fastest" in result.info["backend_reason"]
        check_forward(result, network, params, x, states, lengths, f"auto {name} -> {result.backend}")
        plain = engine.run(network, params, np.nan_to_num(x), states, backend="auto")
        assert relative_error(plain.outputs, reference.run(network, params, np.nan_to_num(x), states).outputs) <= 1e-4
    entries = autotune.read_cache()
    assert sum(key.endswith("|lengths") for key in entries) == 2 and len(entries) == 4


def test_a_cuda_lengths_array_and_an_all_full_batch(cupy):
    """lengths may be a CuPy array; lengths of T everywhere compute what a run without lengths does (the same
    statements: equal to fp32 rounding at most)."""
    network, params, x, states = make_case(engine.preset("gru").cell, 2, seed=6)
    T, B = x.shape[:2]
    program = schedule_class("persistent")(network, params)
    full = program.run(x, states, lengths=cupy.full(B, T, dtype=cupy.int64))
    plain = program.run(x, states)
    np.testing.assert_allclose(full.outputs, plain.outputs, rtol=1e-6, atol=1e-7)
    for k in plain.final_states:
        np.testing.assert_allclose(full.final_states[k], plain.final_states[k], rtol=1e-6, atol=1e-7, err_msg=k)


# ---- the training step ----------------------------------------------------------------------------------------

def training_case(cell, seed, **sizes):
    """test_fused_training_gpu's case, padded: noise past each end in x and in the loss's gradient (ignored)."""
    network, params, x, initial, d_out, d_final = case(cell, seed, **sizes)
    lengths = draw_lengths(x.shape[0], x.shape[1], seed)
    for b, n in enumerate(lengths):
        x[n:, b] *= 10
        d_out[n:, b] *= 100
    return network, params, x, initial, d_out, d_final, lengths


def check_training(cupy, cell, seed, wavefront=None, **sizes):
    """bptt(backend="fused", lengths=...) against the float64 reference's bptt with the same lengths, on poisoned
    buffers; zero outputs and zero x gradients past every end. Returns the tape's program."""
    network, params, x, initial, d_out, d_final, lengths = training_case(cell, seed, **sizes)
    want = bptt(network, params, x, initial, d_out, d_final, lengths=lengths)
    tape = fused_tape.record(network, params, cupy.asarray(x, dtype=cupy.float32),
                             {s: cupy.asarray(v, dtype=cupy.float32) for s, v in initial.items()}, poison=True,
                             wavefront=wavefront, lengths=lengths)
    program = tape.program
    got = tape.backward(cupy.asarray(d_out, dtype=cupy.float32),
                        {s: cupy.asarray(v, dtype=cupy.float32) for s, v in d_final.items()})
    outputs, dx = got.outputs.get(), got.x.get()
    for b, n in enumerate(lengths):
        assert not outputs[n:, b].any() and not dx[n:, b].any(), f"sequence {b}: values past its end ({n})"
    assert_equal_reference(got, want, network)
    return program


@pytest.mark.parametrize("name", sorted(engine.presets()))
def test_every_presets_training_step_with_lengths_equals_the_reference(cupy, name):
    cell = engine.preset(name).cell
    check_training(cupy, cell, seed=len(name), layers=2, T=9, B=5, P=4 if cell.uses_projection else None)


@pytest.mark.parametrize("name", sorted(n for n in UNUSUAL if n not in ADJOINT_READERS))
def test_unusual_cells_train_with_lengths(cupy, name):
    check_training(cupy, UNUSUAL[name], seed=2, I=4, H=4, T=6, B=4)


@pytest.mark.parametrize("B", [1, 2], ids=["B1", "B2"])
@pytest.mark.parametrize("name", ["lstm", "gru", "gru_cho", "lstm_fgr", "qrnn_f", "lstm_proj"])
def test_fused_stages_with_lengths(cupy, name, B):
    """B <= 2: the GEMM and the kernel that reads it as one launch (the GEMV in shared memory, the held adjoint read
    from there, the GEMM that now adds to it)."""
    cell = engine.preset(name).cell
    check_training(cupy, cell, seed=3 + B, layers=2, I=8, H=16, T=8, B=B, P=8 if cell.uses_projection else None)


@pytest.mark.parametrize("name", ["lstm", "gru", "gru_cho"])
def test_larger_sizes_with_lengths_where_the_gemms_tile_and_split(cupy, name):
    check_training(cupy, engine.preset(name).cell, seed=9, layers=2, I=37, H=129, T=23, B=19)
    check_training(cupy, engine.preset(name).cell, seed=10, layers=1, I=64, H=512, T=6, B=64)   # split K


@pytest.mark.parametrize("wavefront", [True, False], ids=["wavefront", "layers"])
@pytest.mark.parametrize("name", ["lstm", "gru_cho", "qrnn_f"])
def test_the_wavefronts_with_lengths(cupy, name, wavefront, monkeypatch):
    monkeypatch.setattr(fused_program, "WAVEFRONT_CHUNK", 3)
    check_training(cupy, engine.preset(name).cell, seed=13, wavefront=wavefront, layers=3, T=10, B=6)


@pytest.mark.parametrize("B", [1, 2, 6])
@pytest.mark.parametrize("name", ["lstm", "gru", "gru_cho", "lstm_proj"])
def test_persistent_training_launches_with_lengths(cupy, name, B, monkeypatch):
    monkeypatch.setattr(persistent, "PERSISTENT", True)
    cell = engine.preset(name).cell
    program = check_training(cupy, cell, seed=B, layers=2, I=8, H=12, T=7, B=B, P=8 if cell.uses_projection else None)
    assert program.persistent is not None and all(pair is not None and all(pair) for pair in program.persistent), \
        "a layer or a direction did not run persistent"


def test_a_program_replays_its_graphs_with_each_records_lengths(cupy):
    """The forward and backward are CUDA graphs captured once; each record copies its own lengths into the program
    before replaying them."""
    cell = engine.preset("lstm").cell
    network, params, x, initial, d_out, d_final = case(cell, seed=1, layers=2, T=9, B=5)
    for k in range(3):
        lengths = draw_lengths(9, 5, seed=30 + k)
        want = bptt(network, params, x, initial, d_out, d_final, lengths=lengths)
        got = bptt(network, params, cupy.asarray(x, dtype=cupy.float32),
                   {s: cupy.asarray(v, dtype=cupy.float32) for s, v in initial.items()},
                   cupy.asarray(d_out, dtype=cupy.float32),
                   {s: cupy.asarray(v, dtype=cupy.float32) for s, v in d_final.items()}, dtype=np.float32,
                   backend="fused", lengths=lengths)
        assert_equal_reference(got, want, network)
    tape = engine.autodiff.record(network, params, cupy.asarray(x, dtype=cupy.float32), dtype=np.float32,
                                  backend="fused", lengths=lengths)
    first = tape.program
    assert first.graphs and first.capture_error is None and first.lengths is not None
    tape.backward(None)
    plain = engine.autodiff.record(network, params, cupy.asarray(x, dtype=cupy.float32), dtype=np.float32,
                                   backend="fused")
    assert plain.program is not first and plain.program.lengths is None        # the plan without lengths
    plain.backward(None)


@pytest.mark.parametrize("name,module", [("lstm", "LSTM"), ("gru", "GRU")])
def test_cell_rnn_float32_on_cuda_takes_a_packed_sequence(cupy, name, module):
    """CellRNN on CUDA fp32 tensors with a PackedSequence runs the fused training step (no fallback), and gives what
    the same module in float64 on the CPU gives (the reference, equal to nn.LSTM / nn.GRU: tests/test_lengths.py)."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from engine.torch_module import CellRNN
    rnn_utils = torch.nn.utils.rnn
    rnn = CellRNN(engine.preset(name).cell, 5, 6, 2, seed=4).cuda()
    ref = copy.deepcopy(rnn).double().cpu()
    lengths = [4, 7, 1, 5]
    padded = torch.randn(7, 4, 5, dtype=torch.float64)
    x = padded.float().cuda().requires_grad_()
    x_ref = padded.clone().requires_grad_()
    out, states = rnn(rnn_utils.pack_padded_sequence(x, lengths, enforce_sorted=False))
    out_ref, states_ref = ref(rnn_utils.pack_padded_sequence(x_ref, lengths, enforce_sorted=False))
    assert rnn.last_backend == "fused" and isinstance(out, rnn_utils.PackedSequence)
    assert relative(out.data.detach().cpu().numpy(), out_ref.data.detach().numpy()) < TOL
    for s in states_ref:
        assert relative(states[s].detach().cpu().numpy(), states_ref[s].detach().numpy()) < TOL, s
    weights = torch.randn(out_ref.data.shape, dtype=torch.float64)
    (out.data * weights.float().cuda()).sum().add(states["h"].square().sum()).backward()
    (out_ref.data * weights).sum().add(states_ref["h"].square().sum()).backward()
    assert relative(x.grad.cpu().numpy(), x_ref.grad.numpy()) < TOL
    for (p, tensor), (_, tensor_ref) in zip(rnn.named_parameters(), ref.named_parameters()):
        assert relative(tensor.grad.cpu().numpy(), tensor_ref.grad.numpy()) < TOL, p
