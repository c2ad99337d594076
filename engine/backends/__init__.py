"""Backends share one call signature: run(network, params, x, initial_states=None, dtype=...) -> RunResult.

- reference: NumPy on the CPU, the definition of every op.
- naive: CuPy, one kernel per IR op (the baseline that shows what the passes buy).
- fused: cuBLAS GEMMs + generated fused kernels, hoisted input GEMM, layer wavefront on streams; in tf32,
  float16, bfloat16 and float32x3 through engine/schedules/fused_modes.py (engine.execute routes it).
- graph, persistent: the fast schedules of engine/schedules (one module each), selectable by name.
- scan: a cell whose recurrence is linear (minGRU, minLSTM, QRNN) as a parallel scan over time
  (engine/schedules/scan.py).

'auto' picks the autotuned schedule on a GPU (engine.schedules.autotune) and the reference elsewhere; the
choice and the run are engine/execute.py's (it sits above both folders).

May import: engine.plan, engine.codegen, engine.params, engine.network, engine.ops and lower modules; never
engine.schedules (get() loads a schedule module by name at run time), engine.execute, engine.nets, engine.multigpu,
engine.bench, engine.explain, engine.export or engine.api.
"""
from __future__ import annotations

import importlib
from functools import lru_cache

from ..arguments import shown
from ..errors import BackendError

BACKENDS = ("reference", "naive", "fused", "graph", "persistent", "scan")
GPU_BACKENDS = ("naive", "fused", "graph", "persistent", "scan")
SCHEDULE_BACKENDS = ("graph", "persistent", "scan")      # modules in engine/schedules
PRECISION_BACKENDS = ("graph", "persistent", "scan")     # schedules that also run tf32, float16, bfloat16 (and
#                                                           fused, whose modes live in engine/schedules/fused_modes.py)


@lru_cache(maxsize=1)
def gpu_status() -> tuple[bool, str]:
    """(available, reason): whether CuPy sees a usable CUDA device, and why not."""
    try:
        import cupy  # deferred: CuPy is optional (no GPU in CI)
    except Exception as e:  # ImportError, or a broken CUDA install
        return False, f"CuPy is not importable ({type(e).__name__}: {e})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        if "InsufficientDriver" in str(e):          # also what a machine with no NVIDIA driver at all reports
            return False, f"no NVIDIA driver on this machine, or one too old for this CuPy ({type(e).__name__}: {e})"
        return False, f"CuPy sees no CUDA device ({type(e).__name__}: {e})"
    if n < 1:
        return False, "CuPy sees no CUDA device"
    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return True, f"GPU {name} via CuPy {cupy.__version__}"


def check_name(name) -> str:
    """`name` if it names a backend ('auto' or one of BACKENDS); BackendError naming the argument otherwise. Only the
    argument: whether this machine can run it is select()'s."""
    if not isinstance(name, str) or (name != "auto" and name not in BACKENDS):
        raise BackendError(f"unknown backend {shown(name)}; choose one of: auto, {', '.join(BACKENDS)}; hint: "
                           "backend='auto' picks the fastest where there is a GPU, 'reference' runs NumPy")
    return name


def select(name: str = "auto") -> tuple[str, str]:
    """Resolve 'auto' to a backend name, with the reason (the caller shows it); BackendError where this machine
    cannot run the backend named."""
    check_name(name)
    if name == "auto":
        ok, why = gpu_status()
        return ("auto", f"using the autotuned schedule on {why}") if ok else (
            "reference", f"using backend 'reference' (NumPy on the CPU): {why}")
    if name in GPU_BACKENDS:
        ok, why = gpu_status()
        if not ok:
            raise BackendError(f"backend '{name}' needs a GPU: {why}. hint: use backend='reference' on the CPU")
    return name, f"using backend '{name}'"


def get(name: str):
    """The backend module, which has run(network, params, x, initial_states=None, dtype=...)."""
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {shown(name)}; choose one of: {', '.join(BACKENDS)}; hint: "
                           "backend='reference' runs NumPy on the CPU")
    if name in SCHEDULE_BACKENDS:
        return importlib.import_module(f"engine.schedules.{name}")
    return importlib.import_module(f"engine.backends.{name}")
