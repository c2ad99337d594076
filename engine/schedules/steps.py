"""When each layer of a wavefront runs each of its steps, with pools over time between layers (issue #11).

    timing = layer_steps(num_layers=8, steps=100, pools={3: Pool("max", 2, 2)})
    timing.layers[4]      # LayerSteps(steps=50, scale=2, offset=5, below_scale=2, below_offset=1)
    timing.wavefront      # wavefront steps of the launch: 107 (layer 7's step 49 at 49 * 2 + 8 = 106)

Without pools, layer l runs its step t at wavefront step k = t + l (one step behind the layer below). A pool after
layer p (max or mean over `window` steps every `stride`) turns the sequence of T steps into T' = (T - window) //
stride + 1; layer p + 1 runs step t' as soon as layer p has finished step t' * stride + window - 1, the last of its
window, so at k = (t' * stride + window - 1) * scale_p + offset_p + 1: every `stride * scale_p` wavefront steps. In
general layer l runs step t at k = t * scale_l + offset_l; the layers of a block one step apart, each pool
multiplying the scale. A layer waits for the one below to have finished step t * below_scale + below_offset
(t itself without a pool), which the layer-synchronised kernel uses directly (kernels/layer_sync.cuh).

This is the one wavefront through the pools: the layers above a pool start while the layers below are still
running, instead of after them. Pools themselves cost nothing here: the layer below folds its output into the
pooled sequence as it stores it (kernels/pool.cuh).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerSteps:
    steps: int          # time steps this layer runs (T after the pools below it)
    scale: int          # wavefront steps between two of its steps
    offset: int         # the wavefront step of its step 0
    below_scale: int    # it needs step t * below_scale + below_offset of the layer below (1, 0 without a pool)
    below_offset: int

    def wavefront_step(self, t: int) -> int:
        return t * self.scale + self.offset


@dataclass(frozen=True)
class WavefrontSteps:
    layers: tuple[LayerSteps, ...]
    output_steps: int   # steps of what the last layer hands out (pooled when a pool follows it)

    @property
    def wavefront(self) -> int:
        """Wavefront steps a launch of these layers takes: one past the last layer's last step."""
        return max(s.wavefront_step(s.steps - 1) for s in self.layers) + 1


def layer_steps(num_layers: int, steps: int, pools=None) -> WavefrontSteps:
    """The step timing of num_layers layers reading a sequence of `steps` steps, pools[p] after layer p. Raises
    ValueError when a pool's window is longer than the steps that reach it."""
    pools = pools or {}
    layers, t_steps, scale, offset, below = [], steps, 1, 0, (1, 0)
    for layer in range(num_layers):
        layers.append(LayerSteps(t_steps, scale, offset, *below))
        pool = pools.get(layer)
        if pool is None:
            offset, below = offset + 1, (1, 0)
            continue
        out = pool.steps_out(t_steps)
        if out < 1:
            raise ValueError(f"the pool after layer {layer} ({pool.op} over {pool.window} steps every {pool.stride}) "
                             f"needs at least {pool.window} steps, and {t_steps} reach it")
        offset = offset + (pool.window - 1) * scale + 1
        scale, below, t_steps = scale * pool.stride, (pool.stride, pool.window - 1), out
    return WavefrontSteps(tuple(layers), t_steps)
