"""benchmarks/probe_x3_promote.py on the CPU: its kernel (float32x3's product in fp16 parts on wgmma, each K chunk's
accumulator promoted into an fp32 sum in registers) compiles with nvcc for sm_90a, its ring fits an H100's or H200's
shared memory, and what it computes (promoted_numpy) is float32x3's product of the fp16 parts: the fold of the fused
backend's chunked product (split_products.stacked_product_numpy), and within fp32's reach of float64. The GPU runs
it against the float64 product and cublasLt."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from nvcc_check import compile_sources
from script_loader import load_script

from engine.schedules.split_products import chunking, split_into, stack_split, stacked_product_numpy

SHARED_MEMORY_SM90 = 227 * 1024           # the opt-in dynamic shared memory of a block on an H100 / H200


def probe():
    return load_script("probe_x3_promote")


def test_the_ring_fits_and_every_shape_tiles():
    module = probe()
    assert module.smem_bytes() <= SHARED_MEMORY_SM90
    for _, _, R, K, N in module.SHAPES:
        assert R % 64 == 0 and K % 64 == 0 and N % 64 == 0, (R, K, N)


@pytest.mark.parametrize("promote", [1, 2, 4])
def test_the_promoted_sums_are_float32x3s_product_of_the_fp16_parts(promote):
    module = probe()
    rng = np.random.default_rng(promote)
    R, K, N = 64, 512, 64
    h = rng.uniform(-1, 1, (R, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / K ** 0.5).astype(np.float32)
    parts = split_into(np, h, np.empty((2, R, K), np.float16), "fp16").astype(np.float64)
    stacked = stack_split(np, w, "fp16").astype(np.float64)
    got = module.promoted_numpy(parts, stacked, promote)
    want = stacked_product_numpy(parts, stacked, chunking(K, 64 * promote), 2048.0)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    exact = h.astype(np.float64) @ w.astype(np.float64).T
    assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < 1e-6        # fp32's level: the lo x lo dropped


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (the probe's CUDA is compiled there)")
def test_the_kernel_compiles_for_sm90a(tmp_path):
    source = probe().kernel_source()
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in source
    compile_sources({"probe_x3_promote": source}, tmp_path)
