"""The fused backend's mode products as the GPU path issues them (engine/schedules/fused_modes.py ModeDevice:
float32x3's stacked product and its projections, a reduced mode's K slices), run on the CPU: NumPy arrays stand in
for CuPy's (their real addresses as device pointers), and a stand-in for cublasLt executes each product it is given
on that memory as cublasLt defines it (row-major A and W at those addresses with their leading dimensions, batch
members `strides` apart, beta, the bias), so the addresses, element sizes and offsets ModeDevice computes are
checked end to end against the emulation (engine/rounding.py). The fold is kernels/split_products.cu's (fold_numpy,
whose flat indices tests/test_split_products.py checks against the kernel's)."""
from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest

from engine.codegen.cublas_enums import CUDA_R_16BF, CUDA_R_16F, CUDA_R_32F
from engine.errors import BackendError
from engine.rounding import mode_matmul, round_operand, split_tf32
from engine.schedules import mode_device as mode_devices
from engine.schedules import project
from engine.schedules.cublaslt import LtError
from engine.schedules.mode_device import ModeDevice, ModeWeight, X3SplitKError
from engine.schedules.split_products import LO_SCALE, Left, chunking, fold_numpy, split_into, stack_split


class DeviceArray(np.ndarray):
    """An ndarray with CuPy's `.data.ptr` (its address)."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)


def device(array) -> DeviceArray:
    return np.ascontiguousarray(array).view(DeviceArray)


def memory(address: int, dtype, count: int) -> np.ndarray:
    """`count` elements of `dtype` at `address` (a view, not a copy)."""
    return np.frombuffer((ctypes.c_char * (count * np.dtype(dtype).itemsize)).from_address(address), dtype=dtype)


def values(address: int, data_type: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """The (rows, cols) matrix of rows ld elements apart at `address`, as float64 (bf16 from its bits)."""
    if data_type == CUDA_R_16BF:
        flat = memory(address, np.uint16, (rows - 1) * ld + cols).astype(np.uint32) << 16
        flat = flat.view(np.float32)
    elif data_type == CUDA_R_16F:
        flat = memory(address, np.float16, (rows - 1) * ld + cols)
    else:
        flat = memory(address, np.float32, (rows - 1) * ld + cols)
    return np.lib.stride_tricks.as_strided(flat, (rows, cols), (ld * flat.itemsize, flat.itemsize)).astype(np.float64)


class ExecutingLt:
    """cublasLt as ModeDevice calls it (LtProjection.product), executing every product on host memory."""

    def __init__(self):
        self.calls = []

    def product(self, shape, a, w, out, data_type, compute, *, bias=0, accumulate=False, workspace=None, sms=0,
                alpha=1.0):
        self.calls.append((shape, data_type, accumulate, bias != 0, alpha))
        item = 4 if data_type == CUDA_R_32F else 2
        for i in range(shape.batch):
            da, dw, do = (i * s for s in shape.strides) if shape.batch > 1 else (0, 0, 0)
            product = alpha * values(a + item * da, data_type, shape.M, shape.K, shape.lda) @ \
                values(w + item * dw, data_type, shape.N, shape.K, shape.ldw).T
            if bias:
                product += memory(bias, np.float32, shape.N)
            target = memory(out + 4 * do, np.float32, shape.M * shape.N).reshape(shape.M, shape.N)
            target[...] = (target + product) if accumulate else product
        return True


def mode_device(precision: str, chunk=8) -> ModeDevice:
    """A ModeDevice without a GPU: its attributes as __init__ sets them, NumPy for CuPy, ExecutingLt for cublasLt."""
    dev = object.__new__(ModeDevice)
    dev.xp = types.SimpleNamespace(float32=np.float32, empty=lambda shape, dtype: device(np.empty(shape, dtype)),
                                   cuda=types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=0)))
    dev.precision, dev.split, dev.x3_chunk = precision, precision == "float32x3", chunk
    dev.x3_parts, dev.x3_splitk = ("tf32" if dev.split else None), False
    dev.lt, dev.partials, dev.rounded, dev.workspaces, dev.sms = ExecutingLt(), {}, {}, {}, 0
    return dev


@pytest.fixture
def host_fold(monkeypatch):
    """kernels/split_products.cu's fold_x3 as fold_numpy, on the partial's memory."""
    def fold(xp, partial, out, R, N, count, scale=1.0):
        out[...] = fold_numpy(np.asarray(partial, dtype=np.float64).ravel(), R, N, count, scale)
    monkeypatch.setattr(mode_devices, "fold", fold)


def case(R, K, N, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((R, K)).astype(np.float32), rng.standard_normal((N, K)).astype(np.float32)


def emulated(w, x, precision):
    return mode_matmul(w.astype(np.float64), x.astype(np.float64), precision, lambda a, b: b @ a.T)


@pytest.mark.parametrize("splitk", [False, True])
@pytest.mark.parametrize("parts", ["tf32", "fp16"])
@pytest.mark.parametrize("R, K, N, chunk", [(3, 37, 5, 8), (4, 98, 6, 32), (2, 24, 3, None), (5, 12, 7, 4)])
def test_float32x3s_step_product_as_issued(host_fold, R, K, N, chunk, parts, splitk):
    """The parts as TF32 values (fp32 products) or as fp16 ones (fp16 products, the lo parts times 2^11, which the
    fold takes off), the W_hi product's K chunks as a strided batch of planes or as cublasLt's split-K (one plane;
    the stand-in executes the product whole, as cublasLt defines it): the emulation's value, from the addresses
    ModeDevice computes for each."""
    x, w = case(R, K, N)
    dev = mode_device("float32x3", chunk)
    dev.x3_splitk = splitk
    dtype = np.float16 if parts == "fp16" else np.float32
    parts_x = device(split_into(np, x, np.empty((2, R, K), dtype), parts))     # the kernels' copy of the operand
    weight = ModeWeight(device(stack_split(np, w, parts)), False, parts)
    assert weight.stored.dtype == dtype
    out = device(np.full((R, N), np.nan, np.float32))
    dev.product(parts_x, weight, out)
    np.testing.assert_allclose(out, emulated(w, x, "float32x3"), rtol=2e-6, atol=2e-6)
    chunks = chunking(K, chunk)
    if splitk and chunks.count > 1:
        assert [(c[0].batch, c[0].splits, c[0].K) for c in dev.lt.calls] == [(1, chunks.count, K), (1, 1, K)]
        chunks = chunking(K, None)                     # one plane of P1
    else:
        assert [c[0].batch for c in dev.lt.calls] == [chunks.full] + [1] * (1 + (chunks.rest > 0))
    assert {c[1] for c in dev.lt.calls} == {CUDA_R_16F if parts == "fp16" else CUDA_R_32F}
    # folded in the kernels instead: P left in the product's buffer, whose fold is the same sum
    left = Left("fold", chunks.count, LO_SCALE[parts])
    partial = device(np.full(left.floats(R, N), np.nan, np.float32))
    dev.product(parts_x, weight, partial, left)
    np.testing.assert_array_equal(fold_numpy(partial.astype(np.float64), R, N, chunks.count, LO_SCALE[parts])
                                  .astype(np.float32), out)


def test_float32x3s_step_product_refuses_parts_that_do_not_match(host_fold):
    x, w = case(3, 16, 4)
    dev = mode_device("float32x3", None)
    parts_x = device(split_into(np, x, np.empty((2, 3, 16), np.float32)))
    weight = ModeWeight(device(stack_split(np, w, "fp16")), False, "fp16")
    with pytest.raises(BackendError, match="float32 parts against a weight in float16 parts"):
        dev.product(parts_x, weight, device(np.zeros((3, 4), np.float32)))


@pytest.mark.parametrize("parts", ["tf32", "fp16"])
@pytest.mark.parametrize("M, K, N, chunk", [(9, 37, 5, 8), (6, 20, 4, None)])
def test_float32x3s_projection_as_issued(host_fold, M, K, N, chunk, parts):
    """The parts as TF32 values, or as fp16 ones whose two small products (x_hi W_lo with the bias, x_lo W_hi) take
    an alpha of 2^-11 and the chunks of x_hi W_hi none: the emulation's value."""
    x, w = case(M, K, N, seed=1)
    bias = device(np.random.default_rng(2).standard_normal(N).astype(np.float32))
    dev = mode_device("float32x3", chunk)
    dtype = np.float16 if parts == "fp16" else np.float32
    split = device(split_into(np, x, np.empty((2, M, K), dtype), parts))
    out = device(np.full((M, N), np.nan, np.float32))
    dev._split_products(split, ModeWeight(device(stack_split(np, w, parts)), False, parts), out, bias)
    np.testing.assert_allclose(out, emulated(w, x, "float32x3") + bias, rtol=2e-6, atol=2e-6)
    assert [(c[2], c[3]) for c in dev.lt.calls] == [(False, True)] + [(True, False)] * (len(dev.lt.calls) - 1)
    small = 1 / LO_SCALE[parts]
    assert [c[4] for c in dev.lt.calls] == [small, small] + [1.0] * (len(dev.lt.calls) - 2)
    assert {c[1] for c in dev.lt.calls} == {CUDA_R_16F if parts == "fp16" else CUDA_R_32F}


@pytest.mark.parametrize("M, K, N", [(9, 600, 5), (6, 20, 4), (3, 256, 2)])
def test_the_schedules_float32x3_projection_through_cublaslt(monkeypatch, M, K, N):
    """engine/schedules/project.py's float32x3 products through cublasLt (capturable, where CuPy's cuBLAS is not):
    x_hi w_lo with the bias, then x_lo w_hi, then x_hi w_hi in K chunks of 256, each added; the emulation's value."""
    x, w = case(M, K, N, seed=4)
    bias = device(np.random.default_rng(5).standard_normal(N).astype(np.float32))
    lt = ExecutingLt()
    monkeypatch.setattr(project.LtProjection, "on_current_device", classmethod(lambda cls, cupy: lt))
    monkeypatch.setattr(project, "split_tf32", lambda xp, a: tuple(device(p.astype(np.float32)) for p in split_tf32(a)))
    out = device(np.full((M, N), np.nan, np.float32))
    assert project.split_products_lt(np, device(x), device(w), bias, out)
    np.testing.assert_allclose(out, emulated(w, x, "float32x3") + bias, rtol=2e-6, atol=2e-6)
    chunks = -(-K // project.K_CHUNK_X3)
    assert [(c[0].K, c[2], c[3]) for c in lt.calls] == [(K, False, True), (K, True, False)] + [
        (min(project.K_CHUNK_X3, K - k * project.K_CHUNK_X3), True, False) for k in range(chunks)]
    assert not project.split_products_lt(np, device(x), device(w).T, bias, out)       # strided: the cuBLAS path


@pytest.mark.parametrize("precision", ["bfloat16", "tf32"])
@pytest.mark.parametrize("slices", [2, 4])
def test_k_slices_as_issued(precision, slices):
    R, K, N = 3, 64, 5
    x, w = case(R, K, N, seed=3)
    dev = mode_device(precision)
    if precision == "bfloat16":
        store = lambda a: (round_operand(a, "bfloat16").astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # noqa: E731
    else:
        store = lambda a: round_operand(a, "tf32").astype(np.float32)  # noqa: E731
    out = device(np.full(slices * R * N, np.nan, np.float32))
    dev.product(device(store(x)), ModeWeight(device(store(w)), False), out, Left("planes", slices))
    planes = out.reshape(slices, R, N).astype(np.float64)
    assert not np.isnan(planes).any()
    np.testing.assert_allclose(planes.sum(axis=0), emulated(w, x, precision), rtol=1e-6, atol=1e-6)
    ((shape, data_type, accumulate, bias, _),) = dev.lt.calls
    assert (shape.batch, shape.K, shape.lda, data_type, accumulate, bias) == (
        slices, K // slices, K, CUDA_R_16BF if precision == "bfloat16" else CUDA_R_32F, False, False)


@pytest.mark.parametrize("refusal", ["no algorithm", "status 15"])
def test_a_refused_split_k_is_named_with_its_way_back(host_fold, refusal):
    """x3_splitk: where cublasLt offers no algorithm that splits K (or the splits' planes pass the workspace), or
    refuses the call, X3SplitKError names the product and the split and points at x3_splitk=False (FusedModeProgram
    catches it and runs again with the batch)."""
    x, w = case(4, 98, 6)
    dev = mode_device("float32x3", 32)
    dev.x3_splitk = True

    def refuse(shape, *args, **kw):
        if shape.splits > 1 and refusal == "status 15":
            raise LtError("the input projection's cublasLtMatmul returned cuBLAS status 15 (not supported)")
        return shape.splits == 1
    dev.lt = types.SimpleNamespace(product=refuse)
    parts_x = device(split_into(np, x, np.empty((2, 4, 98), np.float16), "fp16"))
    weight = ModeWeight(device(stack_split(np, w, "fp16")), False, "fp16")
    says = "cuBLAS status 15" if refusal == "status 15" else "offers no algorithm that splits"
    with pytest.raises(X3SplitKError, match=f"{says}.*hint: x3_splitk=False multiplies the K chunks as a strided batch"):
        dev.product(parts_x, weight, device(np.zeros((4, 6), np.float32)))
