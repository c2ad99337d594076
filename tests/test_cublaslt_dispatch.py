"""Which multiply the schedules' input projection takes (engine/schedules/project.py), without a GPU: NumPy stands in
for CuPy and a recording stand-in for cublasLt. cublasLt (the bias in its epilogue) for every mode it serves, on
C-contiguous fp32 sources, float32x3's three products too; the cuBLAS path and an add where cublasLt offers no
algorithm or the source is strided. The values themselves are checked on the GPU (tests/gpu/test_cublaslt_gpu.py)."""
from __future__ import annotations

import numpy as np
import pytest

from engine.errors import BackendError
from engine.schedules import cublaslt
from engine.schedules import project as projection
from engine.schedules.cublaslt import LtProjection, Product


class RecordingLt:
    """cublasLt as project() calls it: records (operand, weight, bias, data type, compute type) and writes the
    product (the bias added) where `offers` is True."""

    def __init__(self, offers: bool):
        self.offers, self.calls = offers, []

    def matmul(self, operand, weight, bias, out, data_type, compute) -> bool:
        self.calls.append((operand, weight, bias, data_type, compute))
        if self.offers:
            out[...] = operand @ weight.T + (0 if bias is None else bias)
        return self.offers


class RecordingLib:
    """The cublasLt library as a recorder: every call succeeds and is kept in `calls`; a descriptor or layout made
    gets a distinct handle, and the ones destroyed are listed in `destroyed`."""

    def __init__(self):
        self.calls, self.destroyed, self.made = [], [], 0

    def __getattr__(self, name):
        def call(*args):
            if name in ("cublasLtMatmulDescCreate", "cublasLtMatrixLayoutCreate"):
                self.made += 1
                args[0]._obj.value = self.made            # a distinct handle for each descriptor and layout
            if name in ("cublasLtMatmulDescDestroy", "cublasLtMatrixLayoutDestroy"):
                self.destroyed.append((name, args[0].value))
            self.calls.append((name, args))
            return 0
        return call


def recording_lt() -> LtProjection:
    """An LtProjection on a RecordingLib, without a GPU (no handle, workspace or CuPy)."""
    lt = object.__new__(LtProjection)
    lt.lib, lt.handle, lt.plans = RecordingLib(), None, cublaslt.OrderedDict()
    return lt


@pytest.fixture
def lt(monkeypatch):
    def install(offers: bool) -> RecordingLt:
        stand_in = RecordingLt(offers)
        monkeypatch.setattr(LtProjection, "on_current_device", classmethod(lambda cls, cupy: stand_in))
        return stand_in
    return install


def operands(rows=12, k=8, n=6, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32),
            rng.standard_normal(n).astype(np.float32))


def test_float32_goes_through_cublaslt_with_the_bias_in_its_epilogue(lt):
    stand_in = lt(offers=True)
    x, w, b = operands()
    out = np.full((12, 6), np.nan, dtype=np.float32)
    projection.project(np, x, w, b, out, "float32")
    (call,) = stand_in.calls
    assert call[0] is x and call[1] is w and call[2] is b                 # the source itself: no rounded copy
    assert call[3:] == projection.LT_OPERANDS["float32"]
    np.testing.assert_allclose(out, x @ w.T + b, rtol=1e-6)              # the bias once, not added again after


@pytest.mark.parametrize("precision", ["tf32", "bfloat16"])
def test_reduced_modes_hand_cublaslt_the_rounded_operand(lt, monkeypatch, precision):
    stand_in = lt(offers=True)
    rounded = []
    monkeypatch.setattr(projection, "round_activations",
                        lambda cupy, source, p: rounded.append(p) or source.astype(np.float32) * 2)
    x, w, b = operands()
    projection.project(np, x, w, b, np.empty((12, 6), dtype=np.float32), precision)
    (call,) = stand_in.calls
    assert rounded == [precision] and np.array_equal(call[0], 2 * x)
    assert call[3:] == projection.LT_OPERANDS[precision]


def test_no_algorithm_falls_back_to_cublas_and_an_add(lt):
    stand_in = lt(offers=False)
    x, w, b = operands(seed=1)
    out = np.full((12, 6), np.nan, dtype=np.float32)
    projection.project(np, x, w, b, out, "float32")
    assert len(stand_in.calls) == 1
    np.testing.assert_allclose(out, x @ w.T + b, rtol=1e-6)


def test_a_strided_source_skips_cublaslt(lt):
    stand_in = lt(offers=True)
    x, w, b = operands(k=16, seed=2)
    source = x[:, :8]                                   # rows of 16: not C-contiguous
    out = np.full((12, 6), np.nan, dtype=np.float32)
    projection.project(np, source, w[:, :8].copy(), b, out, "float32")
    assert stand_in.calls == []
    np.testing.assert_allclose(out, source @ w[:, :8].T + b, rtol=1e-6)


def test_float32x3_goes_through_its_three_cublaslt_products(lt, monkeypatch):
    """float32x3 is not one product of a mode's operands (not in LT_OPERANDS): its three TF32 products go through
    split_products_lt (tests/test_fused_mode_products.py runs them), the bias with them, nothing added after."""
    assert "float32x3" not in projection.LT_OPERANDS
    assert set(projection.LT_OPERANDS) == {"float32", "tf32", "float16", "bfloat16"}
    stand_in, made = lt(offers=True), []
    monkeypatch.setattr(projection, "split_products_lt",
                        lambda cupy, source, weight, bias, out: made.append((source, weight, bias)) or True)
    x, w, b = operands(seed=3)
    out = np.zeros((12, 6), dtype=np.float32)
    projection.project(np, x, w, b, out, "float32x3")
    assert stand_in.calls == [] and len(made) == 1 and made[0][0] is x and made[0][2] is b
    assert not out.any()                                # the bias is not added again after the products


def test_a_failing_cublaslt_call_is_a_backend_error_with_a_hint():
    with pytest.raises(BackendError, match=r"cublasLtMatmul returned cuBLAS status 3 .*hint: "):
        LtProjection._check(3, "cublasLtMatmul")
    with pytest.raises(BackendError, match=r"cuBLAS status 15 \(not supported: .*hint: run it without the setting"):
        LtProjection._check(15, "cublasLtMatmul")
    LtProjection._check(0, "cublasLtMatmul")                     # success raises nothing


def test_plans_past_the_limit_are_destroyed_least_recently_used_first(monkeypatch):
    """A process that sees many shapes (sequences of many lengths) keeps at most MAX_PLANS plans a device; the least
    recently used one's descriptor and layouts are destroyed when a new one would pass it, and a plan used again
    moves to the back. A stand-in for the library records the calls (every call succeeds, no algorithm offered)."""
    monkeypatch.setattr(cublaslt, "MAX_PLANS", 3)
    lt = recording_lt()
    first = lt.plan(Product.dense(16, 8, 8), 0, 68, 0)
    for M in (32, 48):
        lt.plan(Product.dense(M, 8, 8), 0, 68, 0)
    assert lt.plan(Product.dense(16, 8, 8), 0, 68, 0) is first                      # reused, now the most recent
    lt.plan(Product.dense(64, 8, 8), 0, 68, 0)                                      # a fourth: the least recent (M = 32) goes
    assert [key[0].M for key in lt.plans] == [48, 16, 64]
    assert [name for name, _ in lt.lib.destroyed] == ["cublasLtMatmulDescDestroy"] + ["cublasLtMatrixLayoutDestroy"] * 3
    assert first.desc.value not in [handle for _, handle in lt.lib.destroyed]


class SplitLib(RecordingLib):
    """RecordingLib whose heuristic offers three algorithms (ids 0, 1, 2 in their first byte): 0 cannot split K, 1
    splits K but sums the splits in place only, 2 splits K and sums them in the workspace in compute type."""

    CAPS = {0: (0, 0), 1: (1, 1), 2: (1, 1 | 2)}        # id: (split-K support, reduction scheme mask)

    def __init__(self):
        super().__init__()
        self.configured = []

    def __getattr__(self, name):
        if name == "cublasLtMatmulAlgoGetHeuristic":
            def heuristic(*args):
                count, results, found = args[7].value, args[8], args[9]
                for k in range(min(3, count)):
                    results[k * cublaslt.LT_HEURISTIC_RESULT_BYTES] = k
                found._obj.value = min(3, count)
                return 0
            return heuristic
        if name == "cublasLtMatmulAlgoCapGetAttribute":
            def capability(algo, attribute, value, size, written):
                value._obj.value = self.CAPS[algo._obj[0]][attribute.value]
                return 0
            return capability
        if name == "cublasLtMatmulAlgoConfigSetAttribute":
            def configure(algo, attribute, value, size):
                self.configured.append((algo._obj[0], attribute.value, value._obj.value))
                return 0
            return configure
        return super().__getattr__(name)


def test_a_split_k_product_takes_the_first_algorithm_that_sums_its_splits_in_the_workspace():
    """Product(splits=4): the heuristic's first algorithm with split-K support and the compute-type reduction
    (float32x3's K chunks summed in fp32), set to 4 splits; none where the splits' planes pass the workspace."""
    lt = recording_lt()
    lt.lib = SplitLib()
    plan = lt.plan(Product(128, 1024, 2560, 2560, 2560, splits=4), 0, 68, 0)
    assert plan.algo is not None and plan.algo[0] == 2 and [a[0] for a in plan.candidates] == [2]
    assert lt.lib.configured == [(2, 2, 4), (2, 3, 2)]        # SPLITK_NUM = 4, REDUCTION_SCHEME = compute type
    assert lt.plan(Product.dense(128, 1024, 2560), 0, 68, 0).algo[0] == 0   # without splits: the heuristic's first
    wide = Product(4096, 4096, 256, 256, 256, splits=2)                     # 2 x 4096 x 4096 floats: 128 MiB
    assert wide.workspace_bytes > cublaslt.WORKSPACE and lt.plan(wide, 0, 68, 0).algo is None
