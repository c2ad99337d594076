"""The fused training step in tf32, float16 and bfloat16 on the GPU (bptt(backend="fused", precision=...)): each GEMM's
operands rounded into compact buffers (kernels/round_operands.cu, engine.rounding's roundings), then cuBLAS on them
(fp16 / bf16 operands with CUBLAS_COMPUTE_32F, tf32-rounded fp32 with _FAST_TF32), against

- the same plan run by NumPy with every GEMM operand rounded to the mode (engine/autodiff/fused_numpy.py): the mode's
  definition. The GPU multiplies the same values and sums in another order (fp32: ~1e-6), and a rounding can flip
  where fp32's reordering moves a value across a rounding boundary (measured on the CPU between the NumPy runner and
  the reference: <= 4.3e-5). So the emulation must explain most of the mode's divergence from float64 (at most
  UNEXPLAINED of it left). A step that multiplied fp32 or TF32 values under a 16-bit mode's name leaves about all of
  it and fails: the FAST compute types on fp32 operands did (on an H200 with CUDA 13.0, bf16's gradients were
  5.8e-4 from float64, 8x nearer than the mode's 4.7e-3), which is why the operands are rounded first;
- the float64 reference: within MODE_BOUND, the mode's own error at these sizes, and not bit-equal.

Sizes blogB-like (I 64, H 256, 3 layers, B 64), T 40 to keep the NumPy runner and the float64 reference short.
"""
from __future__ import annotations

import numpy as np
import pytest
from gradient_errors import gradient_errors, relative

import engine
from engine.autodiff import bptt, fused_cache, fused_tape
from engine.autodiff.fused_numpy import NumpyRunner
from engine.autodiff.fused_planner import training_plan

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("release_gpu_memory")]

CELLS = ("lstm", "gru", "gru_cho", "peephole_lstm", "ln_lstm")     # ln_lstm: its reductions stay fp32 sums
MODES = ("tf32", "float16", "bfloat16")
UNEXPLAINED = 0.25                   # of the mode's divergence from float64 (the forward's tests: the same share)
MODE_BOUND = {"tf32": 2e-3, "float16": 2e-3, "bfloat16": 1.5e-2}    # against float64 (NumPy: 5.8e-4, 4.7e-3)
FLOOR = 1e-2


def errors(got, want, network) -> dict:
    return gradient_errors(got, want, network.cell.state_names, network.num_layers, floor=FLOOR)


def case(cell, seed=7, layers=3, I=64, H=256, T=40, B=64):
    network = engine.Network(cell, I, H, layers)
    rng = np.random.default_rng(seed)
    return (network, engine.init_params(network, seed=seed), rng.standard_normal((T, B, I)),
            {s: rng.uniform(-0.8, 0.8, (layers, B, network.state_size(s))) for s in cell.state_names},
            rng.standard_normal((T, B, network.output_size)))


def emulated(network, params, x, initial, d_out, mode):
    """The plan run by NumPy in the mode (fp32, every GEMM operand rounded)."""
    tape = fused_tape.record(network, params, x.astype(np.float32), initial,
                             runner=NumpyRunner(training_plan(network.cell, precision=mode)))
    return tape.backward(d_out.astype(np.float32))


def check(cupy, name, mode, poison=False):
    cell = engine.preset(name).cell
    network, params, x, initial, d_out = case(cell)
    on_gpu = {s: cupy.asarray(v, dtype=cupy.float32) for s, v in initial.items()}
    if poison:          # every work buffer NaN first: a value read before it is written shows in the result
        tape = fused_tape.record(network, params, cupy.asarray(x, dtype=cupy.float32), on_gpu, poison=True,
                                 precision=mode)
        got = tape.backward(cupy.asarray(d_out, dtype=cupy.float32))
    else:
        got = bptt(network, params, cupy.asarray(x, dtype=cupy.float32), on_gpu, cupy.asarray(d_out, dtype=cupy.float32),
                   dtype=np.float32, backend="fused", precision=mode)
    near = errors(got, emulated(network, params, x, initial, d_out, mode), network)
    far = errors(got, bptt(network, params, x, initial, d_out), network)
    worst, strict = max(near, key=near.get), max(far.values())
    assert all(np.isfinite(list(near.values()))), near
    assert 0 < strict < MODE_BOUND[mode], (mode, max(far, key=far.get), strict)
    assert near[worst] <= UNEXPLAINED * strict, (
        f"{name} {mode}: {worst} differs from the emulated plan by {near[worst]:.3g}, from float64 by {strict:.3g}")
    return near, far


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", CELLS)
def test_the_step_matches_its_emulation_and_float64_within_the_modes_bound(cupy, name, mode):
    check(cupy, name, mode)


@pytest.mark.parametrize("mode", MODES)
def test_poisoned_buffers_in_each_mode(cupy, mode):
    check(cupy, "gru_cho", mode, poison=True)


def test_the_runner_calls_gemm_ex_in_the_mode_and_sgemm_in_float32(cupy):
    cell = engine.preset("lstm").cell
    bf16 = fused_cache.gpu_runner(training_plan(cell, precision="bf16")).sgemm
    assert (bf16.operands[0], bf16.compute) == (14, 68)              # CUDA_R_16BF operands, CUBLAS_COMPUTE_32F
    assert fused_cache.gpu_runner(training_plan(cell)).sgemm.compute is None                  # cublasSgemm_v2
    assert fused_cache.gpu_runner(training_plan(cell)) is not fused_cache.gpu_runner(training_plan(cell, precision="tf32"))


def test_small_batches_and_one_layer_run_the_mode(cupy):
    """B = 1 (where float32 fuses stages and may go persistent; a mode takes cuBLAS's GEMMs instead, GEMV-shaped
    there: the FAST compute types alone multiplied fp32 exactly in them) and a single layer (its input adjoint through
    the interpreter, rounding as well)."""
    cell = engine.preset("gru_cho").cell
    for layers, B in ((2, 1), (1, 8)):
        network, params, x, initial, d_out = case(cell, layers=layers, H=64, T=12, B=B)
        got = bptt(network, params, cupy.asarray(x, dtype=cupy.float32),
                   {s: cupy.asarray(v, dtype=cupy.float32) for s, v in initial.items()},
                   cupy.asarray(d_out, dtype=cupy.float32), dtype=np.float32, backend="fused", precision="bf16")
        near = errors(got, emulated(network, params, x, initial, d_out, "bfloat16"), network)
        far = errors(got, bptt(network, params, x, initial, d_out), network)
        assert max(near.values()) <= UNEXPLAINED * max(far.values()), (layers, B, near, far)


def test_cell_rnn_in_bfloat16_on_cuda_runs_the_fused_step_in_the_mode(cupy):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from engine.torch_module import CellRNN
    rnn = CellRNN(engine.preset("lstm").cell, 32, 128, 2, seed=4, precision="bf16").cuda()
    x = torch.randn(20, 16, 32, device="cuda", requires_grad=True)
    out, _ = rnn(x)
    assert rnn.last_backend == "fused" and out.dtype == torch.float32
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    args = (rnn.network, rnn.engine_params(), x.detach().double().cpu().numpy())
    mode = engine.bptt(*args, d_outputs=weights.double().cpu().numpy(), precision="bfloat16")
    strict = engine.bptt(*args, d_outputs=weights.double().cpu().numpy())
    near, far = relative(x.grad.double().cpu().numpy(), mode.x), relative(x.grad.double().cpu().numpy(), strict.x)
    assert 0 < far < MODE_BOUND["bfloat16"] and near <= UNEXPLAINED * far, (near, far)
    for layer, tensors in enumerate(rnn.layer_parameters()):
        for p_name, tensor in zip(rnn.names[layer], tensors):
            assert relative(tensor.grad.double().cpu().numpy(), strict.params[layer][p_name]) < MODE_BOUND["bfloat16"]
