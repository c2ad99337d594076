"""The headless API: everything the app and the CLI do goes through here.

The top of the engine: it may import any engine module; nothing in engine imports it but engine/__init__.py and
the CLI commands.
"""
from __future__ import annotations

import numpy as np

from . import execute
from .backends.common import RunResult
from .bench import run_bench
from .export import export_cuda as render_export
from .network import Network
from .params import Params


def run(network: Network, params: Params, x, initial_states: dict | None = None, *,
        backend: str = "auto", dtype=np.float32, precision: str = "float32", check_finite: bool = False) -> RunResult:
    """Run the network over x (T, B, I). backend: auto | reference | naive | fused | graph | persistent.

    'auto' runs the autotuned schedule when CuPy sees a GPU (engine.schedules.autotune: it times the
    candidates once per cell, sizes, precision and device, and caches the choice on disk) and the NumPy
    reference otherwise; the choice and its reason are logged and recorded in
    result.info["backend_reason"].

    precision: "float32" (strict, the default), "tf32", "float16" or "bfloat16" (engine.codegen.precision:
    matmul operands rounded to that format, fp32 accumulation, cell math and states). The schedules run
    every mode on the GPU; the reference emulates it on the CPU; naive and fused are float32 only.

    check_finite=True first looks for NaN or Inf in x, the initial states and every parameter, and names the
    first it finds (BackendError), instead of letting it spread through the recurrence.
    """
    return execute.run(network, params, x, initial_states, backend=backend, dtype=dtype, precision=precision,
                       check_finite=check_finite)


def export_cuda(cell_or_preset, input_size: int, hidden_size: int, num_layers: int = 1, **options) -> str:
    """The standalone .cu program for a cell (see engine.export); `python -m engine export` writes it."""
    return render_export(cell_or_preset, input_size, hidden_size, num_layers, **options)


def bench(presets, configs=None, **options):
    """Time every implementation side by side on the GPU (see engine.bench.run_bench)."""
    return run_bench(presets, configs, **options)
