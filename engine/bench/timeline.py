"""A measured timeline of one fused run: CUDA events around every GEMM and kernel, per layer stream.

The Schedule page draws it as a Gantt chart: it shows the wavefront as it really ran (layers
overlapping along the diagonals) and where each step's time goes (GEMM vs fused kernel vs gaps).
The events themselves add a little time; the benchmark harness times runs without them.
"""
from __future__ import annotations

import numpy as np

from .. import backends
from ..backends import fused
from ..errors import BackendError
from ..gallery import Preset, get
from ..ir import CellGraph
from ..network import Network
from ..params import init_params

MAX_LAYER_STEPS = 4096   # more bars than a chart can show readably


def timeline(cell: CellGraph | Preset | str, input_size: int, hidden_size: int, num_layers: int = 1,
             steps: int = 16, batch: int = 8, seed: int = 0, **_ignored) -> list[dict]:
    """Run the fused backend once (after a warm-up) with timing events; return one dict per stage:
    {"name": GEMM or kernel name, "lane": "layer l", "layer": l, "t": step, "start_ms", "end_ms"}."""
    ok, why = backends.gpu_status()
    if not ok:
        raise BackendError(f"a measured timeline needs a GPU: {why}")
    if isinstance(cell, str):
        cell = get(cell).cell
    elif isinstance(cell, Preset):
        cell = cell.cell
    if num_layers * steps > MAX_LAYER_STEPS:
        raise BackendError(f"steps={steps} x num_layers={num_layers} gives {num_layers * steps} layer-steps; a "
                           f"timeline shows at most {MAX_LAYER_STEPS}. hint: measure fewer steps (e.g. 32)")
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    network = Network(cell, input_size, hidden_size, num_layers)
    params = init_params(network, seed=seed, dtype=np.float32)
    x = cupy.asarray(np.random.default_rng(seed + 1).standard_normal((steps, batch, input_size)),
                     dtype=cupy.float32)
    program = fused.prepare(network, params)
    program.run(x)                                    # warm-up: compile, upload, allocate
    device = program.executor(steps, batch).device
    origin = cupy.cuda.Event()
    origin.record()
    device.trace = []
    try:
        program.run(x)
        marks = device.trace
    finally:
        device.trace = None
    cupy.cuda.Device().synchronize()
    events = []
    for name, layer, t, start, end in marks:
        events.append({"name": name, "lane": f"layer {layer}", "layer": layer, "t": t,
                       "start_ms": float(cupy.cuda.get_elapsed_time(origin, start)),
                       "end_ms": float(cupy.cuda.get_elapsed_time(origin, end))})
    return sorted(events, key=lambda e: (e["layer"], e["start_ms"]))
