"""The fused training step's plan and CUDA (engine/autodiff/fused_plan.py, fused_codegen.py), on the CPU: what runs
where for the known cells, every preset, unusual and random cell planned (or refused by name), and the generated
kernels compiled by nvcc. tests/gpu/test_fused_training_gpu.py runs them against the NumPy reference."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from gradient_errors import gradient_errors
from hypothesis import HealthCheck, given, settings
from nvcc_check import CHECK_ONLY
from test_autodiff import UNUSUAL
from test_fuzz_cells import cell_designs

import engine
from engine.autodiff import bptt
from engine.autodiff.errors import AutodiffError
from engine.autodiff.fused_codegen import render_module
from engine.autodiff.fused_describe import describe
from engine.autodiff.fused_planner import training_plan
from engine.dense import dense_form
from engine.errors import BackendError

PRESETS = sorted(engine.presets())


def launches(step) -> list[str]:
    return [f"{kind} {item.name}" for kind, item in step.order]


def test_the_lstm_step_is_one_gemm_and_one_kernel_each_way():
    plan = training_plan(engine.preset("lstm").cell)
    assert [g.members for g in plan.forward.hoisted] == [("W_ii_x", "W_if_x", "W_ig_x", "W_io_x")]
    assert launches(plan.forward) == ["gemm lstm_fwd_h_s0", "kernel lstm_fwd_s0_H"]
    assert launches(plan.backward) == ["kernel lstm_bwd_s0_H", "gemm lstm_bwd_h_s0"]
    gemm = plan.backward.order[1][1]
    assert gemm.weights == ("W_ho", "W_hg", "W_hf", "W_hi") and not gemm.accumulate   # d_h is the GEMM alone
    assert gemm.out.buffer == "dstate_h"
    kernel = plan.backward.order[0][1]
    stored = {(v, p.buffer) for v, p in kernel.stores}
    # the four gate deltas go side by side into the GEMM's dy (the after part reads them there), and into the input
    # GEMM's (ordered as x's matmuls); d_c to its state
    gates = ("d_o_pre", "d_g_pre", "d_f_pre", "d_i_pre")
    assert stored == {*((g, "dy_h_0") for g in gates), *((g, "dy_input") for g in gates), ("d_c", "dstate_c")}
    assert plan.input_gemm.weights == ("W_io", "W_ig", "W_if", "W_ii") and plan.input_gemm.out.buffer == "d_in"
    assert {n.name for n in plan.after_layers} - {n.name for n in plan.after_rest} == {
        "d_x", "d_x_from_W_io_x", "d_x_from_W_ig_x", "d_x_from_W_if_x", "d_x_from_W_ii_x"}
    # every parameter's gradient over all steps in 4 GEMMs a layer, reading the gate deltas where they lie side by
    # side: W_h* (dy^T h), W_i* (dy^T x), b_h* and b_i* (ones^T dy); nothing is left to the interpreter
    assert plan.after_rest == ()
    assert {(g.operand.buffer if g.operand else None, g.params, g.dy.buffer) for g in plan.grad_gemms} == {
        ("state_h", ("W_ho", "W_hg", "W_hf", "W_hi"), "dy_h_0"), ("x", ("W_io", "W_ig", "W_if", "W_ii"), "dy_h_0"),
        (None, ("b_ho", "b_hg", "b_hf", "b_hi"), "dy_h_0"), (None, ("b_io", "b_ig", "b_if", "b_ii"), "dy_h_0")}
    # the forward saves what the backward reads: the gates, tanh(c) and the states (in the state buffers)
    forward_stores = {v for v, _ in plan.forward.order[1][1].stores}
    assert forward_stores == {"i", "f", "g", "o", "h_next_tanh", "c_next", "h_next"}


def test_the_gru_adds_its_elementwise_term_in_the_gemm():
    """d_h = z * d_h_next + W^T dy: the kernel writes the first term where d_h goes, the GEMM adds (beta = 1)."""
    plan = training_plan(engine.preset("gru").cell)
    assert len(plan.backward.order) == 2
    gemm = plan.backward.order[1][1]
    assert gemm.accumulate and gemm.out.buffer == "dstate_h"
    kernel = plan.backward.order[0][1]
    assert ("d_h__part", gemm.out) in kernel.stores


def test_two_stage_cells_have_a_stage_per_inner_matmul():
    plan = training_plan(engine.preset("gru_cho").cell)
    assert [kind for kind, _ in plan.forward.order] == ["gemm", "kernel", "gemm", "kernel"]
    assert plan.launches_per_step == (4, 4)
    text = describe(plan)
    assert "fused training step of cell 'gru_cho': 4 launches forward, 4 backward a step" in text
    assert "GEMM gru_cho_fwd_r_h_mul_s1: U_n_r_h_mul" in text
    # h's adjoint takes U_z^T dz (ready at stage 0) and U_r^T dr (stage 1): one GEMM at stage 1 adds both to the
    # elementwise terms the stage-1 kernel wrote
    assert "GEMM gru_cho_bwd_h_s1: d_h_from_U_z_h, d_h_from_U_r_h (+=)" in text


def _nvcc(sources: dict[str, str], tmp_path) -> None:
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    source = tmp_path / "training.cu"
    source.write_text("\n".join(sources.values()))
    job = subprocess.run(["nvcc", "-arch=sm_90", *CHECK_ONLY, "--ptx", "-o", str(tmp_path / "training.ptx"), "-Werror",
                          "all-warnings", str(source)], capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, f"nvcc failed on the training kernels:\n{(job.stdout + job.stderr)[-4000:]}"


@pytest.mark.nvcc
def test_the_training_steps_hand_written_kernels_compile_with_nvcc(tmp_path):
    """kernels/all_finite.cu, copy_pieces.cu, splitk_reduce.cu, column_dots.cu, lay_out.cu and round_operands.cu,
    as the step loads them."""
    from engine.autodiff.cublas import SPLIT_REDUCE_FILE, round_operands_source
    from engine.autodiff.fused_runner import COLUMN_DOTS_FILE, COPY_FILE, LAY_OUT_FILE
    from engine.backends.common import ALL_FINITE_FILE
    _nvcc({path.name: path.read_text() for path in (ALL_FINITE_FILE, COPY_FILE, SPLIT_REDUCE_FILE,
                                                    COLUMN_DOTS_FILE, LAY_OUT_FILE)}
          | {"round_operands.cu": round_operands_source()}, tmp_path)


# The cells in a few translation units, one test each: one unit of every cell took nvcc (single-threaded) about
# 2 minutes on the 2-core CI machine, the longest test of the suite; in parts, xdist spreads them over its workers.
NVCC_PARTS = 3


@pytest.mark.nvcc
@pytest.mark.parametrize("part", range(NVCC_PARTS))
def test_every_preset_and_unusual_cell_plans_and_compiles_with_nvcc(part, tmp_path):
    cells = {**{n: engine.preset(n).cell for n in PRESETS}, **UNUSUAL}
    sources = {}
    for k, (name, cell) in enumerate(cells.items()):
        if k % NVCC_PARTS != part:
            continue
        plan = training_plan(cell)
        assert plan.forward.order or plan.forward.hoisted, name
        sources[name] = render_module(plan)
    assert sources
    _nvcc(sources, tmp_path)


@pytest.mark.nvcc
def test_the_fused_stages_tiled_gemm_compiles_with_nvcc(tmp_path):
    """The fused stages' tiled GEMM (FUSE_MAX_ROWS > 2), apart from the cells' units."""
    _nvcc({name: render_module(training_plan(engine.preset(name).cell), tiled=True)
           for name in ("lstm", "gru_cho", "lstm_proj", "lstm_fgr")}, tmp_path)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cell_designs())
def test_random_cells_plan_or_are_refused_by_name(design):
    cell = engine.from_dict(design)
    try:
        plan = training_plan(cell)
    except AutodiffError as e:
        assert e.node and "backend='naive'" in str(e)
        assert "this is a bug" not in str(e), e          # a refusal, not the planner's own error
        return
    source = render_module(plan)
    for kernel in plan.forward.kernels + plan.backward.kernels:
        assert f'extern "C" __global__ void {kernel.name}(' in source
    read = {p.buffer for k in plan.backward.kernels for _, p in k.loads if p.kind == "row"}
    assert read <= {b.name for b in plan.buffers}


def test_the_fused_backend_is_float32_and_says_so():
    network = engine.Network(engine.preset("lstm").cell, 3, 4, 1)
    params = engine.init_params(network, seed=0)
    x = np.zeros((2, 1, 3))
    with pytest.raises(BackendError, match=r"backend='fused'\) runs in float32, got dtype=float64"):
        bptt(network, params, x, dtype=np.float64, backend="fused")
    with pytest.raises(BackendError, match="must be one of reference, naive, fused"):
        bptt(network, params, x, backend="fast")


# ---- the plan run by NumPy (engine/autodiff/fused_numpy.py) against the float64 reference ---------------------

def run_plan_on_numpy(cell, seed, layers=2, I=4, H=5, T=5, B=3, P=None, plan=None, wavefront=None):
    """Relative errors of every gradient of the plan run by NumPy (buffers poisoned) against float64 bptt."""
    from engine.autodiff import fused_tape
    from engine.autodiff.fused_numpy import NumpyRunner
    H = cell.fit_size(H)                   # a cell of heads takes the next multiple of its heads
    if cell.input_is_hidden:
        I = H
    network = engine.Network(cell, I, H, layers, proj_size=P)
    params = engine.init_params(network, seed=seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, B, I))
    initial = {s: rng.uniform(-0.8, 0.8, (layers, B, network.state_size(s))) for s in cell.state_names}
    d_out = rng.standard_normal((T, B, network.output_size))
    d_final = {s: rng.standard_normal((layers, B, network.state_size(s))) for s in cell.state_names}
    want = bptt(network, params, x, initial, d_out, d_final)
    tape = fused_tape.record(network, params, x.astype(np.float32), initial, poison=True,
                        runner=NumpyRunner(plan or training_plan(cell)), wavefront=wavefront)
    got = tape.backward(d_out.astype(np.float32), d_final)
    return gradient_errors(got, want, cell.state_names, layers, finals=True, floor=FLOOR)


TOL = 2e-4


def assert_close(errors: dict) -> None:
    """Every error under TOL (a NaN is not: `not nan < TOL`)."""
    bad = {k: v for k, v in errors.items() if not v < TOL}
    assert not bad, bad
# Values whose RMS is under FLOOR are compared absolutely (to TOL * FLOOR = 2e-6): a cell such as s - tanh(s)
# cancels its O(1) terms down to 1e-11, where fp32's rounding of the terms is all that is left of the value.
FLOOR = 1e-2


@pytest.mark.parametrize("wavefront", [True, False], ids=["wavefront", "layers"])
@pytest.mark.parametrize("name", PRESETS)
def test_every_presets_plan_run_by_numpy_equals_the_reference(name, wavefront):
    cell = engine.preset(name).cell
    errors = run_plan_on_numpy(cell, seed=len(name), P=3 if cell.uses_projection else None, wavefront=wavefront)
    bad = {k: v for k, v in errors.items() if not v < TOL}
    assert not bad, bad


@pytest.mark.parametrize("name", sorted(UNUSUAL))
def test_unusual_cells_plan_run_by_numpy_equals_the_reference(name):
    errors = run_plan_on_numpy(UNUSUAL[name], seed=2, layers=3)
    bad = {k: v for k, v in errors.items() if not v < TOL}
    assert not bad, bad


@pytest.mark.parametrize("sizes", [dict(I=2, H=3, T=3, B=2), dict(I=8, H=8, T=4, B=1)], ids=["plain", "fused"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(design=cell_designs())
def test_random_cells_plan_run_by_numpy_equals_the_reference(design, sizes):
    """At H = 3 every launch is plain; at H = 8 and B = 1 the adjacent GEMM and kernel pairs run as fused launches
    (engine/autodiff/stage_fusion.py), in their order across steps."""
    cell = engine.from_dict(design)
    try:
        training_plan(cell)
    except AutodiffError:
        return                     # refused by name: test_random_cells_plan_or_are_refused_by_name
    errors = run_plan_on_numpy(cell, seed=5, P=4 if cell.uses_projection and sizes["H"] == 8 else None, **sizes)
    bad = {k: v for k, v in errors.items() if not v < TOL}
    assert not bad, bad


def test_a_wrong_plan_is_caught():
    """The comparison can fail: the GRU's GEMM told to overwrite its output instead of adding to the elementwise term
    the kernel wrote there."""
    import dataclasses
    cell = engine.preset("gru").cell
    plan = training_plan(cell)
    (k_kind, kernel), (g_kind, gemm) = plan.backward.order
    wrong = dataclasses.replace(plan, backward=dataclasses.replace(
        plan.backward, order=((k_kind, kernel), (g_kind, dataclasses.replace(gemm, accumulate=False)))))
    assert_close(run_plan_on_numpy(cell, seed=1))
    errors = run_plan_on_numpy(cell, seed=1, plan=wrong)
    assert errors["x"] > 1e-2 and errors["layer 0 W_hr"] > 1e-2


def test_split_k_fills_the_gpu_only_where_the_output_is_small():
    from engine.autodiff.cublas import split_k
    assert split_k(64, 512, 2048, 132) == 8        # the LSTM's backward GEMM at mid: 4 output tiles, K = 4H
    assert split_k(64, 2048, 512, 132) == 8        # its forward GEMM: 16 tiles, each part 64 deep
    assert split_k(6400, 2048, 512, 132) == 1      # a hoisted GEMM over every step fills the GPU by itself
    assert split_k(64, 5, 20, 132) == 1            # too shallow to split
    assert split_k(64, 512, 400, 132) == 4         # 8 parts would be 50 deep
    assert split_k(64, 512, 1002, 132) == 2        # a divisor of K
    assert split_k(1, 2048, 512, 132) == 1         # B = 1: a GEMV, not short of blocks


def small_numpy_case(name: str, steps: int = 5):
    """A 2-layer network of preset `name` (I = 3, H = 4), seeded parameters, the NumPy runner of its plan and a
    (steps, 2, 3) float32 input: what the fused step's program and tape tests run."""
    from engine.autodiff.fused_numpy import NumpyRunner
    cell = engine.preset(name).cell
    network = engine.Network(cell, 3, 4, 2)
    x = np.random.default_rng(0).standard_normal((steps, 2, 3)).astype(np.float32)
    return cell, network, engine.init_params(network, seed=0), NumpyRunner(training_plan(cell)), x


def test_programs_serve_one_live_tape_each_and_are_reused_and_dropped():
    """Two tapes alive at once get their own buffers; a finished or dropped tape frees its program for the next
    record; idle programs beyond CACHE_BYTES go, oldest first; outputs are copies the next step leaves alone."""
    import gc

    from engine.autodiff import fused_cache, fused_tape
    cell, network, params, runner, x = small_numpy_case("gru")
    fused_cache.clear_cache()
    first = fused_tape.record(network, params, x, None, runner=runner)
    second = fused_tape.record(network, params, 2 * x, None, runner=runner)
    assert first.program is not second.program and first.program.busy and second.program.busy
    outputs = first.outputs.copy()
    want = bptt(network, params, x.astype(np.float64), d_outputs=np.ones((5, 2, 4)))
    got = first.backward(np.ones((5, 2, 4), dtype=np.float32))
    assert np.abs(got.x - want.x).max() < 1e-5 and not first.program.busy
    third = fused_tape.record(network, params, 3 * x, None, runner=runner)
    assert third.program is first.program                      # reused once released
    assert np.array_equal(first.outputs, outputs)               # the earlier tape's outputs are its own
    program = second.program
    del second
    gc.collect()
    assert not program.busy                                     # a dropped tape releases its program
    assert fused_cache.cached_bytes() == 2 * program.bytes > 0
    saved = fused_cache.CACHE_BYTES
    try:
        fused_cache.CACHE_BYTES = program.bytes                       # room for one: the idle one goes
        other = engine.Network(cell, 3, 4, 1)
        fourth = fused_tape.record(other, engine.init_params(other, seed=1), x, None, runner=runner)
        assert fused_cache.cached_bytes() == third.program.bytes + fourth.program.bytes       # both busy: both stay
    finally:
        fused_cache.CACHE_BYTES = saved
    fused_cache.clear_cache()
    assert fused_cache.cached_bytes() == third.program.bytes + fourth.program.bytes
    third.backward(None)
    fourth.backward(None)
    fused_cache.clear_cache()
    assert fused_cache.cached_bytes() == 0


def test_a_gemm_term_the_after_part_reads_is_not_absorbed_into_a_sum():
    """v3 = s0 + W x feeds one matmul, so d_v3 = U^T dy is a GEMM's output, a term of d_s0 (the add passes it
    through) and read by the after part (W's gradient, x's adjoint): the GEMM writes d_v3 itself, not d_s0.
    (Found by the random cells; absorbing it lost d_v3.)"""
    nodes = [{"name": "x", "op": "input"}, {"name": "s0", "op": "state"}, {"name": "s1", "op": "state"},
             {"name": "W1", "op": "weight", "attrs": {"rows": "H", "cols": "I"}},
             {"name": "Wx2", "op": "matmul", "args": ["W1", "x"]}, {"name": "v3", "op": "add", "args": ["s0", "Wx2"]},
             {"name": "U4", "op": "weight", "attrs": {"rows": "H", "cols": "H"}},
             {"name": "Uv5", "op": "matmul", "args": ["U4", "v3"]}, {"name": "v6", "op": "add", "args": ["s0", "s0"]},
             {"name": "s0_next", "op": "tanh", "args": ["v6"]}, {"name": "s1_next", "op": "tanh", "args": ["Uv5"]}]
    passthrough = engine.from_dict({"schema": "rnn-cell-graph", "version": 1, "name": "passthrough", "doc": "",
                                    "output": "s0", "nodes": nodes, "states": [{"name": "s0", "next": "s0_next"},
                                                                               {"name": "s1", "next": "s1_next"}]})
    plan = training_plan(passthrough)
    assert not any(g.accumulate for g in plan.backward.gemms)
    errors = run_plan_on_numpy(passthrough, seed=4)
    assert_close(errors)


def test_the_wavefront_order_waits_for_the_layer_below_and_the_chunk_before():
    from engine.autodiff.wavefront import wavefront_order
    order = wavefront_order(3, 4)
    assert sorted(order) == [(l, c) for l in range(3) for c in range(4)]
    position = {pair: i for i, pair in enumerate(order)}
    for l, c in order:
        assert l == 0 or position[(l - 1, c)] < position[(l, c)]
        assert c == 0 or position[(l, c - 1)] < position[(l, c)]
    assert order[:4] == [(0, 0), (0, 1), (1, 0), (0, 2)]
    from engine.autodiff.wavefront import backward_wavefront, forward_wavefront
    for items, first in ((forward_wavefront(3, 4), (0, 0)), (backward_wavefront(3, 4), (2, 3))):
        issued = [(l, c) for l, c, _ in items]
        assert sorted(issued) == sorted(order) and issued[0] == first
        for i, (_, _, waits_for) in enumerate(items):
            assert waits_for is None or issued.index(waits_for) < i
    assert backward_wavefront(3, 4)[:3] == [(2, 3, None), (2, 2, None), (1, 3, (2, 3))]


def test_the_wavefront_is_cut_into_pieces_of_whole_diagonals():
    """diagonal_pieces: 1, 2, 4, ... diagonals a piece, in order, every item once; nothing waits for a later piece."""
    from engine.autodiff.wavefront import backward_wavefront, diagonal_pieces, forward_wavefront, wavefront_order
    for layers, chunks in [(4, 13), (1, 5), (3, 1), (2, 2)]:
        for order in (forward_wavefront, backward_wavefront):
            items = order(layers, chunks)
            pieces = diagonal_pieces(items, layers, chunks)
            assert [item for piece in pieces for item in piece] == items
            diagonal_of = {(l, c): d for d, (l, c) in
                           zip([l + c for l, c in wavefront_order(layers, chunks)], [i[:2] for i in items])}
            for k, piece in enumerate(pieces):
                assert {diagonal_of[item[:2]] for item in piece} == set(range(2 ** k - 1, min(2 ** (k + 1) - 1,
                                                                                          layers + chunks - 1)))
                earlier = {item[:2] for p in pieces[:k] for item in p}
                for i, (_, _, waits_for) in enumerate(piece):
                    assert waits_for is None or waits_for in earlier or waits_for in [p[:2] for p in piece[:i]]
    assert [len(p) for p in diagonal_pieces(forward_wavefront(4, 13), 4, 13)] == [1, 5, 16, 29, 1]


@pytest.mark.parametrize("name", ["lstm", "gru_cho", "lstm_proj", "indrnn", "mgu"])
def test_the_wavefronts_run_by_numpy_equal_the_reference(name, monkeypatch):
    """The layers' forward in the wavefront's issue order (chunks of 2 steps, the input GEMM a chunk at a time) and
    their backward in the reverse wavefront's (the top layer first, each chunk's input adjoint into the layer below
    before that layer takes the chunk), on poisoned buffers: the same gradients as layer by layer."""
    from engine.autodiff import fused_program, fused_tape
    monkeypatch.setattr(fused_tape, "WAVEFRONT", True)
    monkeypatch.setattr(fused_program, "WAVEFRONT_CHUNK", 2)
    cell = engine.preset(name).cell
    errors = run_plan_on_numpy(cell, seed=7, layers=3, T=7, P=3 if cell.uses_projection else None)
    assert_close(errors)


def test_a_cell_without_an_input_gemm_keeps_the_layer_by_layer_backward(monkeypatch):
    """x met elementwise (x + h): the input's adjoint is not a GEMM, so the backward runs layer by layer (the forward
    still as a wavefront); the gradients are the same."""
    from engine.autodiff import fused_program, fused_tape
    monkeypatch.setattr(fused_tape, "WAVEFRONT", True)
    monkeypatch.setattr(fused_program, "WAVEFRONT_CHUNK", 2)
    cell = UNUSUAL["residual_gate"]
    assert training_plan(cell).input_gemm is None
    errors = run_plan_on_numpy(cell, seed=3, layers=3, T=5)
    assert_close(errors)


@pytest.mark.parametrize("name", ["lstm", "slstm", "gru"])
@pytest.mark.parametrize("layers", [1, 2])
def test_layer_by_layer_the_input_adjoint_is_the_programs_gemm(name, layers, monkeypatch):
    """A one-layer network (no wavefront) and layers run one after another: each layer's backward ends with its
    input's adjoint as one GEMM over the T x B rows into the layer below's d_out, as the wavefront does, so nothing is
    left to the interpreter (it ran the sLSTM's four W^T dy and their sum in strict fp32, 0.84 ms at H = 512)."""
    from engine.autodiff import fused_program, fused_tape
    monkeypatch.setattr(fused_tape, "WAVEFRONT", False)
    cell = engine.preset(name).cell
    plan = training_plan(dense_form(cell).cell)
    assert plan.input_gemm is not None and plan.after_rest == ()
    calls = []
    original = fused_program.Program.backward

    def backward(self):
        calls.append(self.d_input is not None)
        original(self)
    monkeypatch.setattr(fused_program.Program, "backward", backward)
    assert_close(run_plan_on_numpy(cell, seed=11, layers=layers, T=6))
    assert calls == [True]


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cell_designs())
def test_random_cells_through_the_wavefronts_and_layer_by_layer_equal_the_reference(monkeypatch, design):
    from engine.autodiff import fused_program
    monkeypatch.setattr(fused_program, "WAVEFRONT_CHUNK", 2)
    cell = engine.from_dict(design)
    try:
        training_plan(cell)
    except AutodiffError:
        return                     # refused by name: test_random_cells_plan_or_are_refused_by_name
    for wavefront in (True, False):
        assert_close(run_plan_on_numpy(cell, seed=5, layers=3, I=2, H=3, T=5, B=2, wavefront=wavefront))


def test_a_sum_whose_elementwise_term_comes_later_moves_its_gemm_there():
    """s0's adjoint: U4^T and U8^T terms (ready at stage 0) plus -(U6^T dy) through the neg (stage 1). Once refused
    ("not summed in one node"; a fuzzed cell found it), now the GEMM of s0 runs at stage 1, adding to that term."""
    H = {"rows": "H", "cols": "H"}
    nodes = [{"name": "x", "op": "input"}, {"name": "s0", "op": "state"}, {"name": "s1", "op": "state"},
             {"name": "s2", "op": "state"}, {"name": "W1", "op": "weight", "attrs": {"rows": "H", "cols": "I"}},
             {"name": "Wx2", "op": "matmul", "args": ["W1", "x"]}, {"name": "u3", "op": "neg", "args": ["s0"]},
             {"name": "U4", "op": "weight", "attrs": H}, {"name": "Uv5", "op": "matmul", "args": ["U4", "s0"]},
             {"name": "U6", "op": "weight", "attrs": H}, {"name": "Uv7", "op": "matmul", "args": ["U6", "u3"]},
             {"name": "U8", "op": "weight", "attrs": H}, {"name": "Uv9", "op": "matmul", "args": ["U8", "s0"]},
             {"name": "s0_next", "op": "tanh", "args": ["Uv5"]}, {"name": "s1_next", "op": "tanh", "args": ["Uv7"]},
             {"name": "s2_next", "op": "tanh", "args": ["Uv9"]}]
    cell = engine.from_dict({"schema": "rnn-cell-graph", "version": 1, "name": "late_term", "doc": "", "output": "s0",
                             "nodes": nodes, "states": [{"name": f"s{k}", "next": f"s{k}_next"} for k in range(3)]})
    plan = training_plan(cell)
    gemm = next(g for g in plan.backward.gemms if g.name.endswith("_bwd_s0_s1"))
    assert gemm.accumulate
    for wavefront in (True, False):
        assert_close(run_plan_on_numpy(cell, seed=5, layers=2, wavefront=wavefront))


def test_a_bad_value_found_once_the_work_is_queued_is_named_and_nothing_is_lost():
    """The fused step asks its finiteness checks after queuing the work: a NaN in x is named and the program is
    free again; a tape given a NaN d_outputs names it and then takes a corrected one (the forward's values are
    intact), with the reference's gradients."""
    from engine.autodiff import fused_cache, fused_tape
    from engine.backends.common import FiniteCheck, inputs_named
    from engine.errors import BackendError
    _, network, params, runner, x = small_numpy_case("lstm")
    fused_cache.clear_cache()
    bad_x = x.copy()
    bad_x[1, 0, 2] = np.nan
    with pytest.raises(BackendError, match=r"^x has 1 NaN or Inf value\(s\), the first at index \(1, 0, 2\)"):
        fused_tape.record(network, params, bad_x, None, runner=runner,
                     finite=FiniteCheck(inputs_named(network, params, bad_x, None)))
    tape = fused_tape.record(network, params, x, None, runner=runner,
                        finite=FiniteCheck(inputs_named(network, params, x, None)))
    pools = fused_cache._programs
    assert len(pools) == 1 and len(next(iter(pools.values()))) == 1    # the first was freed
    d_out = np.random.default_rng(1).standard_normal((5, 2, 4))
    bad_d = d_out.astype(np.float32)
    bad_d[4, 1, 3] = np.inf
    with pytest.raises(BackendError, match=r"argument 'd_outputs' has 1 NaN or Inf value\(s\), the first at index "
                                           r"\(4, 1, 3\)"):
        tape.backward(bad_d)
    assert tape.program.busy and not tape.used
    got = tape.backward(d_out.astype(np.float32))
    want = bptt(network, params, x.astype(np.float64), d_outputs=d_out)
    assert np.abs(got.x - want.x).max() < 1e-5 and not tape.program.busy
    for l in range(2):
        for p, value in want.params[l].items():
            assert np.abs(got.params[l][p] - value).max() < 1e-4, (l, p)
    fused_cache.clear_cache()


@pytest.mark.parametrize("name", ["lstm", "gru", "peephole_lstm"])
def test_the_gradients_come_in_the_cells_parameter_order(name):
    """The gradient buffer is laid out for the gradient GEMMs, but each layer's dict keeps the cell's parameter
    order, as every backend's does (CellRNN hands them to torch by position)."""
    from engine.autodiff import fused_tape
    cell, network, params, runner, x = small_numpy_case(name, steps=4)
    got = fused_tape.record(network, params, x, None, runner=runner).backward(np.ones((4, 2, 4), dtype=np.float32))
    want = bptt(network, params, x.astype(np.float64), d_outputs=np.ones((4, 2, 4)))
    for l in range(2):
        assert list(got.params[l]) == [p.name for p in cell.params] == list(want.params[l])


def test_a_cells_hash_is_cached_but_not_pickled():
    """The cell keys the training step's caches: its hash is computed once, equals an equal cell's, and is not
    carried through pickle (another process hashes strings differently)."""
    import pickle
    cell = engine.preset("gru").cell
    assert hash(cell) == hash(engine.preset("gru").cell) and cell.__dict__["_hash"] == hash(cell)
    copied = pickle.loads(pickle.dumps(cell))
    assert "_hash" not in copied.__dict__ and copied == cell and hash(copied) == hash(cell)


@pytest.mark.parametrize("name", ["peephole_lstm", "vanilla_lstm", "lstm_nig", "lstm_fgr"])
def test_peephole_gradients_are_one_column_dots_launch_and_nothing_is_left_to_the_interpreter(name):
    """A peephole's gradient is sum_rows(dy * c): the after part's mul and batch_sum become a ColumnDot of the plan,
    all of a layer's in one launch (kernels/column_dots.cu), and the wavefront's after part has nothing left."""
    cell = engine.preset(name).cell
    plan = training_plan(cell)
    peepholes = {p.name for p in cell.params if p.name.startswith("p_")}
    assert peepholes and {d.param for d in plan.column_dots} == peepholes
    assert plan.after_rest == ()
    dots_nodes = {n for d in plan.column_dots for n in d.nodes}
    assert not dots_nodes & {n.name for n in plan.after_layers}
    assert "column_dots launch over every step" in describe(plan)
    assert_close(run_plan_on_numpy(cell, seed=11, layers=2, H=6, I=5, T=4))
