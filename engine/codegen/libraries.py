"""The CUDA libraries the engine calls through ctypes (cuBLAS for the fused training step, cublasLt for the schedules'
projections): the copy CuPy loaded, so every call goes to the same library as CuPy's own."""
from __future__ import annotations

import ctypes.util


def loaded_library(stem: str) -> str:
    """The path of lib<stem>.so as this process has it mapped (CuPy's cuBLAS module brings libcublas and
    libcublasLt with it), else the one the loader finds."""
    # deferred: CuPy is optional (no GPU in CI); importing its cuBLAS module loads libcublas and libcublasLt
    from cupy_backends.cuda.libs import cublas  # noqa: F401
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if f"/lib{stem}.so" in path:
                    return path
    except OSError:
        pass
    found = ctypes.util.find_library(stem)
    if found is None:
        raise RuntimeError(f"lib{stem} was not found in the process or on the loader's path")
    return found
