"""The fused backend in a precision mode (engine/schedules/fused_modes.py), on the CPU.

Its Executor runs here with a NumPy device whose GEMMs round as the reference emulates the mode: the same plan,
packed weights, buffers and order as on the GPU, so the host logic (which weights are rounded, which stay strict,
where the projections' bias goes) is held to the reference in float64, every preset, every mode. The GPU suite then
holds cuBLAS and the kernels to the same emulation (tests/gpu/test_fused_modes_gpu.py).
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from nvcc_check import compile_sources

import engine
from engine.backends import reference
from engine.codegen.cuda import render_kernel
from engine.codegen.operand_copies import copied_buffers, operand_copies, render_copies_module
from engine.codegen.precision import precision as lookup_precision
from engine.codegen.programmatic import programmatic_waits
from engine.compiler import make_plan
from engine.dense import dense
from engine.errors import BackendError
from engine.schedules import fused_modes
from engine.schedules.autotune import candidates
from engine.schedules.cublaslt import alignment
from engine.schedules.fused_modes import ModeExecutor, ahead_steps, check_fused_mode, fixed_gemms
from engine.schedules.mode_device import NumpyModeDevice, X3RangeError
from engine.schedules.split_products import Left
from engine.schedules.tiling import H100

MODES = ("tf32", "float16", "bfloat16", "float32x3")
SIZES = {"input_size": 7, "hidden_size": 12, "batch": 3, "steps": 5}


def case(name: str, layers: int = 2, seed: int = 1):
    cell = engine.preset(name).cell
    hidden = cell.fit_size(SIZES["hidden_size"])
    network = engine.Network(cell, SIZES["input_size"], hidden, layers)
    params = engine.init_params(network, seed=seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((SIZES["steps"], SIZES["batch"], SIZES["input_size"]))
    states = {n: rng.uniform(-0.8, 0.8, (layers, SIZES["batch"], hidden)) for n in cell.state_names}
    return network, params, x, states


def run_modes(network, params, x, states, precision, lengths=None, x3_chunk=5, x3_parts="tf32"):
    """x3_chunk: float32x3's K of one accumulator, small here so that K (7, 12) runs in chunks and a rest."""
    dense_network, dense_params = dense(network, params)
    T, B, _ = x.shape
    plan = make_plan(dense_network, T, B, lengths=lengths is not None)
    device = NumpyModeDevice(np.float64, precision, x3_chunk, x3_parts)
    return ModeExecutor(plan, device).run(dense_params, device.asarray(x), states, poison=True, lengths=lengths)


def relative(got, want) -> float:
    return float(np.linalg.norm(np.asarray(got) - want) / max(np.linalg.norm(want), 1e-30))


@pytest.mark.parametrize("precision", MODES)
@pytest.mark.parametrize("name", sorted(engine.presets()))
def test_the_host_logic_is_the_modes_emulation(name, precision):
    network, params, x, states = case(name)
    outputs, final = run_modes(network, params, x, states, precision)
    emulated = reference.run(network, params, x, states, precision=precision)
    strict = reference.run(network, params, x, states)
    assert relative(outputs, emulated.outputs) < 1e-12, name
    for state, value in emulated.final_states.items():
        assert relative(final[state], value) < 1e-12, (name, state)
    if precision == "float32x3":           # the split parts' products: fp32's accuracy, yet not strict fp32's values
        assert 1e-12 < relative(outputs, strict.outputs) < 1e-6, name
    else:
        assert relative(outputs, strict.outputs) > 1e-6, f"{name}: nothing was rounded in {precision}"


@pytest.mark.parametrize("name", ["lstm", "gru_cho", "ln_lstm", "lstm_proj"])
def test_fp16_parts_are_the_emulation_and_refuse_weights_past_their_range(name):
    """float32x3 with its step products' parts held as fp16 (x3_parts="fp16"): the step GEMMs take them, the projections
    and a reduction's fixed matrices do not, and the run is the float32x3 emulation's to fp32's level; a weight past
    65504 is refused by name (X3RangeError: the program then runs in TF32 parts)."""
    network, params, x, states = case(name)
    outputs, _ = run_modes(network, params, x, states, "float32x3", x3_parts="fp16")
    emulated = reference.run(network, params, x, states, precision="float32x3")
    assert relative(outputs, emulated.outputs) < 1e-6, name
    dense_network, dense_params = dense(network, params)
    plan = make_plan(dense_network, 4, 3)
    executor = ModeExecutor(plan, NumpyModeDevice(np.float64, "float32x3", 5, "fp16"))
    fixed = fixed_gemms(plan.program, plan.program.cell)
    assert executor.parts == {g.name: "tf32" if fixed[g.name] else "fp16" for g in plan.program.gemms}
    step = next(g for g in plan.program.gemms if not g.hoisted and not fixed[g.name])
    names = {plan.program.cell[m].args[0] for t in step.terms for m in t.matmuls}     # every weight in its product
    for factor, says in ((1e6, "has values past fp16's range"), (1e-6, "is too small for fp16 parts")):
        scaled = [dict(layer) for layer in dense_params.layers]
        for name in names:
            scaled[0][name] = scaled[0][name] * factor
        with pytest.raises(X3RangeError, match=f"layer 0's weight of GEMM '{step.name}' {says} .*hint: "
                                               "x3_parts='tf32' holds"):
            executor.load(engine.Params(scaled))


@pytest.mark.parametrize("splitk", ["on", 1, None, 0])
def test_a_bad_split_k_flag_is_refused_by_name(splitk):
    network, params, _, _ = case("lstm")
    with pytest.raises(BackendError, match=r"argument 'x3_splitk' must be True, False or \"auto\", got .*; hint: "):
        fused_modes.FusedModeProgram(network, params, precision="float32x3", x3_splitk=splitk)


@pytest.mark.parametrize("parts", ["bf16", None, "FP16"])
def test_bad_x3_parts_are_refused_by_name(parts):
    network, params, _, _ = case("lstm")
    with pytest.raises(BackendError, match=r"argument 'x3_parts' must be one of tf32, fp16, got .*; hint: 'tf32' holds"):
        fused_modes.FusedModeProgram(network, params, precision="float32x3", x3_parts=parts)


def test_lengths_hold_each_rows_states():
    network, params, x, states = case("lstm")
    lengths = np.array([5, 2, 4])
    outputs, final = run_modes(network, params, x, states, "bfloat16", lengths=lengths)
    emulated = reference.run(network, params, x, states, precision="bfloat16", lengths=lengths)
    assert relative(outputs, emulated.outputs) < 1e-12
    assert relative(final["c"], emulated.final_states["c"]) < 1e-12
    assert not outputs[2:, 1].any(), "a row's outputs past its end are zero"


def test_a_reductions_fixed_matrix_stays_strict():
    def fixed(name):
        network, params, _, _ = case(name)
        program = make_plan(dense(network, params)[0], 4, 2).program
        return fixed_gemms(program, program.cell)
    layer_norm = fixed("ln_lstm")          # the mean's and variance's matrices strict, the learned weights rounded
    assert any(layer_norm.values()) and not all(layer_norm.values()), layer_norm
    assert not any(fixed("lstm").values())


def test_every_mode_runs_on_the_fused_backend():
    assert check_fused_mode("fp32x3") == "float32x3" and check_fused_mode("bf16") == "bfloat16"
    with pytest.raises(BackendError, match="argument 'precision' is 'fp64'; hint: "):
        check_fused_mode("fp64")


@pytest.mark.parametrize("chunk", [0, -4, 2.5, "256", "Auto", True, np.float32(8)])
def test_a_bad_chunk_is_refused_by_name(chunk):
    network, params, _, _ = case("lstm")
    with pytest.raises(BackendError, match=r"argument 'x3_chunk' must be \"auto\", None or a positive integer, got "
                                           r".*; hint: \"auto\" \(the default\) sizes each product's chunks by its K"):
        fused_modes.FusedModeProgram(network, params, precision="float32x3", x3_chunk=chunk)
    assert fused_modes.check_x3_chunk(np.int64(128)) == 128 and type(fused_modes.check_x3_chunk(np.int64(8))) is int
    assert fused_modes.check_x3_chunk("auto") == "auto" and fused_modes.check_x3_chunk(None) is None


@pytest.mark.parametrize("options, flag", [({"x3_fold": "fold"}, "x3_fold"), ({"x3_fold": None}, "x3_fold"),
                                           ({"k_slices": 0}, "k_slices"), ({"k_slices": 1.5}, "k_slices")])
def test_bad_product_layouts_are_refused_by_name(options, flag):
    network, params, _, _ = case("lstm")
    with pytest.raises(BackendError, match=f"argument '{flag}"):
        fused_modes.FusedModeProgram(network, params, precision="bfloat16", **options)


def test_products_left_for_the_kernels_get_flat_buffers_of_their_size():
    network, params, _, _ = case("gru_cho")
    plan = make_plan(dense(network, params)[0], 4, 3)
    steps = {g.name: g for g in plan.program.gemms if not g.hoisted}
    left = {name: Left("planes", 2) for name in steps}
    executor = ModeExecutor(plan, NumpyModeDevice(np.float64, "bfloat16"), left=left)
    for buffers, layer in zip(executor._allocate(poison=True), range(plan.network.num_layers)):
        for gemm in steps.values():
            n = gemm.n(plan.layer_sizes(layer))
            assert buffers[gemm.out_buffer].shape == (2 * 3 * n,) and np.isnan(buffers[gemm.out_buffer]).all()


def test_float32x3s_extra_memory_is_counted():
    # one LSTM layer, I = 7, H = 12, T = 5, B = 3: the projection (48 x 7) and the step's product (48 x 12)
    network = engine.Network(engine.preset("lstm").cell, 7, 12, 1)
    plan = make_plan(network, 5, 3)
    assert [(g.hoisted, g.n(network.layer_sizes(0)), g.k(network.layer_sizes(0))) for g in plan.program.gemms] == [
        (True, 48, 7), (False, 48, 12)]
    weights = 48 * 7 + 48 * 12
    projection = 2 * 5 * 3 * 7                              # [x_hi; x_lo]
    # P: P1 (chunks, 2B, N) and P2 (B, N); the operand's two parts (2B, K)
    assert fused_modes.split_bytes(plan, None) == 4 * (weights + projection + (1 * 2 + 1) * 3 * 48 + 2 * 3 * 12)
    assert fused_modes.split_bytes(plan, 4) == 4 * (weights + projection + (3 * 2 + 1) * 3 * 48 + 2 * 3 * 12)
    # the wgmma product: no P; the step weight's and operand's fp16 parts padded to tiles of 64 (N 48 -> 64, K 12 ->
    # 64, B 3 -> 64), two halves a float
    assert fused_modes.split_bytes(plan, 4, tiles=True) == 4 * (48 * 7 + projection + 64 * 64 + 64 * 64)


def test_float32x3_products_are_the_split_parts_in_chunks_whatever_the_chunk():
    # the chunks change which products share a tensor-core accumulator (on the GPU), not what is multiplied
    network, params, x, states = case("lstm")
    emulated = reference.run(network, params, x, states, precision="float32x3")
    for chunk in (None, 3, 4, 256):
        outputs, _ = run_modes(network, params, x, states, "float32x3", x3_chunk=chunk)
        assert relative(outputs, emulated.outputs) < 1e-12, chunk


def test_the_autotuner_times_fused_in_the_reduced_modes():
    network = engine.Network(engine.preset("lstm").cell, 64, 1024, 2)
    for precision in MODES:
        tuned = candidates(network, 128, H100, precision)[0].schedule == "fused"
        assert tuned == (precision in fused_modes.TUNED_MODES), precision
    # a cell the wavefront schedules do not take (values of size P) now has a candidate in a mode
    lstmp = engine.Network(engine.preset("lstm_proj").cell, 16, 32, 1)
    assert [c.schedule for c in candidates(lstmp, 4, H100, "bfloat16")] == ["fused"]


def test_the_kernels_write_each_step_operand_rounded():
    # stores into a step GEMM's operand buffer get a copy in the mode's format; a fixed matrix's operand does not
    program = make_plan(dense(*case("gru_cho")[:2])[0], 4, 2).program
    copies = operand_copies(program, "bfloat16")
    assert copied_buffers(program, copies) == {"h_gemm_in", "r_h_mul_gemm_in"}
    source = render_copies_module(program, "bfloat16", copies, 1)
    assert "r_h_mul_gemm_in_mode[b * H + j] = rnn_bits16<RNN_BF16>(" in source
    assert "rnn_copy_split" not in source
    # float32x3: both TF32 parts, lo one buffer (B rows of the buffer's width) after hi
    split = render_copies_module(program, "float32x3", operand_copies(program, "float32x3"), 1)
    assert "rnn_copy_split(r_h_mul_gemm_in_mode, b * H + j, (long)B * H, " in split
    assert "copy[lo + i] = __uint_as_float(rnn_tf32_bits(v - hi));" in split
    layer_norm = make_plan(dense(*case("ln_lstm")[:2])[0], 4, 2).program
    exact = {name for name, fixed in fixed_gemms(layer_norm, layer_norm.cell).items() if fixed}
    written = copied_buffers(layer_norm, operand_copies(layer_norm, "tf32", exact))
    assert written and not {g.in_buffer for g in layer_norm.gemms if g.name in exact} & written


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (the generated CUDA is compiled there)")
def test_the_copies_modules_compile(tmp_path):
    sources = {}
    for name, precision, parts in (("lstm", "bfloat16", "tf32"), ("gru_cho", "float16", "tf32"),
                                   ("ln_lstm", "tf32", "tf32"), ("lstm_proj", "bfloat16", "tf32"),
                                   ("slstm", "tf32", "tf32"), ("gru_cho", "float32x3", "tf32"),
                                   ("ln_lstm", "float32x3", "tf32"), ("ln_lstm", "float32x3", "fp16"),
                                   ("lstm", "float32x3", "fp16")):
        network, params, _, _ = case(name)
        program = make_plan(dense(network, params)[0], 4, 2, lengths=name == "lstm").program
        exact = {g for g, fixed in fixed_gemms(program, program.cell).items() if fixed}
        sources[f"{name}_{precision}_{parts}"] = render_copies_module(
            program, precision, operand_copies(program, precision, exact, parts), 1, programmatic_waits(program),
            x3_parts=parts)
    compile_sources(sources, tmp_path)


def test_cublaslt_is_told_each_operands_alignment():
    # cublasLt's heuristic assumes 256-byte aligned matrices unless told; a chunk of a sequence starts anywhere
    assert [alignment(p) for p in (0x1000, 0x1010, 0x1004, 0x1008 + 0x40, 0)] == [256, 16, 4, 8, 256]


def test_each_kernel_gets_its_copies_after_its_own_arguments():
    program = make_plan(dense(*case("gru_cho")[:2])[0], 4, 2)
    copies = operand_copies(program.program, "bfloat16")
    executor = ModeExecutor(program, NumpyModeDevice(np.float64, "bfloat16"), copies)
    assert executor.copy_sources == {"gru_cho_stage1": [("r_h_mul_gemm_in", None)],
                                     "gru_cho_stage2": [("h_gemm_in", "next")]}


def test_a_kernel_after_a_step_gemm_reads_its_output_only_after_the_wait():
    # programmatic dependent launch: the kernel may start while the GEMM before it runs, so what the GEMM writes is
    # read after RNN_WAIT_PRIMARY(), the other loads before it, every store after it
    program = make_plan(dense(*case("gru_cho")[:2])[0], 4, 2).program
    waits = programmatic_waits(program)
    assert waits == {"gru_cho_stage1": {"h_gemm_out"}, "gru_cho_stage2": {"h_gemm_out", "r_h_mul_gemm_out"}}
    source = render_copies_module(program, "bfloat16", operand_copies(program, "bfloat16"), 1, waits)
    assert source.count("#define RNN_WAIT_PRIMARY()") == 2           # griddepcontrol on sm_90, nothing before it
    kernel = source[source.index("void gru_cho_stage2("):]
    wait = kernel.index("RNN_WAIT_PRIMARY();")
    assert kernel.count("RNN_WAIT_PRIMARY();") == 1
    assert kernel.index("x_proj_out[row") < wait < kernel.index("= h_gemm_out[") < kernel.index("// store")
    assert wait < kernel.index("= r_h_mul_gemm_out[")
    # a kernel with no GEMM before it in a step (minGRU's, stage 0) is launched as before: no wait
    mingru = make_plan(dense(*case("mingru")[:2])[0], 4, 2).program
    assert programmatic_waits(mingru) == {}
    plain = render_copies_module(mingru, "bfloat16", operand_copies(mingru, "bfloat16"), 1, {})
    assert "RNN_WAIT_PRIMARY" not in plain
    # without waits the module is the one before programmatic launches existed
    assert "RNN_WAIT_PRIMARY" not in render_copies_module(program, "bfloat16", operand_copies(program, "bfloat16"), 1)


def test_a_kernel_that_reads_nothing_from_the_gemm_still_waits_before_its_stores():
    program = make_plan(dense(*case("lstm")[:2])[0], 4, 2).program
    (kernel,) = program.kernels
    text = render_kernel(kernel, program, lookup_precision("float32"), None, frozenset())
    assert text.index("x_proj_out[row") < text.index("RNN_WAIT_PRIMARY();") < text.index("// compute")


@pytest.mark.parametrize("name, layers", [("lstm", 2), ("gru_cho", 1), ("lstm_proj", 2)])
def test_layer_zeros_projection_in_pieces_ahead_of_the_steps(name, layers):
    # layer 0's projection in pieces of 2 steps (issued ahead on a stream of its own on the GPU): the same outputs,
    # one GEMM a piece instead of one for the sequence
    network, params, x, states = case(name, layers)
    dense_network, dense_params = dense(network, params)
    T, B, _ = x.shape
    plan = make_plan(dense_network, T, B)
    runs = {}
    for ahead in (None, 2):
        device = NumpyModeDevice(np.float64, "bfloat16")
        executor = ModeExecutor(plan, device, ahead=ahead)
        runs[ahead] = (executor.run(dense_params, device.asarray(x), states, poison=True), device.launches)
    (want, plain), (got, pieces) = runs[None], runs[2]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-14)
    for state, value in want[1].items():
        np.testing.assert_allclose(got[1][state], value, rtol=1e-12, atol=1e-14)
    hoisted = len(plan.program.hoisted_gemms)
    assert pieces - plain == (-(-T // 2) - 1) * hoisted           # 3 pieces of 5 steps where there was 1


def test_the_pieces_ahead_are_large_gemms_or_none():
    assert ahead_steps(200, 64) == 32            # blogA: 2048 rows a piece, 7 pieces
    assert ahead_steps(100, 128) == 16           # large: 7 pieces
    assert ahead_steps(1024, 16) == 128          # one layer at B = 16: 8 pieces
    assert ahead_steps(100, 1) is None           # lat: the whole sequence is one small GEMM
    assert ahead_steps(100, 64) == 32
