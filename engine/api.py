"""The headless API: everything the app and the CLI do goes through here.

The top of the engine: it may import any engine module; nothing in engine imports it but engine/__init__.py and
the CLI commands.
"""
from __future__ import annotations

import inspect

import numpy as np

from . import backends
from .autodiff import bptt as step_bptt
from .autodiff.checks import check_dtype, check_input_gradient, check_network
from .backends.common import check_finite, check_inputs, check_training_precision
from .backends.lengths import BPTT_BACKENDS, only_on
from .bench import run_bench
from .errors import BackendError
from .execute import run  # engine.run: the backend choice and the run live below the networks that call it too
from .export import export_cuda as render_export
from .params import check_params
from .schedules.scan import analysis_or_refusal, check_mode
from .schedules.scan_grad import scan_gradients

__all__ = ["run", "export_cuda", "bench", "bptt"]


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


def bptt(network, params, x, initial_states: dict | None = None, d_outputs=None, d_final_states: dict | None = None,
         dtype=np.float64, backend: str = "reference", lengths=None, precision: str = "float32",
         input_gradient: bool = True):
    """engine.autodiff.bptt (backend "reference", "naive" or "fused": step by step), or backend="scan" for a cell
    whose recurrence is linear (engine/passes/scan.py): the gradients as scans over the whole sequence
    (engine/schedules/scan_grad.py) on the GPU, CuPy arrays out. A d_outputs given as a function of the outputs
    costs the scan one forward pass more. precision: "tf32", "float16" or "bfloat16" rounds every matmul operand of
    both passes to that format ("fused" and "scan" run it, float32 only; "reference" emulates it;
    engine/autodiff/bptt.py, engine/schedules/scan_modes.py).
    input_gradient=False: x's gradient is not computed (gradients.x is None), as when x is data: "fused" and "scan"
    leave its GEMM out."""
    if not (isinstance(backend, str) and backend == "scan"):
        return step_bptt(network, params, x, initial_states, d_outputs, d_final_states, dtype=dtype, backend=backend,
                         lengths=lengths, precision=precision, input_gradient=input_gradient)
    check_input_gradient(input_gradient)
    if lengths is not None:
        raise only_on("scan", "bptt", takes=BPTT_BACKENDS)
    network, dtype = check_network(network), check_dtype(dtype)
    precision = check_mode(check_training_precision("bptt(backend='scan')", precision), dtype)
    ok, why = backends.gpu_status()
    if not ok:
        raise BackendError(f"bptt(backend='scan') needs a GPU: {why}. hint: backend='reference' on the CPU")
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    analysis_or_refusal(network.cell)
    check_params(network, params)
    x = check_inputs(network, x, initial_states, xp=cupy)
    check_finite(network, params, x, initial_states)
    x = cupy.asarray(x, dtype=dtype)
    if callable(d_outputs):
        d_outputs = d_outputs(run(network, params, x, initial_states, backend="scan", dtype=dtype,
                                  precision=precision).outputs)
    return scan_gradients(network, params, x, initial_states, d_outputs, d_final_states, dtype=dtype, xp=cupy,
                          input_gradient=input_gradient, precision=precision)
