"""The fused training step in the precision modes tf32, float16 and bfloat16 (engine/codegen/precision.py), on the CPU.

The mode's definition: every operand of every matmul of both passes rounded to its format, products summed in fp32,
everything else fp32. The NumPy runner (engine/autodiff/fused_numpy.py) runs the plan that way; the reference
(bptt(..., precision=mode)) emulates it op by op. Run in float32 too, the reference rounds the same values, so the two
agree to fp32's reordering (EMULATED_TOLERANCE), much more closely than either agrees with the strict float64 reference
(MODE_BOUND: the mode's own error). On the GPU (tests/gpu/test_fused_training_precision_gpu.py) a kernel rounds each
GEMM's operands into compact buffers first (kernels/round_operands.cu) and cuBLAS multiplies those; here a stand-in
library records which entry point, operand types and compute type each GEMM calls, and a stand-in rounder what it
rounds.
"""
from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest
from gradient_errors import gradient_errors

import engine
from engine.autodiff import bptt, fused_tape, persistent
from engine.autodiff.cublas import OPERANDS, Sgemm
from engine.autodiff.fused_numpy import NumpyRunner
from engine.autodiff.fused_planner import training_plan
from engine.autodiff.stage_fusion import fused_stages
from engine.dense import dense_form
from engine.errors import BackendError

MODES = ("tf32", "float16", "bfloat16")
PRESETS = sorted(engine.presets())
EMULATED_TOLERANCE = 1e-4      # norm-relative, against the float32 reference emulating the mode (measured <= 4.3e-5)
UNEXPLAINED = 0.1              # the share of the mode's divergence from float64 the emulation may leave (measured 0.08)
# Cells of reductions (ln_lstm, ln_gru): the plan sums a LayerNorm's mean as a matmul by ones (the dense form), the
# reference as a reduction, in another fp32 order; the mode's rounding of what follows turns those last bits into a
# flipped ulp of the mode here and there (measured: at most 4.9e-4, 15 % of the mode's divergence). Rounding the
# fixed matrix's operands as well (the wrong semantics) measures 50-75 %, so 20 % still tells the two apart.
REDUCTIONS_TOLERANCE, REDUCTIONS_UNEXPLAINED = 1e-3, 0.2
MODE_BOUND = {"tf32": 2e-3, "float16": 2e-3, "bfloat16": 1.5e-2}   # against float64 (measured 5e-4, 5e-4, 5e-3)
FLOOR = 1e-2


def mode_errors(got, want, network) -> dict:
    return gradient_errors(got, want, network.cell.state_names, network.num_layers, floor=FLOOR)


def case(cell, seed=3, layers=2, I=16, H=16, T=6, B=4):
    H = cell.fit_size(H)
    if cell.input_is_hidden:
        I = H
    network = engine.Network(cell, I, H, layers, proj_size=8 if cell.uses_projection else None)
    rng = np.random.default_rng(seed)
    return (network, engine.init_params(network, seed=seed), rng.standard_normal((T, B, I)),
            {s: rng.uniform(-0.8, 0.8, (layers, B, network.state_size(s))) for s in cell.state_names},
            rng.standard_normal((T, B, network.output_size)),
            {s: rng.standard_normal((layers, B, network.state_size(s))) for s in cell.state_names})


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", PRESETS)
def test_every_presets_plan_in_each_mode_equals_its_emulation(name, mode):
    cell = engine.preset(name).cell
    network, params, x, initial, d_out, d_final = case(cell)
    emulated = bptt(network, params, x, initial, d_out, d_final, dtype=np.float32, precision=mode)
    strict = bptt(network, params, x, initial, d_out, d_final)
    tape = fused_tape.record(network, params, x.astype(np.float32), initial, poison=True,
                             runner=NumpyRunner(training_plan(cell, precision=mode)))
    got = tape.backward(d_out.astype(np.float32), d_final)
    near, far = mode_errors(got, emulated, network), mode_errors(got, strict, network)
    worst = max(near, key=near.get)
    reductions = bool(dense_form(cell).fixed)
    assert near[worst] < (REDUCTIONS_TOLERANCE if reductions else EMULATED_TOLERANCE), (worst, near[worst])
    assert max(far.values()) < MODE_BOUND[mode], max(far.items(), key=lambda kv: kv[1])
    assert max(far.values()) > 0, "bit-equal to float64: the mode rounds nothing"
    share = REDUCTIONS_UNEXPLAINED if reductions else UNEXPLAINED
    assert near[worst] <= share * max(far.values()), (near[worst], max(far.values()))


@pytest.mark.parametrize("mode", MODES)
def test_the_float64_reference_in_a_mode_stays_within_its_bound(mode):
    """The emulation in float64 (the GPU tests' yardstick) against strict float64: the mode's own error, not more."""
    network, params, x, initial, d_out, d_final = case(engine.preset("lstm").cell)
    emulated = bptt(network, params, x, initial, d_out, d_final, precision=mode)
    strict = bptt(network, params, x, initial, d_out, d_final)
    errors = mode_errors(emulated, strict, network)
    assert 0 < max(errors.values()) < MODE_BOUND[mode]


def test_a_wavefront_and_a_single_layer_run_the_mode_too():
    """One layer runs the layer-by-layer backward, whose input adjoint the interpreter computes: it rounds as well."""
    cell = engine.preset("gru").cell
    for layers, wavefront in ((1, None), (3, False)):
        network, params, x, initial, d_out, d_final = case(cell, layers=layers)
        emulated = bptt(network, params, x, initial, d_out, d_final, dtype=np.float32, precision="bf16")
        tape = fused_tape.record(network, params, x.astype(np.float32), initial, poison=True, wavefront=wavefront,
                                 runner=NumpyRunner(training_plan(cell, precision="bf16")))
        errors = mode_errors(tape.backward(d_out.astype(np.float32), d_final), emulated, network)
        assert max(errors.values()) < EMULATED_TOLERANCE, (layers, max(errors.items(), key=lambda kv: kv[1]))


def test_the_plan_cache_key_holds_the_mode():
    cell = engine.preset("lstm").cell
    strict, bf16 = training_plan(cell), training_plan(cell, precision="bf16")
    assert strict.precision == "float32" and bf16.precision == "bfloat16"
    assert bf16 is training_plan(cell, False, "bfloat16") and bf16 is not strict
    assert training_plan(cell, True, "fp16").precision == "float16" and training_plan(cell, True, "fp16").lengths
    assert bf16.forward == strict.forward and bf16.backward == strict.backward     # the same kernels and GEMMs


def test_unknown_modes_are_refused_by_name():
    cell = engine.preset("lstm").cell
    network, params, x, *_ = case(cell, layers=1)
    with pytest.raises(BackendError, match="argument 'precision' is 'fp8'"):
        training_plan(cell, precision="fp8")
    with pytest.raises(BackendError, match="argument 'precision' is 'fp8'"):
        bptt(network, params, x, precision="fp8")
    with pytest.raises(BackendError, match=r"backend='naive'\) computes in float32 or float64 only"):
        bptt(network, params, x, precision="bf16", backend="naive")
    with pytest.raises(BackendError, match="whose plan runs float32"):
        fused_tape.record(network, params, x.astype(np.float32), None, runner=NumpyRunner(training_plan(cell)),
                          precision="bf16")


def test_reduced_modes_take_no_fused_stage_and_no_persistent_launch(monkeypatch):
    """Those launches multiply in fp32 (all but the head-local ones of a cell of heads: tests/test_persistent_training.py):
    the mode's GEMMs stay cuBLAS's; PERSISTENT = True is refused by name."""
    cell = engine.preset("gru_cho").cell
    network = engine.Network(cell, 8, 8, 1)
    assert NumpyRunner(training_plan(cell)).fuses(network, 1)
    assert not NumpyRunner(training_plan(cell, precision="bf16")).fuses(network, 1)
    plan = training_plan(cell, precision="bf16")
    runner = SimpleNamespace(plan=plan, sms=132, stages=fused_stages(plan))
    assert persistent.persistent_launch(runner, network.layer_sizes(0), 4, 132, True) is None     # "auto"
    monkeypatch.setattr(persistent, "PERSISTENT", True)
    with pytest.raises(BackendError, match="cannot run precision='bfloat16'.*multiply in strict fp32"):
        persistent.persistent_launch(runner, network.layer_sizes(0), 4, 132, True)


# ---- which cuBLAS entry point each GEMM calls (engine/autodiff/cublas.py) -------------------------------------------

class FakeCublas:
    """Stands in for libcublas: every entry point returns 0 (success) and records (name, compute type or None)."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def entry(*args):
            if name.startswith("cublasGemm"):
                self.calls.append((name, args[-2]))               # ..., computeType, algo
            elif name.startswith("cublasSgemm"):
                self.calls.append((name, None))
            return 0
        self.__dict__[name] = entry
        return entry


class FakeCupy:
    """empty() gives each buffer an address of its own (0x1000 apart), so a test can tell which one a call reads."""
    uint8 = np.uint8
    made = []

    @classmethod
    def empty(cls, size, dtype):
        cls.made.append(size)
        return SimpleNamespace(data=SimpleNamespace(ptr=0x1000 * len(cls.made)))


class FakeRounder:
    def __init__(self):
        self.calls = []

    def __call__(self, name, src, dst, rows, cols, ld):
        self.calls.append((name, src, dst, rows, cols, ld))


def issue_every_kind(precision: str, rounder=None) -> list:
    lib = FakeCublas()
    gemm = Sgemm(FakeCupy, precision, lib=lib, rounder=rounder or FakeRounder())
    gemm(1, 8, 2, 8, 3, 8, 4, 8, 8, w_transposed=True, accumulate=False)       # a step / hoisted GEMM
    gemm.raw(False, True, 8, 8, 64, 1, 8, 2, 8, 3, 8)                          # a weight gradient
    gemm.raw(False, False, 8, 1, 64, 1, 8, 2, 64, 3, 8, exact=True)            # a bias gradient (a sum)
    gemm.split(1, 8, 2, 8, 3, 4, 8, 64, 4, w_transposed=False)                 # split K
    return lib.calls


def test_strict_float32_calls_sgemm_as_before():
    rounder = FakeRounder()
    assert issue_every_kind("float32", rounder) == [("cublasSgemm_v2", None)] * 3 + [("cublasSgemmStridedBatched",
                                                                                      None)]
    assert rounder.calls == []


@pytest.mark.parametrize("mode, compute, kernel", [("tf32", 77, "round_operand_tf32"),
                                                   ("fp16", 68, "round_operand_fp16"),
                                                   ("bf16", 68, "round_operand_bf16")])
def test_reduced_modes_round_both_operands_then_call_gemm_ex(mode, compute, kernel):
    """CUBLAS_COMPUTE_32F_FAST_TF32 = 77 on tf32-rounded fp32 operands, CUBLAS_COMPUTE_32F = 68 on fp16 / bf16 ones
    (cublas_api.h); every GEMM but a bias's sum rounds its two operands first, each stored matrix whole: (rows,
    cols, leading dimension) as cuBLAS reads it (column-major)."""
    rounder = FakeRounder()
    assert issue_every_kind(mode, rounder) == [("cublasGemmEx", compute)] * 2 + [("cublasSgemm_v2", None),
                                                                                 ("cublasGemmStridedBatchedEx", compute)]
    assert {c[0] for c in rounder.calls} == {kernel}
    shapes = [(src, rows, cols, ld) for _, src, _, rows, cols, ld in rounder.calls]
    assert shapes == [(2, 8, 8, 8), (1, 8, 4, 8),        # W stored k x n (transposed), A stored k x m
                      (1, 8, 64, 8), (2, 8, 64, 8),      # a weight gradient: A stored m x k, B^T stored n x k
                      (2, 8, 64, 8), (1, 64, 4, 8)]      # split K: W stored n x k, A stored k x m
    assert OPERANDS["bfloat16"][:3] == (14, 2, 68) and OPERANDS["float16"][:3] == (2, 2, 68)


def test_gemm_ex_reads_the_rounded_copies():
    lib = FakeCublas()
    seen = []
    lib.cublasGemmEx = lambda *args: seen.append(args) or 0
    rounder = FakeRounder()
    Sgemm(FakeCupy, "bf16", lib=lib, rounder=rounder)(1, 8, 2, 8, 3, 8, 4, 8, 8, w_transposed=True, accumulate=True)
    args = seen[0]
    (_, _, w_copy, *_), (_, _, a_copy, *_) = rounder.calls
    assert w_copy != a_copy and (args[7], args[10]) == (w_copy, a_copy)       # the copies, not the fp32 buffers
    assert (args[8], args[9], args[11], args[12]) == (14, 8, 14, 8)           # CUDA_R_16BF, compact leading dims
    assert (args[14], args[15]) == (3, 0)                                     # C: the caller's fp32 buffer
    assert args[-2:] == (68, -1)                                              # COMPUTE_32F, CUBLAS_GEMM_DEFAULT
    assert ctypes.cast(args[13], ctypes.POINTER(ctypes.c_float)).contents.value == 1.0    # beta = 1: accumulate


def test_a_weight_rounded_once_is_read_as_it_is():
    """Runner.round_weights rounds each stacked weight once a load (round_into: the row-major matrix as cuBLAS's
    column-major cols x rows, ld = cols); a step GEMM given it (w_ready) rounds its activation operand only and
    hands cuBLAS the copy with W's leading dimension, the split-K GEMM alike; an exact GEMM ignores it."""
    lib, rounder = FakeCublas(), FakeRounder()
    seen = []
    lib.cublasGemmEx = lambda *args: seen.append(args) or 0
    lib.cublasGemmStridedBatchedEx = lambda *args: seen.append(args) or 0
    gemm = Sgemm(FakeCupy, "bf16", lib=lib, rounder=rounder)
    gemm.round_into(2, 0x9000, 96, 256)
    assert rounder.calls == [("round_operand_bf16", 2, 0x9000, 256, 96, 256)]
    gemm(1, 8, 2, 8, 3, 8, 4, 8, 8, w_transposed=True, accumulate=False, w_ready=0x9000)
    assert [c[1] for c in rounder.calls[1:]] == [1]                       # A only
    assert (seen[-1][7], seen[-1][9]) == (0x9000, 8)                     # the copy, W's leading dimension
    gemm.split(1, 8, 2, 8, 3, 4, 8, 64, 4, w_transposed=False, w_ready=0x9000)
    assert [c[1] for c in rounder.calls[2:]] == [1] and (seen[-1][7], seen[-1][9]) == (0x9000, 8)
    calls = len(rounder.calls)
    gemm(1, 8, 2, 8, 3, 8, 4, 8, 8, w_transposed=True, accumulate=False, exact=True, w_ready=0x9000)
    assert len(rounder.calls) == calls and lib.calls[-1] == ("cublasSgemm_v2", None)


def test_the_runner_rounds_each_stacked_weight_once_a_load():
    """Runner.prepare_rounding (with a program: before any capture) reserves every handle's operand buffers for the
    largest array and makes a copy of each stacked weight; round_weights fills the copies (one rounding each);
    ready_weight hands a GEMM its copy, except an exact one's. Strict fp32 makes none."""
    from engine.autodiff.fused_runner import Runner

    def array(shape, ptr):
        return SimpleNamespace(shape=shape, size=int(np.prod(shape)), data=SimpleNamespace(ptr=ptr))

    def runner(precision):
        r = object.__new__(Runner)
        r.xp, r.rounding, r.stream_sgemms = FakeCupy, 0, []
        r.sgemm = Sgemm(FakeCupy, precision, lib=FakeCublas(), rounder=FakeRounder())
        r.plan = SimpleNamespace(exact=lambda g: g.stack == "fixed")
        return r

    layer = SimpleNamespace(buffers={"h": array((400, 256), 0x100)}, rounded={},
                            stacked={"W": array((1024, 256), 0x200), "fixed": array((256, 256), 0x300)})
    strict = runner("float32")
    strict.prepare_rounding([layer])
    assert layer.rounded == {} and strict.sgemm.capacity == 0
    r = runner("bf16")
    r.prepare_rounding([layer])
    assert r.sgemm.capacity == 1024 * 256 and set(layer.rounded) == {"W", "fixed"}
    r.round_weights([layer])
    calls = r.sgemm.rounder.calls
    assert sorted((c[1], c[3], c[4], c[5]) for c in calls) == [(0x200, 256, 1024, 256), (0x300, 256, 256, 256)]
    assert r.ready_weight(layer, SimpleNamespace(stack="W")) == layer.rounded["W"].data.ptr
    assert r.ready_weight(layer, SimpleNamespace(stack="fixed")) is None


def test_reserve_sizes_the_copies_once_and_only_in_a_mode():
    FakeCupy.made.clear()
    strict = Sgemm(FakeCupy, "float32", lib=FakeCublas())
    strict.reserve(1000)
    assert strict.capacity == 0 and FakeCupy.made == [Sgemm.WORKSPACE]
    gemm = Sgemm(FakeCupy, "bf16", lib=FakeCublas(), rounder=FakeRounder())
    gemm.reserve(1000)
    gemm.reserve(10)
    assert gemm.capacity == 1000 and FakeCupy.made[-2:] == [2000, 2000]      # two buffers of 2-byte elements
    gemm(1, 8, 2, 8, 3, 8, 4, 8, 8, w_transposed=True, accumulate=False)       # fits: nothing new
    assert FakeCupy.made[-2:] == [2000, 2000] and len(FakeCupy.made) == 4


@pytest.mark.parametrize("name", ["ln_lstm", "ln_gru"])
def test_a_reductions_fixed_matrix_is_multiplied_exactly_in_every_mode(name):
    """The dense form sums mean_h by a matmul with a fixed matrix: its GEMMs are exact (strict fp32 on cuBLAS, no
    rounding in the emulation), and every other GEMM takes the mode."""
    plan = training_plan(engine.preset(name).cell, precision="bfloat16")
    gemms = plan.forward.gemms + plan.backward.gemms
    exact = [g for g in gemms if plan.exact(g)]
    assert exact and all(set(g.weights) <= plan.fixed_weights | {""} for g in exact)
    assert any(not plan.exact(g) for g in gemms)
    assert not any(plan.exact(g) for g in training_plan(engine.preset("lstm").cell, precision="bfloat16").forward.gemms)


def test_the_runner_sends_a_reductions_gemms_to_sgemm_in_a_mode():
    calls = []

    class Library:
        def __getattr__(self, name):
            def call(*args):
                calls.append(name)
                return 0
            return call
    sgemm = Sgemm(FakeCupy, "bfloat16", lib=Library(), rounder=FakeRounder())
    sgemm(1, 1, 2, 2, 3, 3, 4, 4, 4, w_transposed=True, accumulate=False, exact=True)
    sgemm(1, 1, 2, 2, 3, 3, 4, 4, 4, w_transposed=True, accumulate=False)
    sgemm.split(1, 1, 2, 2, 3, 4, 4, 8, 2, w_transposed=True, exact=True)
    sgemm.split(1, 1, 2, 2, 3, 4, 4, 8, 2, w_transposed=True)
    gemms = [c for c in calls if "emm" in c and "Set" not in c]
    assert gemms == ["cublasSgemm_v2", "cublasGemmEx", "cublasSgemmStridedBatched", "cublasGemmStridedBatchedEx"]
