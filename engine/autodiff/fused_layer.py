"""One layer's memory of the fused training step (backend "fused" of engine.autodiff.record) for a (T, B): its
buffers (fused_plan.Buffer: row (t + shift) * B + b), its parameters, each GEMM's stacked weights and the fused
stages' laid-out copies of them. A Program (engine/autodiff/fused_program.py) makes one a layer and keeps it: a CUDA
graph holds its addresses, load() copies new values in.
"""
from __future__ import annotations

import numpy as np

from ..dims import SCALAR
from ..ops import apply_elementwise
from .fused_plan import INPUT_BUFFER, Place, TrainingPlan
from .stage_fusion import FusedStage, lay_out


def float32_contiguous(xp, value):
    """value as a C-contiguous float32 array of xp: itself when it is one already (the common case, checked without
    the ~5 us each asarray and ascontiguousarray call costs on the host)."""
    if type(value) is xp.ndarray and value.dtype == np.float32 and value.flags.c_contiguous:
        return value
    return xp.ascontiguousarray(xp.asarray(value, dtype=xp.float32))


class Layer:
    """One layer's buffers, parameters, stacked weights and parameter vectors for a (T, B). They persist across
    calls (a Program reuses them, and a CUDA graph holds their addresses): load() copies new values in."""

    def __init__(self, xp, plan: TrainingPlan, sizes: dict, shapes: dict, T: int, B: int, poison: bool,
                 scratch: int = 0, stage_weights: tuple = ()):
        self.xp, self.plan, self.sizes, self.T, self.B = xp, plan, sizes, T, B
        self.persistent = (None, None)     # its (forward, backward) persistent launches, where Program takes them
        self.scratch = xp.empty((max(scratch, 1),), dtype=xp.float32)     # split-K partial products
        fill = np.nan if poison else 0.0
        self.buffers = {}
        for buf in plan.buffers:
            if buf.name == INPUT_BUFFER:
                continue                                   # the layer below's output, or the program's input
            rows = (T + 1 if buf.blocks == "T+1" else T) * B
            zero = buf.name.startswith("dstate_")          # a state adjoint never written stays zero
            self.buffers[buf.name] = xp.full((rows, buf.cols(sizes)), 0.0 if zero else fill, dtype=xp.float32)
        self.params: dict = {}             # the caller's arrays (float32): read by the after part
        for name, shape in shapes.items():
            if len(shape) == 1:            # vectors are kernel arguments: copied into buffers of fixed address
                self.buffers[f"param_{name}"] = xp.full(shape, fill, dtype=xp.float32)
        width = max(sizes.values())
        for name in plan.static:
            self.buffers[f"static_{name}"] = xp.full((width,), fill, dtype=xp.float32)
        # Each GEMM's weights stacked: members one under another, or a Stack's grid (sums x states, zero blocks)
        self.stacked, self.blocks = {}, {}       # key -> array; key -> ((weight, (row slice, column slice)), ...)
        for g in plan.forward.gemms + plan.backward.gemms + ((plan.input_gemm,) if plan.input_gemm else ()):
            if g.stack in self.stacked:
                continue
            grid = [g.weights[j:j + g.grid] for j in range(0, len(g.weights), g.grid)]
            heights = [shapes[next(w for w in row if w)][0] for row in grid]
            width = shapes[next(w for w in g.weights if w)][1]
            target = self.stacked[g.stack] = xp.full((sum(heights), g.grid * width), fill, dtype=xp.float32)
            blocks, top = [], 0
            for row, height in zip(grid, heights):
                for k, w in enumerate(row):
                    block = (slice(top, top + height), slice(k * width, (k + 1) * width))
                    if w:
                        blocks.append((w, block))
                    else:
                        target[block] = 0.0        # a sum without a term of that state: stays zero
                top += height
            self.blocks[g.stack] = tuple(blocks)
        # What load() fills each call, as views made once: the vector parameters' buffers (in the cell's order) and
        # every block of the stacked weights
        self.vectors = [name for name, shape in shapes.items() if len(shape) == 1]
        self.rounded: dict = {}          # a reduced mode's copies of the stacked weights (Runner.prepare_rounding)
        self.block_views = [(w, self.stacked[key][block]) for key in self.stacked for w, block in self.blocks[key]]
        # The fused stages' weights: stacked ones interleaved (forward) or transposed (backward), stage_fusion.py
        self.stage_weights = {(key, layout, members): xp.full(
            self.stacked[key].shape[::-1] if layout == "transposed" else self.stacked[key].shape, fill,
            dtype=xp.float32) for key, layout, members in stage_weights}

    def load(self, cell, params: dict) -> list[tuple]:
        """Take a layer's parameters: their float32 arrays (read by the after part), the static values computed
        now; returned, the (destination, source) copies that fill the vector buffers and the stacked weights, for
        Runner.copy to do in one launch with the program's other copies."""
        xp = self.xp
        self.params = {name: float32_contiguous(xp, value) for name, value in params.items()}
        copies = [(self.buffers[f"param_{name}"], self.params[name]) for name in self.vectors]
        copies += [(view, self.params[w]) for w, view in self.block_views]
        for name, value in static_values(xp, cell, self.plan, self.params, self.sizes).items():
            self.buffers[f"static_{name}"][...] = value
        return copies

    def lay_out_weights(self) -> None:
        """The fused stages' copies of the stacked weights, once load()'s copies are done (on the same stream)."""
        for (key, layout, members), target in self.stage_weights.items():
            target[...] = lay_out(self.xp, self.stacked[key], layout, members)

    def stage_weight(self, stage: FusedStage):
        layout = stage.weight_layout(self.interleaved)
        return self.stacked[layout[0]] if layout[1] == "stacked" else self.stage_weights[layout]

    def pointer(self, place: Place, block: int = 0) -> tuple[int, int]:
        """(device address, leading dimension) of a value's row block `block` (step t's rows from block t)."""
        buf = self.buffers[place.buffer]
        cols = buf.shape[1]
        return buf.data.ptr + 4 * ((block + place.shift) * self.B * cols + place.offset(self.sizes)), cols

    def view(self, place: Place, size: int):
        """A value of every step as (T x B, size) rows: a view of its buffer."""
        return self.rows(place, 0, self.T, size)

    def rows(self, place: Place, block: int, blocks: int, size: int):
        """Row blocks block .. block + blocks - 1 of a value (a state's: block t enters step t), (blocks x B, size):
        a view of its buffer."""
        buf, B = self.buffers[place.buffer], self.B
        start = place.offset(self.sizes)
        return buf[(block + place.shift) * B:(block + place.shift + blocks) * B, start:start + size]

    def state(self, state: str, block: int, adjoint: bool = False):
        """A state's (or its adjoint's) row block `block`: (B, its size)."""
        places = self.plan.adjoint_places if adjoint else self.plan.state_places
        return self.rows(places[state], block, 1, self.sizes[self.plan.cell.state_dim(state)])

    def output(self):
        """The layer's output of every step, (T x B, its size): the next layer's input (one whole buffer's rows)."""
        return self.view(self.plan.output, self.sizes[self.plan.cell.output_dim])


def static_values(cupy, cell, plan: TrainingPlan, params: dict, sizes: dict) -> dict:
    """The values of parameters alone (the same at every step and row), as vectors; a number as a full vector."""
    values: dict = {}
    width = max(sizes.values())
    for name in plan.static:
        node = cell[name]
        args = [params.get(a, values.get(a)) if not cell[a].op == "const" else np.float32(cell[a].attr("value"))
                for a in node.args]
        if node.op == "matmul":
            value = args[0] @ args[1]
        else:
            value = apply_elementwise(node.op, args, node.attr_dict)
        if cell.dims[name] == SCALAR:
            value = cupy.full((width,), float(value), dtype=cupy.float32)
        values[name] = cupy.ascontiguousarray(cupy.asarray(value, dtype=cupy.float32))
    return values
