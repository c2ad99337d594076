"""The fused training step in tf32, float16 and bfloat16 on the GPU (bptt(backend="fused", precision=...)): each GEMM's
operands rounded into compact buffers (kernels/round_operands.cu, engine.rounding's roundings), then cuBLAS on them
(fp16 / bf16 operands with CUBLAS_COMPUTE_32F, tf32-rounded fp32 with _FAST_TF32).

- Each GEMM entry point alone, against the float64 product of the operands rounded by engine.rounding: equal to
  fp32 summation (GEMM_TOLERANCE), and far from the unrounded product. This is where a wrong rounding shows sharply.
- The whole step against the same plan run by NumPy with every GEMM operand rounded to the mode
  (engine/autodiff/fused_numpy.py): the mode's definition. The two multiply the same values and sum them in another
  order; a value moved across a rounding boundary by that rounds the other way, and over T = 40 steps those flips
  grow. How far is measured, not guessed: the NumPy plan summing in float64 instead of float32 moves the worst
  gradient by 32 % (bf16) to 48 % (tf32) of the mode's divergence from float64 at these sizes. So the GPU may be
  at most ORDER_SLACK times that far from the emulation, and its divergence from float64 must be the mode's (at
  least MODE_SHARE of the emulation's): a step that multiplied fp32 or TF32 values under bf16's name (the FAST
  compute types on fp32 operands did, on an H200 with CUDA 13.0: 5.8e-4 from float64 against the mode's 4.7e-3)
  fails there;
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
ORDER_SLACK = 2.0                    # times the emulation's own move under another summation order
MODE_SHARE = 0.5                     # of the emulation's divergence from float64, at least
GEMM_TOLERANCE = 1e-5                # max-relative, one GEMM against float64 sums of the rounded operands
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


def emulated(network, params, x, initial, d_out, mode, wide_sums=False):
    """The plan run by NumPy in the mode (fp32, every GEMM operand rounded; wide_sums: the GEMMs summed in float64)."""
    runner = NumpyRunner(training_plan(network.cell, precision=mode), wide_sums=wide_sums)
    tape = fused_tape.record(network, params, x.astype(np.float32), initial, runner=runner)
    return tape.backward(d_out.astype(np.float32))


def check_against_the_emulation(got, network, params, x, initial, d_out, mode, what):
    """The step's gradients `got` against the emulation, the emulation's own move under float64 sums, and float64."""
    mode_run = emulated(network, params, x, initial, d_out, mode)
    near = errors(got, mode_run, network)
    order = max(errors(mode_run, emulated(network, params, x, initial, d_out, mode, wide_sums=True), network).values())
    strict = bptt(network, params, x, initial, d_out)
    far, modes_own = max(errors(got, strict, network).values()), max(errors(mode_run, strict, network).values())
    worst = max(near, key=near.get)
    assert all(np.isfinite(list(near.values()))), near
    assert 0 < far < MODE_BOUND[mode], (what, far)
    assert near[worst] <= ORDER_SLACK * order, (
        f"{what}: {worst} differs from the emulated plan by {near[worst]:.3g}; float64 sums move it {order:.3g}")
    assert far >= MODE_SHARE * modes_own, f"{what}: {far:.3g} from float64, the mode's own error {modes_own:.3g}"


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
    check_against_the_emulation(got, network, params, x, initial, d_out, mode, f"{name} {mode}")


@pytest.mark.parametrize("mode", MODES)
def test_each_gemm_multiplies_the_modes_rounded_operands(cupy, mode):
    """Sgemm's four uses (a step GEMM both ways, from a strided operand; a weight gradient; split K) against float64
    sums of engine.rounding's rounded operands."""
    from engine.autodiff.cublas import Sgemm
    from engine.rounding import round_like
    rng = np.random.default_rng(11)
    m, n, k, splits = 37, 96, 256, 4
    wide = rng.standard_normal((m, k + 8)).astype(np.float32)          # A is its first k columns: lda = k + 8
    A, W = wide[:, :k], rng.standard_normal((n, k)).astype(np.float32)
    R = lambda v: round_like(v, mode).astype(np.float64)               # noqa: E731
    gemm = Sgemm(cupy, mode)
    gemm.bind(cupy.cuda.get_current_stream().ptr)
    a_wide, w, w_t = cupy.asarray(wide), cupy.asarray(W), cupy.asarray(np.ascontiguousarray(W.T))
    a = cupy.ascontiguousarray(a_wide[:, :k])
    out = lambda *shape: cupy.full(shape, np.nan, dtype=cupy.float32)  # noqa: E731 - poisoned
    c1, c2, c3, parts = out(m, n), out(m, n), cupy.zeros((n, k), dtype=cupy.float32), out(splits, m, n)
    gemm(a_wide.data.ptr, k + 8, w.data.ptr, k, c1.data.ptr, n, m, n, k, w_transposed=True, accumulate=False)
    gemm(a.data.ptr, k, w_t.data.ptr, n, c2.data.ptr, n, m, n, k, w_transposed=False, accumulate=False)
    # a weight gradient: out (n x k) += dy^T (n x m) @ operand (m x k), dy = c1's inputs' stand-in W-shaped (m x n)
    dy = cupy.asarray(rng.standard_normal((m, n)).astype(np.float32))
    gemm.raw(False, True, k, n, m, a.data.ptr, k, dy.data.ptr, n, c3.data.ptr, k)
    gemm.split(a.data.ptr, k, w.data.ptr, k, parts.data.ptr, m, n, k, splits, w_transposed=True)
    ks = k // splits
    cases = [("forward, strided A", c1, R(A) @ R(W).T, A.astype(np.float64) @ W.T),
             ("backward", c2, R(A) @ R(W).T, A.astype(np.float64) @ W.T),     # W^T stored (k x n): A @ W^T
             ("weight gradient", c3, R(cupy.asnumpy(dy)).T @ R(A), cupy.asnumpy(dy).astype(np.float64).T @ A),
             ("split K", parts, np.stack([R(A)[:, i * ks:(i + 1) * ks] @ R(W)[:, i * ks:(i + 1) * ks].T
                                          for i in range(splits)]),
              np.stack([A[:, i * ks:(i + 1) * ks].astype(np.float64) @ W[:, i * ks:(i + 1) * ks].T
                        for i in range(splits)]))]
    for what, got, want, unrounded in cases:
        got = cupy.asnumpy(got).astype(np.float64)
        error = np.abs(got - want).max() / np.abs(want).max()
        away = np.abs(got - unrounded).max() / np.abs(unrounded).max()
        assert error <= GEMM_TOLERANCE, f"{mode} {what}: {error:.3g} from the rounded operands' product"
        assert away > 10 * max(error, 1e-7), f"{mode} {what}: {away:.3g} from the unrounded product: not rounded?"


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
        check_against_the_emulation(got, network, params, x, initial, d_out, "bfloat16", f"L={layers} B={B}")


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
    own = relative(mode.x, strict.x)         # the emulated mode's divergence from float64
    assert 0 < far < MODE_BOUND["bfloat16"] and near < far and far >= MODE_SHARE * own, (near, far, own)
    for layer, tensors in enumerate(rnn.layer_parameters()):
        for p_name, tensor in zip(rnn.names[layer], tensors):
            assert relative(tensor.grad.double().cpu().numpy(), strict.params[layer][p_name]) < MODE_BOUND["bfloat16"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("size", [1, 7, 4096 + 3])
def test_round_like_on_the_gpu_is_the_numpy_rounding_bit_for_bit(cupy, mode, size):
    """engine.rounding.round_like of a float32 CuPy array is one launch of kernels/round_operands.cu round_values_*
    (the training step's interpreted matmuls): bit for bit NumPy's, ties, subnormals, Inf and NaN included; a
    strided array takes the elementwise spelling and agrees too."""
    from engine.rounding import round_like
    rng = np.random.default_rng(size)
    a = (rng.standard_normal(size) * 10.0 ** rng.integers(-40, 39, size)).astype(np.float32)
    specials = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0 + 2.0 ** -8, 1.0 + 2.0 ** -11, 1e-41, 65520.0],
                        dtype=np.float32)
    a[:min(size, specials.size)] = specials[:size]
    want = round_like(a, mode)
    got = round_like(cupy.asarray(a), mode)
    assert got.dtype == cupy.float32 and got.shape == a.shape

    def same(got, want):                  # NaN's payload is the conversion's own: NaN where NaN, bits elsewhere
        got = cupy.asnumpy(got)
        assert (np.isnan(got) == np.isnan(want)).all()
        np.testing.assert_array_equal(got[~np.isnan(got)].view(np.uint32), want[~np.isnan(want)].view(np.uint32))
    same(got, want)
    if size > 2:
        same(round_like(cupy.asarray(a)[::2], mode), want[::2])
    if size > 6:                              # a transposed (Fortran-ordered) view, as W^T dy hands it over
        square = a[:4 * (size // 4)].reshape(4, -1)
        same(round_like(cupy.asarray(square).T, mode), round_like(square.T, mode))
