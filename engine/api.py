"""The headless API: everything the app and the CLI do goes through here."""
from __future__ import annotations

import logging

import numpy as np

from . import backends
from .backends.common import RunResult
from .network import Network
from .params import Params

log = logging.getLogger("engine")


def run(network: Network, params: Params, x, initial_states: dict | None = None, *,
        backend: str = "auto", dtype=np.float32) -> RunResult:
    """Run the network over x (T, B, I). backend: auto | reference | naive | fused.

    'auto' picks the GPU ('fused') when CuPy sees one and the NumPy reference otherwise; the choice
    and its reason are logged and recorded in result.info["backend_reason"].
    """
    name, reason = backends.select(backend)
    if backend == "auto":
        log.warning(reason)
    result = backends.get(name).run(network, params, x, initial_states, dtype=dtype)
    result.backend = name
    result.info = dict(result.info or {}, backend_reason=reason)
    return result


def export_cuda(cell_or_preset, input_size: int, hidden_size: int, num_layers: int = 1, **options) -> str:
    """The standalone .cu program for a cell (see engine.export); `python -m engine export` writes it."""
    from .export import export_cuda as render
    return render(cell_or_preset, input_size, hidden_size, num_layers, **options)


def bench(presets, configs=None, **options):
    """Time every implementation side by side on the GPU (see engine.bench.run_bench)."""
    from .bench import run_bench
    return run_bench(presets, configs, **options)
