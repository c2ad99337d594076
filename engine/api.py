"""The headless API: everything the app and the CLI do goes through here.

The top of the engine: it may import any engine module; nothing in engine imports it but engine/__init__.py and
the CLI commands.
"""
from __future__ import annotations

from .bench import run_bench
from .execute import run  # engine.run: the backend choice and the run live below the networks that call it too
from .export import export_cuda as render_export

__all__ = ["run", "export_cuda", "bench"]


def export_cuda(cell_or_preset, input_size: int, hidden_size: int, num_layers: int = 1, **options) -> str:
    """The standalone .cu program for a cell (see engine.export); `python -m engine export` writes it."""
    return render_export(cell_or_preset, input_size, hidden_size, num_layers, **options)


def bench(presets, configs=None, **options):
    """Time every implementation side by side on the GPU (see engine.bench.run_bench)."""
    return run_bench(presets, configs, **options)
