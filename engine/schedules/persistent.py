"""Schedule 'persistent': the whole sequence, every layer, in one cooperative kernel launch.

Plan: one block per SM at most (engine/schedules/tiling.py); every block owns one layer's tile of
hidden units for the whole run, so its slices of the recurrent weights (and, for layers > 0, of the
input projection) are loaded into shared memory once, where they fit, instead of once per step
(Diamos et al., "Persistent RNNs", ICML 2016). Compile: `<cell>_persistent`. Launch: one
cooperative launch (cuLaunchCooperativeKernel through CuPy); inside, wavefront step k runs layer l
at step k - l on every block of layer l, with a grid-wide barrier after every stage, so a network of
L layers takes (T + L - 1) x stages barriers and no host round trips.

With TileConfig(layers_per_launch=g) the layers run in groups of g, one launch each, in order; a
group of one layer gets its input projection from one cuBLAS GEMM over the whole sequence first
(the layer-by-layer schedule of cuDNN, with this kernel's resident weights: the right choice when the
layers' weights together cannot stay on chip but one layer's can).

A cooperative launch fails unless every block can be resident at once: the grid is checked against
the occupancy API before launching, and the error names the tiling to change.

With TileConfig(sync="layer") the grid-wide barriers give way to per-layer arrival counters
(kernels/layer_sync.cuh): each layer steps through time on its own, waiting only for its own blocks and
for the layer below, so a cheaper layer runs ahead instead of idling at every barrier. Measured mixed (8-17%
faster at `lat`, 4-8% slower at `blogB`: benchmarks/NOTES.md), so the default (sync=None) takes the counters for
the warp GEMV of small batches and grid barriers otherwise, and the autotuner times the other one too.
TileConfig(sync="head") keeps a counter per head of a layer where every GEMM of a step reads one head (the sLSTM):
the blocks of a head wait for each other only (engine/schedules/heads.py head_sync). TileConfig(sync="cluster")
makes the blocks of a head (or of a small layer) one thread-block cluster that exchanges h through distributed
shared memory and meets at cluster barriers: one layer a launch, not cooperative (engine/schedules/cluster.py).

With pools={layer: Pool(...)} (both wavefront schedules; engine/schedules/base.py) a layer followed by a pool folds
its output into it as it stores it (kernels/pool.cuh) and the layers above run on the pooled sequence, each on its
own step timing (engine/schedules/steps.py): one wavefront through the pools.
"""
from __future__ import annotations

import numpy as np

from ..errors import BackendError
from .base import WavefrontSchedule


class PersistentSchedule(WavefrontSchedule):
    name = "persistent"
    persistent = True

    def _prepare_launch(self, T: int, B: int) -> None:
        cupy = self.cupy
        kernel = self.kernels[0]
        threads, smem, blocks = self.tiling.config.threads, self.tiling.smem_bytes, self.tiling.blocks
        per_sm = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, threads, smem)
        capacity = per_sm * self.limits.multiprocessors
        if blocks > capacity and not self.tiling.cluster:     # clusters never wait for each other: no co-residency
            raise BackendError(f"schedule 'persistent' needs {blocks} co-resident blocks of {threads} threads and "
                               f"{smem} bytes of shared memory, but {self.limits.name} holds {capacity}; hint: a "
                               "larger units_per_block, or backend='graph'")
        self.co_resident = capacity
        # TileConfig(sync="layer"): one arrival counter per layer of a launch (kernels/layer_sync.cuh), zeroed
        # before every launch.
        self.arrivals = None
        sync = self.tiling.config.sync
        if sync in ("layer", "head"):
            counts = T * self.stage_count() * self.tiling.blocks_per_head      # the largest a counter reaches
            if counts >= 2 ** 32:
                raise BackendError(f"schedule 'persistent' with TileConfig(sync={sync!r}) counts {counts} arrivals "
                                   f"a counter for T={T}, more than its 32-bit counters hold; hint: sync='grid'")
            self.arrivals = cupy.zeros(self.tiling.num_layers * self.tiling.sync_heads, dtype=cupy.uint32)

    def launch_group(self) -> int:
        return self.tiling.num_layers

    def _launch(self, T: int, B: int, first_layer: int) -> None:
        args = self.args[first_layer:]           # the group's rows of the argument table
        extra = ()
        if self.arrivals is not None:
            self.arrivals.fill(0)
            extra = (self.arrivals,)
        steps = self.wavefront_steps(first_layer) if self.pools else T     # with pools the kernel takes its span
        try:
            self.kernels[0]((self.tiling.blocks,), (self.tiling.config.threads,), (args, np.int32(steps), *extra),
                            shared_mem=self.tiling.smem_bytes)
        except self.cupy.cuda.driver.CUDADriverError as e:
            if not self.tiling.cluster:
                raise
            raise BackendError(f"schedule 'persistent' could not launch clusters of {self.tiling.cluster} blocks of "
                               f"{self.tiling.config.threads} threads and {self.tiling.smem_bytes} bytes of shared "
                               f"memory on {self.limits.name}: {e}; hint: a larger units_per_block (fewer blocks a "
                               "cluster), or sync='grid'") from None

    def launches_per_sequence(self, T: int) -> int:
        return self.tiling.launches


def prepare(network, params, dtype=np.float32, **options) -> PersistentSchedule:
    """Plan and check now; compile and upload on the first run (for its T and B)."""
    return PersistentSchedule(network, params, dtype, **options)


def run(network, params, x, initial_states=None, dtype=np.float32, *, poison: bool = False, lengths=None,
        **options):
    return prepare(network, params, dtype, **options).run(x, initial_states, poison=poison, lengths=lengths)
