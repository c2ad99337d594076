"""float32x3's step product on the engine's own wgmma kernel (kernels/x3_wgmma.cu, engine/schedules/wgmma_products.py) on
the GPU: the product of tiled fp16 parts against what the kernel computes in float64 sums (promoted_numpy) and
against float64, at sizes padded in every dimension, in both ring depths (2 and 4 slots), its output poisoned first;
the split of an operand into tiles (split_tiles_fp16) is the host's layout bit for bit and flags values past fp16's
range. The reduced modes' kernel (mode_product, kernels/mode_wgmma.cu) against float64 products of the rounded
operands, in both its ring depths (4 and 8 slots), and kernels/mode_wide.cu where a 16-bit weight is past the L2, and
the rounding into tiles (round_tiles_into) bit for bit. Whole
runs of every preset on them: tests/gpu/test_precision_fp32x3_gpu.py, tests/gpu/test_fused_modes_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest

from engine.rounding import round_operand
from engine.schedules import wgmma_products
from engine.schedules.cublaslt import LtProjection, Product
from engine.schedules.project import LT_OPERANDS, operand_dtype, round_into
from engine.schedules.split_products import split_into

pytestmark = pytest.mark.gpu


@pytest.fixture
def hopper(cupy):
    if not wgmma_products.wgmma_capable(cupy):
        pytest.skip("the wgmma product runs on sm_90 (H100, H200) only")
    return cupy


KERNELS = {"one warpgroup, 2 slots": lambda cupy, blocks, promote: ("x3_wgmma_2", 128, wgmma_products.smem_bytes(2)),
           "one warpgroup, 4 slots": lambda cupy, blocks, promote: ("x3_wgmma_4", 128, wgmma_products.smem_bytes(4)),
           "as the engine picks": wgmma_products.x3_kernel}


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("R, K, N, promote", [(64, 64, 64, 128), (19, 129, 516, 128), (130, 1024, 200, 256),
                                              (16, 2560, 192, 512), (128, 1000, 4096, 64), (64, 64, 64, 64),
                                              (19, 129, 516, 64), (130, 1000, 200, 64), (16, 2560, 192, 64)])
def test_the_product_is_the_promoted_sum_of_the_parts(hopper, monkeypatch, kernel, R, K, N, promote):
    """In each kernel: one warpgroup at either ring depth, and the engine's pick (two warpgroups a block where the grid
    fits the SMs once and promote is 64: every case here with promote 64 but (128, 1000, 4096), 128 blocks on 132 SMs
    and more on smaller GPUs, whichever it gets)."""
    cupy = hopper
    monkeypatch.setattr(wgmma_products, "x3_kernel", KERNELS[kernel])
    rng = np.random.default_rng(R + K + N)
    h = rng.uniform(-1, 1, (R, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / K ** 0.5).astype(np.float32)
    operand = wgmma_products.tiled_operand(cupy, R, K, poison=True)
    flag = cupy.zeros(1, dtype=cupy.uint32)
    wgmma_products.tile_split_into(cupy, cupy.asarray(h), operand, flag)
    weight = wgmma_products.tile_weight(cupy, cupy.asarray(w))
    out = cupy.full((R, N), np.nan, dtype=cupy.float32)
    wgmma_products.promoted_product(cupy, operand, weight, out, R, K, N, promote)
    got = cupy.asnumpy(out).astype(np.float64)
    assert not np.isnan(got).any(), "an output left unwritten (still the poison)"
    want = wgmma_products.promoted_numpy(h, w, promote)
    exact = h.astype(np.float64) @ w.astype(np.float64).T
    to_want = np.linalg.norm(got - want) / np.linalg.norm(want)
    to_exact = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    assert to_want < 1e-6, f"{to_want:.3g} from the promoted sums of the parts"      # fp32 accumulation only
    assert to_exact < 2e-6, f"{to_exact:.3g} from float64"
    assert not int(flag.get()[0])
    again = cupy.full((R, N), np.nan, dtype=cupy.float32)
    wgmma_products.promoted_product(cupy, operand, weight, again, R, K, N, promote)
    np.testing.assert_array_equal(cupy.asnumpy(again), cupy.asnumpy(out))       # a rerun: the same bits


def test_the_split_into_tiles_is_the_hosts_layout(hopper):
    cupy = hopper
    R, K = 37, 200
    h = np.random.default_rng(3).standard_normal((R, K)).astype(np.float32) * 100
    h[5, 7] = 7.0e4                                                                 # past fp16's range
    operand = wgmma_products.tiled_operand(cupy, R, K, poison=False)
    flag = cupy.zeros(1, dtype=cupy.uint32)
    wgmma_products.tile_split_into(cupy, cupy.asarray(h), operand, flag)
    parts = split_into(np, h, np.empty((2, R, K), np.float16), "fp16")
    want = wgmma_products.tiled(np, parts, R, K)
    np.testing.assert_array_equal(cupy.asnumpy(operand).view(np.uint16).ravel(), want.view(np.uint16))
    assert int(flag.get()[0]) == 1


@pytest.mark.parametrize("slots", [4, 8])
@pytest.mark.parametrize("precision", ["tf32", "float16", "bfloat16"])
@pytest.mark.parametrize("R, K, N", [(64, 64, 64), (19, 129, 516), (130, 1000, 200), (16, 2560, 192)])
def test_a_modes_product_is_the_rounded_operands_product(hopper, monkeypatch, slots, precision, R, K, N):
    """One fp32 accumulator over K, as cuBLAS's: against the float64 product of the same rounded operands (the mode's
    own error is the rounding, which both share), no further off than cublasLt's product of them, or than the drift of
    one tensor-core accumulator over K (4e-9 K: 6e-6 at K = 2560 in tf32 on an H200, 2026-11-28, where cublasLt's
    was the same; at a narrow N cublasLt splits K and drifts less), a hundredth of the mode's own rounding error."""
    monkeypatch.setattr(wgmma_products, "mode_stages", lambda cupy, blocks: slots)
    assert not wgmma_products.goes_wide(hopper, precision, N, K)
    check_mode_product(hopper, precision, R, K, N)


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
@pytest.mark.parametrize("R, K, N", [(19, 129, 1000), (130, 1000, 200), (64, 2560, 10240)])
def test_a_streamed_weight_goes_wide(hopper, monkeypatch, precision, R, K, N):
    """kernels/mode_wide.cu (128 weight rows a block, clusters of two splitting K, the weight's first part
    evict_last), the same checks: blogA's LSTM (R = 64, K = 2560, N = 10240: 52 MB, past the L2 as it is), and two
    smaller weights made "streamed" (STREAMED 0), one with two blocks of batch rows."""
    if N != 10240:
        monkeypatch.setattr(wgmma_products, "STREAMED", 0.0)
    assert wgmma_products.goes_wide(hopper, precision, N, K)
    check_mode_product(hopper, precision, R, K, N)


def check_mode_product(cupy, precision: str, R: int, K: int, N: int) -> None:
    """mode_product against the float64 product of the rounded operands and cublasLt's error, its output poisoned
    first, and a rerun bit-identical."""
    rng = np.random.default_rng(R + K + N)
    h = rng.uniform(-1, 1, (R, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / K ** 0.5).astype(np.float32)
    operand = wgmma_products.tiled_mode_operand(cupy, R, K, precision, poison=True)
    wgmma_products.round_tiles_into(cupy, cupy.asarray(h), operand, precision)
    weight = wgmma_products.tile_mode_weight(cupy, cupy.asarray(w), precision)
    out = cupy.full((R, N), np.nan, dtype=cupy.float32)
    wgmma_products.mode_product(cupy, operand, weight, out, R, K, N, precision)
    got = cupy.asnumpy(out).astype(np.float64)
    assert not np.isnan(got).any(), "an output left unwritten (still the poison)"
    want = round_operand(h, precision).astype(np.float64) @ round_operand(w, precision).astype(np.float64).T
    error = np.linalg.norm(got - want) / np.linalg.norm(want)
    dtype = operand_dtype(cupy, precision)
    hr = round_into(cupy, cupy.asarray(h), cupy.empty((R, K), dtype=dtype), precision)
    wr = round_into(cupy, cupy.asarray(w), cupy.empty((N, K), dtype=dtype), precision)
    lt = cupy.full((R, N), np.nan, dtype=cupy.float32)
    assert LtProjection.on_current_device(cupy).product(Product.dense(R, N, K), hr.data.ptr, wr.data.ptr, lt.data.ptr,
                                                        *LT_OPERANDS[precision])
    lt_error = np.linalg.norm(cupy.asnumpy(lt) - want) / np.linalg.norm(want)
    assert error <= max(1.5 * lt_error + 1e-7, 4e-9 * K), f"{error:.3g} from float64 against cublasLt's {lt_error:.3g}"
    again = cupy.full((R, N), np.nan, dtype=cupy.float32)
    wgmma_products.mode_product(cupy, operand, weight, again, R, K, N, precision)
    np.testing.assert_array_equal(cupy.asnumpy(again), cupy.asnumpy(out))


@pytest.mark.parametrize("precision", ["tf32", "float16", "bfloat16"])
def test_the_rounding_into_tiles_is_the_hosts_layout(hopper, precision):
    cupy = hopper
    R, K = 37, 200
    h = cupy.asarray(np.random.default_rng(4).standard_normal((R, K)).astype(np.float32))
    copy = wgmma_products.tiled_mode_operand(cupy, R, K, precision, poison=False)
    wgmma_products.round_tiles_into(cupy, h, copy, precision)
    rounded = round_into(cupy, h, cupy.empty((R, K), dtype=operand_dtype(cupy, precision)), precision)
    want = wgmma_products.tiled(cupy, rounded, R, K)
    bits = cupy.uint32 if precision == "tf32" else cupy.uint16
    np.testing.assert_array_equal(cupy.asnumpy(copy.view(bits).ravel()), cupy.asnumpy(want.view(bits)))
