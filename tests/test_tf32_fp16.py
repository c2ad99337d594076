"""tf32's step products held as shifted fp16 (engine/schedules/tf32_fp16.py, tf32_storage="fp16" on the fused backend),
on the CPU: the shift holds every TF32 value in range exactly and rounds only fp16's subnormals, within the bound the
module states; the host logic (which GEMMs take it, which weights it refuses and why) is the tf32 emulation's to the
last bit on ordinary values; the kernels' copies and the initial states' rounding compile. The GPU suite holds
cuBLAS's products to it (tests/gpu/test_fused_modes_gpu.py)."""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from nvcc_check import compile_sources
from test_fused_modes import case, relative

import engine
from engine.backends import reference
from engine.codegen.cuda import kernel_file_source
from engine.codegen.operand_copies import operand_copies, render_copies_module
from engine.codegen.programmatic import programmatic_waits
from engine.compiler import make_plan
from engine.dense import dense
from engine.errors import BackendError
from engine.rounding import round_operand
from engine.schedules import fused_modes, tf32_fp16
from engine.schedules.fused_modes import ModeExecutor, fixed_gemms, resolve_tf32_storage
from engine.schedules.mode_device import NumpyModeDevice, Tf32StorageError


@pytest.mark.parametrize("top", [1e-3, 0.07, 1.0, 3.0, 2.0 ** 14, 5e4])
def test_a_weights_tf32_values_are_its_shifted_fp16_values(top):
    rng = np.random.default_rng(int(top * 1000) % 97)
    w = (rng.uniform(-1, 1, (40, 33)) * top).astype(np.float32)
    w[3, 4] = top                                              # the largest exactly at `top`
    stored, scale = tf32_fp16.scaled_weight(w)
    assert stored.dtype == np.float16 and np.isfinite(stored).all()
    shift = -np.log2(scale) - tf32_fp16.OPERAND_SHIFT
    assert shift == int(shift)
    assert 2.0 ** 14 <= np.abs(stored.astype(np.float64)).max() < 2.0 ** 15
    back = stored.astype(np.float64) * 2.0 ** -shift
    rounded = round_operand(w, "tf32")
    normal = np.abs(stored.astype(np.float64)) >= 2.0 ** -14
    np.testing.assert_array_equal(back[normal], rounded[normal])         # exact where fp16 is normal
    assert np.abs(back - rounded).max() <= 2.0 ** -25 * 2.0 ** -shift    # subnormals: half their spacing


def test_an_operands_copy_is_exact_from_2_to_the_minus_24_to_its_limit_and_flags_past_it():
    rng = np.random.default_rng(4)
    v = (rng.uniform(0.5, 1.0, 2000) * 2.0 ** rng.integers(-23, 6, 2000)).astype(np.float32)
    v *= rng.choice([-1, 1], v.size).astype(np.float32)
    copy = tf32_fp16.scaled_operand(v).astype(np.float64) * 2.0 ** -tf32_fp16.OPERAND_SHIFT
    np.testing.assert_array_equal(copy, round_operand(v, "tf32"))
    tiny = np.array([3e-9, -1e-12, 2.0 ** -30], np.float32)
    held = tf32_fp16.scaled_operand(tiny).astype(np.float64) * 2.0 ** -tf32_fp16.OPERAND_SHIFT
    assert np.abs(held - tiny).max() <= 2.0 ** -35                         # the module's bound below 2^-24
    assert tf32_fp16.in_range([63.9, -63.9]) and not tf32_fp16.in_range([0.1, 64.5])
    assert np.isinf(tf32_fp16.scaled_operand(np.float32(64.5)))


def test_a_weight_with_a_row_far_below_the_largest_is_refused_with_why():
    w = np.random.default_rng(2).standard_normal((6, 9)).astype(np.float32)
    assert tf32_fp16.check_weight(w) is None
    w[2] *= 2.0 ** -20                                         # one gate ~2^20 smaller than the rest
    assert "under 2^-18 of the weight's" in tf32_fp16.check_weight(w)
    w[2] = 0.0                                                 # a row of zeros is held exactly
    assert tf32_fp16.check_weight(w) is None
    w[0, 0] = np.inf
    assert "not finite" in tf32_fp16.check_weight(w)


def run_half(network, params, x, states):
    dense_network, dense_params = dense(network, params)
    T, B, _ = x.shape
    device = NumpyModeDevice(np.float64, "tf32", tf32_storage="fp16")
    executor = ModeExecutor(make_plan(dense_network, T, B), device)
    return executor, executor.run(dense_params, device.asarray(x), states, poison=True)


@pytest.mark.parametrize("name", sorted(engine.presets()))
def test_the_host_logic_is_the_tf32_emulation(name):
    """Every preset: the step GEMMs on shifted fp16, the projections and fixed matrices not, and the run the tf32
    emulation's to float64's last bits (the shift is exact on these values)."""
    network, params, x, states = case(name)
    executor, (outputs, final) = run_half(network, params, x, states)
    emulated = reference.run(network, params, x, states, precision="tf32")
    assert relative(outputs, emulated.outputs) < 1e-12, name
    for state, value in emulated.final_states.items():
        assert relative(final[state], value) < 1e-12, (name, state)
    program = executor.program
    fixed = fixed_gemms(program, program.cell)
    want = {g.name: "tf32" if fixed[g.name] or g.hoisted else "fp16" for g in program.gemms}
    assert executor.parts == want, name
    scaled = [w for layer in executor.weights for w, _ in layer.values() if w.scale]
    assert len(scaled) == sum(p == "fp16" for p in want.values()) * network.num_layers


def test_a_weight_it_cannot_hold_is_refused_by_name():
    network, params, _, _ = case("lstm")
    dense_network, dense_params = dense(network, params)
    executor = ModeExecutor(make_plan(dense_network, 4, 3), NumpyModeDevice(np.float64, "tf32", tf32_storage="fp16"))
    step = next(g for g in executor.program.gemms if not g.hoisted)
    names = {executor.program.cell[m].args[0] for t in step.terms for m in t.matmuls}
    scaled = [dict(layer) for layer in dense_params.layers]
    for weight in names:
        scaled[1][weight] = np.array(scaled[1][weight], copy=True)
        scaled[1][weight][0] *= 2.0 ** -22
    with pytest.raises(Tf32StorageError, match=f"layer 1's weight of GEMM '{step.name}' has a row .*hint: "
                                               "tf32_storage='tf32' holds it"):
        executor.load(engine.Params(scaled))


@pytest.mark.parametrize("storage", ["bf16", None, "FP16", 16])
def test_a_bad_storage_is_refused_by_name(storage):
    network, params, _, _ = case("lstm")
    with pytest.raises(BackendError, match=r"argument 'tf32_storage' must be one of auto, fp16, tf32, got .*; hint: "):
        fused_modes.FusedModeProgram(network, params, precision="tf32", tf32_storage=storage)


def test_auto_takes_fp16_where_the_products_run_on_cublas():
    assert resolve_tf32_storage("auto", "cublaslt", "tf32") == "fp16"
    assert resolve_tf32_storage("auto", "wgmma", "tf32") == "tf32"      # the wgmma kernel reads TF32 tiles
    assert resolve_tf32_storage("tf32", "cublaslt", "tf32") == "tf32"
    assert resolve_tf32_storage("fp16", "cublaslt", "bfloat16") == "tf32"   # other modes: not theirs
    with pytest.raises(BackendError, match="tf32_storage='fp16' runs the step products on cuBLAS"):
        resolve_tf32_storage("fp16", "wgmma", "tf32")


def test_the_kernels_write_the_shifted_copy():
    program = make_plan(dense(*case("gru_cho")[:2])[0], 4, 2).program
    copies = operand_copies(program, "tf32", tf32_storage="fp16")
    assert {c for params in copies.values() for _, c, _ in params.values()} == {"unsigned short"}
    source = render_copies_module(program, "tf32", copies, 1, tf32_storage="fp16")
    assert "r_h_mul_gemm_in_mode[b * H + j] = rnn_copy_tf32_fp16(" in source
    assert "if (rnn_tf32_fp16(v, h)) *range = 1u;" in source
    # the flag is the program's own, a parameter of every kernel that writes a copy (after its copies)
    kernels = [k for k in source.split('extern "C" __global__ void ')[1:] if "rnn_copy_tf32_fp16(" in k]
    assert kernels and all(re.search(r"_mode,[^\n]*\n\s+unsigned int\* __restrict__ rnn_fp16_range,", k) for k in kernels)
    plain = render_copies_module(program, "tf32", operand_copies(program, "tf32"), 1)
    assert "rnn_copy_tf32_fp16" not in plain and "rnn_copy_tf32(" in plain


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (the generated CUDA is compiled there)")
def test_the_copies_and_the_rounding_compile(tmp_path):
    sources = {"tf32_fp16": kernel_file_source("tf32_fp16.cu")}
    for name in ("lstm", "gru_cho", "ln_lstm", "slstm"):
        network, params, _, _ = case(name)
        program = make_plan(dense(network, params)[0], 4, 2, lengths=name == "lstm").program
        exact = {g for g, fixed in fixed_gemms(program, program.cell).items() if fixed}
        sources[f"{name}_tf32_fp16"] = render_copies_module(
            program, "tf32", operand_copies(program, "tf32", exact, tf32_storage="fp16"), 1,
            programmatic_waits(program), tf32_storage="fp16")
    compile_sources(sources, tmp_path)
