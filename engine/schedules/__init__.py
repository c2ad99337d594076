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

Inside the folder imports go one way: report -> autotune -> registry -> graph, persistent -> base -> steps, project,
tiling. The folder may import engine.backends, engine.codegen, engine.plan, engine.nets.data (the Pool type) and
lower modules; never engine.nets' runner, engine.multigpu, engine.bench, engine.explain, engine.export or
engine.api.
"""
from __future__ import annotations

from .registry import SCHEDULES, schedule_class

__all__ = ["SCHEDULES", "schedule_class"]
