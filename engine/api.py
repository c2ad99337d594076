"""The headless API: everything the app and the CLI do goes through here.

The top of the engine: it may import any engine module; nothing in engine imports it but engine/__init__.py and
the CLI commands.
"""
from __future__ import annotations

import inspect

from .bench import run_bench
from .errors import BackendError
from .execute import run  # engine.run: the backend choice and the run live below the networks that call it too
from .export import export_cuda as render_export

__all__ = ["run", "export_cuda", "bench"]


def check_options(function, options: dict, what: str) -> None:
    """Refuse keyword options `function` does not take, naming them and listing the ones it does."""
    known = [name for name, p in inspect.signature(function).parameters.items()
             if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    unknown = sorted(str(k) for k in options if k not in known)
    if unknown:
        raise BackendError(f"{what}: unknown option(s) {', '.join(unknown)}; hint: the options are "
                           f"{', '.join(known)}")


def export_cuda(cell_or_preset, input_size: int, hidden_size: int, num_layers: int = 1, **options) -> str:
    """The standalone .cu program for a cell (see engine.export); `python -m engine export` writes it."""
    check_options(render_export, options, "export_cuda")
    return render_export(cell_or_preset, input_size, hidden_size, num_layers, **options)


def bench(presets, configs=None, **options):
    """Time every implementation side by side on the GPU (see engine.bench.run_bench). `presets` is one preset
    name, Preset or CellGraph, or a list of them."""
    check_options(run_bench, options, "bench")
    return run_bench(presets, configs, **options)
