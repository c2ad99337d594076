"""Where the fused training step puts the parameter gradients: every layer's in one buffer (gradient_layout), the
members of each of the plan's GradGemms one after another so that one GEMM writes them all, and views of it
(gradient_views)."""
from __future__ import annotations

import functools

import numpy as np

from .fused_planner import training_plan


@functools.lru_cache(maxsize=64)
def gradient_layout(network) -> tuple[int, tuple, tuple]:
    """Every layer's parameter gradients in one buffer: (total floats, ((layer, parameter, shape, offset), ...),
    ((layer, GradGemm index, offset, floats), ...)). The members of each of the plan's GradGemms lie one after
    another, in its order, so that GEMM writes them all."""
    cell = network.cell
    plan = training_plan(cell)
    layout, stacks, start = [], [], 0
    for l in range(network.num_layers):
        grouped = [(i, g.params) for i, g in enumerate(plan.grad_gemms)]
        alone = [(None, (p.name,)) for p in cell.params if not any(p.name in g.params for g in plan.grad_gemms)]
        for index, names in grouped + alone:
            first = start
            for name in names:
                shape = network.param_shape(l, name)
                layout.append((l, name, shape, start))
                start += int(np.prod(shape))
            if index is not None:
                stacks.append((l, index, first, start - first))
    order = {p.name: i for i, p in enumerate(cell.params)}
    layout.sort(key=lambda item: (item[0], order[item[1]]))
    return start, tuple(layout), tuple(stacks)


def _view(xp, flat, shape: tuple, start: int):
    """flat[start:start + size] as an array of `shape` (on the GPU one constructor call, not a slice and a reshape)."""
    if xp is np:
        return flat[start:start + int(np.prod(shape))].reshape(shape)
    return xp.ndarray(shape, dtype=xp.float32, memptr=flat.data + 4 * start)


def gradient_views(xp, network, flat) -> tuple[list[dict], list[dict]]:
    """Every layer's parameter gradients as views of `flat` (gradient_layout); and per layer, each GradGemm's stacked
    gradients as one flat view {GradGemm index: view}."""
    _, layout, stacks = gradient_layout(network)
    grads: list[dict] = [{} for _ in range(network.num_layers)]
    for l, name, shape, start in layout:                 # in the cell's order, as every backend's
        grads[l][name] = _view(xp, flat, shape, start)
    stacked: list[dict] = [{} for _ in range(network.num_layers)]
    for l, index, start, size in stacks:
        stacked[l][index] = flat[start:start + size]
    return grads, stacked


def zero_gradients(xp, network) -> tuple[list[dict], list[dict]]:
    """gradient_views of one buffer of zeros (one memset, not one a parameter)."""
    return gradient_views(xp, network, xp.zeros(gradient_layout(network)[0], dtype=xp.float32))
