"""The fused training step's plan run by NumPy: the same buffers, places, stages and GEMMs as
engine/autodiff/fused_runner.py on the GPU, each kernel interpreted statement by statement on (B, D) slices instead of
launched. The CPU tests run
every cell through it against the float64 reference, so a wrong place, stage or GEMM in the plan fails without a GPU;
the GPU tests then hold the generated CUDA to the same results. In a precision mode (plan.precision) every GEMM's
operands are rounded to the mode's format first (engine.rounding) and multiplied in fp32, which is the mode's
definition; the bias sums, column dots and kernels stay fp32, as on the GPU.

    tape = fused_tape.record(network, params, x, initial_states, runner=NumpyRunner(training_plan(network.cell)))
"""
from __future__ import annotations

import functools

import numpy as np

from ..ops import apply_backward
from ..rounding import round_like
from .fused_layer import Layer
from .fused_plan import LENGTHS, GemmPlan, GradGemm, KernelPlan, Place, TrainingPlan
from .fused_runner import Runner
from .stage_fusion import FusedStage, fused_stages

SPLIT = False            # NumpyRunner.splits: 2 for every step GEMM, so the "split" launches run (tests)


def _quiet(method):
    """A NaN or Inf goes through the work silently, as on the GPU: the finiteness checks name it afterwards, and the
    poisoned buffers are NaN by design."""
    @functools.wraps(method)
    def run(*args, **kwargs):
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            return method(*args, **kwargs)
    return run


class NumpyRunner(Runner):
    can_capture = False

    def __init__(self, plan: TrainingPlan, wide_sums: bool = False):     # no module, no cuBLAS: NumPy does both
        """wide_sums: the GEMMs sum their (rounded) products in float64 rather than float32, the results stored as
        float32 all the same: how much the summation order alone moves a step (the GPU tests' yardstick)."""
        self.xp, self.plan, self.tiled, self.interleaved = np, plan, True, True
        self.stages = fused_stages(plan)
        self.wide_sums = wide_sums

    def bind(self) -> None:
        pass

    def rounded(self, operand):
        """A GEMM operand as the plan's precision mode multiplies it (float32: itself)."""
        rounded = round_like(operand, self.plan.precision)
        return rounded.astype(np.float64) if self.wide_sums else rounded

    def issue_on_streams(self, items, run) -> None:
        """The GPU's issue order, one chunk after another: a chunk that read a value its wait did not cover would read
        a NaN of the poisoned buffers."""
        for l, c, _ in items:
            run(l, c)

    def scratch_size(self, sizes: dict, B: int) -> int:
        return 0

    def prepare_streams(self, count: int) -> None:
        pass

    def prepare_rounding(self, layers) -> None:
        pass                                         # rounded() makes each operand's rounded copy

    def round_weights(self, layers) -> None:
        pass

    @_quiet
    def grad_gemm(self, layer: Layer, g: GradGemm, out) -> None:
        width = g.rows(layer.sizes)
        dy = layer.view(g.dy, width)
        if g.operand is not None:
            cols = g.cols(layer.sizes)
            operand = self.rounded(layer.view(g.operand, cols))
            out.reshape(width, cols)[...] += self.rounded(dy).T @ operand
        else:
            out[...] += dy.sum(axis=0)

    @_quiet
    def column_dots(self, layer: Layer, dots: tuple, grads: dict) -> None:
        for d in dots:
            size = layer.sizes[d.dim]
            grads[d.param][...] += (layer.view(d.a, size) * layer.view(d.b, size)).sum(axis=0)

    @staticmethod
    def copy_geometry(target):
        return None                  # NumPy copies by assignment

    def copy(self, copies: list[tuple], geometry: list | None = None) -> None:
        for target, value in copies:
            target[...] = 0.0 if value is None else value.reshape(target.shape)

    def lay_out_table(self, layers: list) -> None:
        return None

    def lay_out_weights(self, layers: list, table) -> None:
        for layer in layers:          # NumPy lays them out by assignment (stage_fusion.lay_out)
            layer.lay_out_weights()

    @staticmethod
    def _rows(layer: Layer, place: Place, block: int, rows: int, width: int):
        buf = layer.buffers[place.buffer]
        start = (block + place.shift) * layer.B
        offset = place.offset(layer.sizes)
        return buf[start:start + rows, offset:offset + width]

    @_quiet
    def kernel(self, layer: Layer, kernel: KernelPlan, t: int) -> None:
        B, D = layer.B, layer.sizes[kernel.dim]
        values = {}
        for value, place in kernel.loads:
            if place.kind == "literal":
                values[value] = np.float32(place.literal)
            elif place.kind == "vector":
                values[value] = layer.buffers[place.buffer][:D]
            else:
                values[value] = self._rows(layer, place, t, B, D)
        for st in kernel.statements:
            args = [values[a] for a in st.args]
            result = args[0] if st.op == "copy" else apply_backward(st.op, args, dict(st.attrs))
            values[st.var] = np.asarray(result, dtype=np.float32)
        within = (t < layer.buffers[LENGTHS])[:, None] if any(h is not None for h in kernel.past_end) else None
        for (value, place), held in zip(kernel.stores, kernel.past_end or (None,) * len(kernel.stores)):
            stored = values[value] if held is None else np.where(within, values[value], values[held])
            self._rows(layer, place, t, B, D)[...] = stored

    def fused(self, layer: Layer, stage: FusedStage, tg: int, t: int) -> None:
        """The GEMM of step tg then the kernel of step t: what the fused launch computes, block by block (and the
        split GEMM and summing kernel, element by element)."""
        self.gemm(layer, stage.gemm, tg, forward=stage.forward)
        self.kernel(layer, stage.kernel, t)

    split_sums = fused

    def splits(self, g: GemmPlan, sizes: dict, B: int) -> int:
        return 2 if SPLIT and not g.hoisted else 1     # (the tests' switch: the GPU's split only changes the order)

    @_quiet
    def gemm(self, layer: Layer, g: GemmPlan, t: int, forward: bool, steps: int = 1) -> None:
        rows = steps * layer.B if g.hoisted else layer.B
        block = t
        k, n = g.k(layer.sizes), g.n(layer.sizes)
        exact = self.plan.exact(g)          # a reduction's fixed matrix: a sum, strict fp32 in every mode
        w = layer.stacked[g.stack] if exact else self.rounded(layer.stacked[g.stack])
        a = self._rows(layer, g.operand, block, rows, k)
        a = a if exact else self.rounded(a)
        out = self._rows(layer, g.out, block, rows, n)
        product = a @ w.T if forward else a @ w
        out[...] = out + product if g.accumulate else product
