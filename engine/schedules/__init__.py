"""Fast schedules beside the fused backend, one module each, each a small class: plan -> compile -> run.

- graph (graph.py): one generated kernel per stage of every wavefront step (all layers of the step in
  one launch, recurrent GEMM tile + fused cell math), captured once into a CUDA graph and replayed.
- persistent (persistent.py): the whole sequence in one cooperative launch, weight slices resident in
  shared memory, a grid-wide barrier per stage of each wavefront step (or per-layer arrival counters).
- autotune (autotune.py): times the candidates (these two with a few tilings, and the fused backend)
  for a (cell, sizes, precision, device) and caches the choice on disk; backend="auto" uses it.

Shared pieces: tiling.py (which block owns which hidden units; shared-memory layout), base.py (host
side: buffers, packed weights, the per-layer argument table, the run), and the CUDA generator
engine/codegen/wavefront.py with the hand-written tile GEMM kernels/tile_gemm.cuh.
"""
from __future__ import annotations

SCHEDULES = ("graph", "persistent")


def schedule_class(name: str):
    if name == "graph":
        from .graph import GraphSchedule
        return GraphSchedule
    if name == "persistent":
        from .persistent import PersistentSchedule
        return PersistentSchedule
    from ..errors import BackendError
    raise BackendError(f"unknown schedule '{name}'; choose one of: {', '.join(SCHEDULES)}")
