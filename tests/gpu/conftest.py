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
