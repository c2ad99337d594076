"""Fixtures shared by the GPU tests. They run on the GPU machine and skip, with the reason, elsewhere.

Only fixtures live here (nothing is registered globally): the `gpu` marker is declared in pytest.ini
and each test module marks itself with `pytestmark = pytest.mark.gpu`.
"""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cupy():
    """The cupy module, when CuPy sees a usable CUDA device; otherwise the test is skipped with the
    reason engine.backends.gpu_status() gives."""
    from engine.backends import gpu_status
    ok, why = gpu_status()
    if not ok:
        pytest.skip(f"no usable GPU: {why}")
    import cupy as module
    return module


@pytest.fixture
def release_gpu_memory():
    """After the test, its fused-training programs, runners (cuBLAS handles and workspaces) and pooled memory
    dropped: a dozen xdist workers share one GPU, and the hundreds of cells and switch settings of the fused-training
    modules would otherwise pile up in each worker's caches until the GPU runs out (cublasCreate failed with status
    3). Those modules use it for every test (pytest.mark.usefixtures)."""
    yield
    import cupy

    from engine.autodiff import fused_cache
    fused_cache.clear_cache()
    fused_cache.clear_runners()
    cupy.get_default_memory_pool().free_all_blocks()
