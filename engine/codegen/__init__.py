"""Code generation: readable CUDA C from a Program, and its compilation through CuPy.

Rendering and compiling are cached apart, as CuPy and Triton keep them:
- the render cache here (source text): key = the Program key (cell structural hash + cell name + passes +
  layout + precision + GENERATOR_VERSION) and the documentation text put in the header;
- the compile cache (engine/codegen/nvrtc.py, the one every CUDA module of the engine goes through): key = the
  source's hash and the device, in memory, and the CUBIN by source, options and architecture on disk.

CuPy is imported only by `compile_module` (and engine/codegen/nvrtc.py's functions), so the engine
imports on machines without it.

May import: engine.plan, engine.ir, engine.ops, engine.network, engine.errors. Never: engine.passes or
engine.compiler (the compile step, above both), nor backends, schedules or api.
"""
from __future__ import annotations

import dataclasses
import threading

from ..errors import CompileError
from ..plan import Program
from .cuda import THREADS_PER_BLOCK, helper_source, render_kernel, render_module
from .equations import text_equations
from .nvrtc import load_module, source_hash
from .precision import Precision, precision

# Bump when the generated code changes for the same Program: it is part of every cache key.
GENERATOR_VERSION = 2          # 2: per-head counters, clusters (their autotuner candidates), 2026-11-26

_render_cache: dict[tuple[str, str], tuple[str, dict]] = {}
_lock = threading.Lock()


def with_source(program: Program, doc: str = "") -> Program:
    """The Program with its CUDA module source and each kernel's source filled in (cached)."""
    key = (program.key, doc)
    with _lock:
        rendered = _render_cache.get(key)
    if rendered is None:
        rendered = render_module(program, doc, GENERATOR_VERSION, precision(program.precision))
        with _lock:
            _render_cache[key] = rendered
    source, kernels = rendered
    return dataclasses.replace(program, source=source,
                               kernels=tuple(dataclasses.replace(k, source=kernels[k.name]) for k in program.kernels))


def compile_module(program: Program):
    """A cupy.RawModule with every kernel of the program, compiled for the current device with NVRTC as IEEE fp32
    (engine/codegen/nvrtc.py, which caches it)."""
    import cupy  # deferred: CuPy is optional (no GPU in CI)

    if not program.source:
        program = with_source(program)
    arch = cupy.cuda.Device().compute_capability
    # IEEE fp32: NVRTC without CuPy's -ftz=true; NVRTC's refusal is a CompileError there (codegen/nvrtc.py)
    module = load_module(program.source, cell=program.cell.name)
    for kernel in program.kernels:
        try:
            module.get_function(kernel.name)      # loads now, so errors surface here
        except cupy.cuda.driver.CUDADriverError as e:
            raise CompileError(f"kernel {kernel.name} of cell '{program.cell.name}' did not load for sm_{arch}: {e}"
                               "\n  hint: this is a bug in engine.codegen; `python -m engine explain <cell>` prints "
                               "the source") from None
    return module


__all__ = ["GENERATOR_VERSION", "THREADS_PER_BLOCK", "Precision", "compile_module", "helper_source", "precision",
           "render_kernel", "render_module", "source_hash", "text_equations", "with_source"]
