"""Schedule 'graph': one launch per stage of every wavefront step, captured once into a CUDA graph.

Plan: the wavefront tiling (engine/schedules/tiling.py), no weights resident (each launch is a fresh
kernel). Compile: `<cell>_wave_s<stage>` per stage. Launch: (T + L - 1) x stages kernels, in order on
one stream; the kernel boundary is the barrier between stages. The launches are captured into a
CUDA graph when the (T, B) is first seen and replayed on every run, so the host issues one graph
launch per sequence instead of (T + L - 1) x stages kernel launches (about 1 us each from a graph
against 7 us each from Python on an H200). cuBLAS stays outside the graph (CuPy refuses cuBLAS
during capture): a one-layer network's input projection runs before the replay.
"""
from __future__ import annotations

import numpy as np

from ..chunk_replay import capture_graph
from ..errors import BackendError
from .base import WavefrontSchedule


class GraphSchedule(WavefrontSchedule):
    name = "graph"
    persistent = False

    def _prepare_launch(self, T: int, B: int) -> None:
        args = self._launch_args(T)
        try:
            self.graph, _ = capture_graph(self.cupy, lambda: self._issue(args))
        except Exception as e:
            raise BackendError(f"schedule 'graph' could not capture its {len(args)} launches into a CUDA graph: "
                               f"{type(e).__name__}: {e}; hint: use backend='persistent' or 'fused'") from None

    def _wavefront(self, T: int) -> int:
        return self.wavefront_steps(0) if self.pools else T + self.network.num_layers - 1

    def _launch_args(self, T: int) -> list:
        steps = self._wavefront(T)
        return [(kernel, (self.args, np.int32(steps if self.pools else T), np.int32(k))) for k in range(steps)
                for kernel in self.kernels]

    def _issue(self, launches) -> None:
        grid, block, smem = (self.tiling.blocks,), (self.tiling.config.threads,), self.tiling.smem_bytes
        for kernel, args in launches:
            kernel(grid, block, args, shared_mem=smem)

    def _launch(self, T: int, B: int, first_layer: int) -> None:
        stream = self.cupy.cuda.get_current_stream()
        if stream.is_capturing():               # the whole run being captured (a replay, engine/chunk_replay.py): a
            self._issue(self._launch_args(T))   # graph launched inside a capture invalidates it, so the launches
        else:                                   # themselves go into the outer graph
            self.graph.launch(stream)

    def launches_per_sequence(self, T: int) -> int:
        return self._wavefront(T) * len(self.kernels)


def prepare(network, params, dtype=np.float32, **options) -> GraphSchedule:
    """Plan and check now; compile, upload and capture on the first run (for its T and B)."""
    return GraphSchedule(network, params, dtype, **options)


def run(network, params, x, initial_states=None, dtype=np.float32, *, poison: bool = False, lengths=None,
        **options):
    return prepare(network, params, dtype, **options).run(x, initial_states, poison=poison, lengths=lengths)
