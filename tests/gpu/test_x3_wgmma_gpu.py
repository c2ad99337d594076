"""float32x3's step product on the engine's own wgmma kernel (kernels/x3_wgmma.cu, engine/schedules/x3_wgmma.py) on
the GPU: the product of tiled fp16 parts against what the kernel computes in float64 sums (promoted_numpy) and
against float64, at sizes padded in every dimension, in both ring depths (2 and 4 slots), its output poisoned first;
the split of an operand into tiles (split_tiles_fp16) is the host's layout bit for bit and flags values past fp16's
range. Whole runs of every preset on it: tests/gpu/test_precision_fp32x3_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest

from engine.schedules import x3_wgmma
from engine.schedules.split_products import split_into

pytestmark = pytest.mark.gpu


@pytest.fixture
def hopper(cupy):
    if not x3_wgmma.wgmma_capable(cupy):
        pytest.skip("the wgmma product runs on sm_90 (H100, H200) only")
    return cupy


@pytest.mark.parametrize("slots", [2, 4])
@pytest.mark.parametrize("R, K, N, promote", [(64, 64, 64, 128), (19, 129, 516, 128), (130, 1024, 200, 256),
                                              (16, 2560, 192, 512), (128, 1000, 4096, 64)])
def test_the_product_is_the_promoted_sum_of_the_parts(hopper, monkeypatch, slots, R, K, N, promote):
    cupy = hopper
    monkeypatch.setattr(x3_wgmma, "stages", lambda cupy, blocks: slots)
    rng = np.random.default_rng(R + K + N)
    h = rng.uniform(-1, 1, (R, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / K ** 0.5).astype(np.float32)
    operand = x3_wgmma.tiled_operand(cupy, R, K, poison=True)
    flag = cupy.zeros(1, dtype=cupy.uint32)
    x3_wgmma.tile_split_into(cupy, cupy.asarray(h), operand, flag)
    weight = x3_wgmma.tile_weight(cupy, cupy.asarray(w))
    out = cupy.full((R, N), np.nan, dtype=cupy.float32)
    x3_wgmma.promoted_product(cupy, operand, weight, out, R, K, N, promote)
    got = cupy.asnumpy(out).astype(np.float64)
    assert not np.isnan(got).any(), "an output left unwritten (still the poison)"
    want = x3_wgmma.promoted_numpy(h, w, promote)
    exact = h.astype(np.float64) @ w.astype(np.float64).T
    to_want = np.linalg.norm(got - want) / np.linalg.norm(want)
    to_exact = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    assert to_want < 1e-6, f"{to_want:.3g} from the promoted sums of the parts"      # fp32 accumulation only
    assert to_exact < 2e-6, f"{to_exact:.3g} from float64"
    assert not int(flag.get()[0])
    again = cupy.full((R, N), np.nan, dtype=cupy.float32)
    x3_wgmma.promoted_product(cupy, operand, weight, again, R, K, N, promote)
    np.testing.assert_array_equal(cupy.asnumpy(again), cupy.asnumpy(out))       # a rerun: the same bits


def test_the_split_into_tiles_is_the_hosts_layout(hopper):
    cupy = hopper
    R, K = 37, 200
    h = np.random.default_rng(3).standard_normal((R, K)).astype(np.float32) * 100
    h[5, 7] = 7.0e4                                                                 # past fp16's range
    operand = x3_wgmma.tiled_operand(cupy, R, K, poison=False)
    flag = cupy.zeros(1, dtype=cupy.uint32)
    x3_wgmma.tile_split_into(cupy, cupy.asarray(h), operand, flag)
    parts = split_into(np, h, np.empty((2, R, K), np.float16), "fp16")
    want = x3_wgmma.tiled(np, parts, R, K)
    np.testing.assert_array_equal(cupy.asnumpy(operand).view(np.uint16).ravel(), want.view(np.uint16))
    assert int(flag.get()[0]) == 1
