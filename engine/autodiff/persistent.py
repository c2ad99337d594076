"""The training step as persistent launches, both directions (issue #13; benchmarks/NOTES.md,
2026-11-25). By default (PERSISTENT = "auto") only where worthwhile(): a step of two or more GEMM stages (GRU-Cho, MGU,
lstm_proj) whose blocks read little X a step (`lat`, `blogB`; not `mid`), where it measured 5-24 % faster than the
fused launches; one-stage steps (the LSTM) came out even or slower (benchmarks/results/training-20261125-0628-H100/).

The fused step (engine/autodiff/fused_runner.py) launches each stage of each step: a GEMM (cuBLAS, or the fused GEMV at
B <= 2) and a kernel, T x stages launches a layer and direction, each reading its weight rows from L2 again. Here a
chunk of a layer's steps is one cooperative launch of at most one block an SM (Diamos et al., "Persistent RNNs", ICML
2016): block g owns units [g * TU, (g + 1) * TU) of each item, loads its rows of the item's weight into shared memory
once, and at every step computes its columns of the item's GEMM from there (the warp GEMV of kernels/tile_gemm.cuh
for B <= 4 rows, kernels/persistent_gemm.cuh above), writes them where the GEMM would, runs the item's statements on
its units (the same loads, statements and stores as the fused kernels: fused_codegen), and waits at a grid-wide
barrier for every other block before the next item.

An item is a fused stage of stage_fusion (a GEMM and the kernel that reads it at its own elements) or a kernel alone:
- forward, steps t0 .. t1 - 1 in order: the GEMM of step t, then the kernel of step t (lag 0);
- backward, steps t1 - 1 down to t0: the GEMM of step t + 1 with the kernel of step t (lag 1: the GEMM of a step
  waits for that step's kernel), except at the chunk's first step, whose GEMM the chunk before ran (or, at T, the
  seeds are there); then, after the loop, the GEMM of step t0 alone. That is stage_fusion.launch_sequence's order.
The hoisted input projection (forward) and the input's adjoint (backward) stay cuBLAS GEMMs over the chunk, before
and after the launch. Layer by layer a launch covers the sequence on every SM; in the wavefront (the default order) a
launch covers a chunk of WAVEFRONT_CHUNK steps on SMs / L blocks, so the L layers' launches of a diagonal run side by
side (each launch waits only at its own barriers: no spinning on another launch, so no deadlock when they cannot all
be resident).

    launch = persistent_launch(runner, sizes, B, blocks, forward=True)   # None where the layer does not qualify
    launch.lay_out(layer)                     # after Program.load: the weights, a unit's members side by side
    launch.launch(layer, steps)               # on the stream of the chunk's GEMMs

Where every step GEMM's weights are block-diagonal by heads (the sLSTM), make_plan takes the head-local layout of
engine/autodiff/persistent_heads.py instead: a block (or a cluster of 2-8 blocks) owns a head and a few batch rows,
reads no other block's values, and meets no grid barrier; it is also the one persistent launch a reduced precision
mode takes. benchmarks/results/head-local-training-20261127-H200/ has its figures.

Sizes, the batch and the grid are compile-time constants: one module a (plan, direction, layer sizes, B, grid).
"""
from __future__ import annotations

import numpy as np

from ..c_names import ascii_identifiers, kernel_prefix
from ..codegen.cuda import CELL_HELPERS, helper_source
from ..codegen.wavefront import TILE_GEMM_HELPER
from ..errors import BackendError
from ..schedules.base import compile_kernel
from .fused_codegen import declare
from .fused_plan import TrainingPlan
from .persistent_heads import head_local, head_plan, head_rows, render_heads
from .persistent_items import item_lines
from .persistent_plan import (
    CG,
    GEMV_MAX_ROWS,
    MAX_SHARED_BYTES,
    ROWS_GEMM,
    THREADS,
    Item,
    PersistentPlan,
    Refused,
    params_of,
    round_up,
    row_stride,
    written_buffers,
)
from .stage_fusion import launch_sequence
from .stage_fusion import lay_out as stage_lay_out

__all__ = ["MAX_SHARED_BYTES", "PERSISTENT", "PersistentLaunch", "Refused", "head_local", "head_rows", "make_plan",
           "persistent_launch", "refusal", "render", "step_items", "worthwhile", "x_bytes"]

PERSISTENT = "auto"                # the fused step runs persistent launches where a layer qualifies (Program): True
                                   # wherever it qualifies, "auto" only where worthwhile() expects a win, False never
AUTO_MAX_X_BYTES = 256 * 1024      # "auto": the most X a block may read from L2 a step (see worthwhile)
AUTO_MIN_STAGES = 2                # "auto": the fewest GEMM stages a step (see worthwhile)


def step_items(plan: TrainingPlan, stages: dict, forward: bool) -> tuple[list, object]:
    """A step's items as (kind, item, lag) in order, and the backward's last GEMM (its FusedStage) or None; Refused
    where a GEMM fuses with no kernel. kind: "fused" (item a FusedStage) or "kernel" (a KernelPlan). They are
    stage_fusion.launch_sequence's, over three steps: the items whose kernel runs at the middle one (the first and
    the last carry the chunk's boundary items), and the trailing GEMM alone."""
    sequence = launch_sequence(plan.forward if forward else plan.backward, range(3), forward, stages)
    out, trailing = [], None
    for n, (kind, item, *steps) in enumerate(sequence):
        if kind == "gemm":
            if forward or n != len(sequence) - 1:
                raise Refused(f"GEMM {item.name} does not fuse with a kernel (stage_fusion.fusible)")
            trailing = item
        elif steps[-1] == 1:
            lag = steps[0] - steps[1] if kind == "fused" else 0
            if lag not in (0, 1) or (forward and lag):
                raise Refused(f"stage {item.name} reads the GEMM of another step")
            out.append((kind, item, lag))
    last = next((item for kind, item, lag in out if lag == 1 and item.gemm is trailing), None)
    if trailing is not None and last is None:
        raise Refused(f"GEMM {trailing.name} does not fuse with a kernel (stage_fusion.fusible)")
    return out, last


def make_plan(plan: TrainingPlan, stages: dict, sizes: dict, B: int, blocks: int, forward: bool) -> PersistentPlan:
    """The items of a step on at most `blocks` blocks (no more than the widest item's units), a block's units of
    each, and the shared memory: the items' resident rows one after another, then the GEMM columns (dots). Refused
    where the layer does not qualify."""
    per_step, last = step_items(plan, stages, forward)
    if not per_step:
        raise Refused("a step has nothing to run")
    heads = head_local(plan, per_step, sizes)
    if isinstance(heads, int):
        try:
            return head_plan(plan, per_step, last, sizes, B, blocks, forward, heads)
        except Refused:
            if plan.precision != "float32":
                raise
    if plan.precision != "float32":
        raise Refused(f"the launch's GEMMs multiply in strict fp32 unless a block owns whole heads ({heads}), and the "
                      f"plan runs {plan.precision}")
    dims = [sizes[item.kernel.dim if kind == "fused" else item.dim] for kind, item, _ in per_step]
    grid = max(1, min(blocks, max(dims)))
    items, weights, offset, widest = [], [], 0, 0
    for (kind, item, lag), dim in zip(per_step, dims):
        units = -(-dim // grid)
        if kind == "fused":
            k = item.gemm.k(sizes)
            if k % 4:
                raise Refused(f"GEMM {item.gemm.name}'s K ({k}) is not a multiple of 4")
            it = Item(item.kernel, item, units, dim, k, item.members, offset, lag, len(weights))
            weights.append(item)
            offset += it.rows * row_stride(k)
            widest = max(widest, it.columns)
        else:
            it = Item(item, None, units, dim)
        items.append(it)
    final = None
    if last is not None:                            # shares its lag-1 item's weight rows
        twin = next(it for it in items if it.stage is last)
        final = Item(None, last, twin.units, twin.dim, twin.k, twin.members, twin.offset, 0, twin.weight, True)
    dots = offset
    direction = "fwd" if forward else "bwd"
    layout = PersistentPlan(f"{kernel_prefix(plan.cell.name)}_persistent_{direction}", forward, tuple(items),
                            final, tuple(weights), grid, B, (sizes.get("I", 0), sizes.get("H", 0), sizes.get("P", 0)),
                            dots, dots + round_up(B * widest, 4))
    if layout.shared_bytes > MAX_SHARED_BYTES:
        raise Refused(f"a block needs {layout.shared_bytes} bytes of shared memory (its weight rows and GEMM "
                      f"columns), more than {MAX_SHARED_BYTES}")
    return layout


def refusal(plan: TrainingPlan, stages: dict, sizes: dict, B: int, blocks: int, forward: bool = True) -> str | None:
    """Why a layer of these sizes at B rows cannot run this direction persistent on `blocks` blocks, or None."""
    try:
        make_plan(plan, stages, sizes, B, blocks, forward)
    except Refused as e:
        return str(e)
    return None


def x_bytes(layout: PersistentPlan) -> int:
    """The most bytes of X a block of the launch reads from L2 a step for one GEMM: rnn_rows_gemm reads the step's X
    (B x K) once for every CG of its columns; the warp GEMV (B <= 4) reads it once."""
    gemms = [it for it in layout.items if it.stage is not None]
    if not gemms:
        return 0
    passes = 1 if layout.batch <= GEMV_MAX_ROWS else None
    return max((passes or -(-it.columns // CG)) * layout.batch * it.k * 4 for it in gemms)


def worthwhile(layout: PersistentPlan) -> bool:
    """Whether PERSISTENT = "auto" takes the launch: a step of at least AUTO_MIN_STAGES GEMM stages (a grid barrier
    then replaces a launch and a graph edge between them) and X read from L2 a step within AUTO_MAX_X_BYTES.
    Measured on the H100: the persistent step won where X was <= 256 KB (the LSTM, lstm_proj and GRU-Cho at `blogB`,
    every cell at `lat`) and lost at 512 KB - 1 MB (`mid`, lstm_fgr at `blogB`;
    benchmarks/results/training-20261125-0353-H100/persistent-forward-tiles-H100.md); of those, the cells of one
    stage a step (the LSTM, peephole_lstm) came out even or slower from run to run, the two-stage ones (GRU-Cho, MGU,
    lstm_proj) faster (benchmarks/results/training-20261125-0628-H100/). A head-local launch always: it has no grid
    barrier, and it took the sLSTM's bf16 step at H = 512, B = 16, T = 1024 from 18.8 to 9.3 ms on an H200
    (benchmarks/results/head-local-training-20261127-H200/)."""
    if layout.heads:
        return True
    stages = sum(1 for it in layout.items if it.stage is not None and not it.gemm_only)
    return stages >= AUTO_MIN_STAGES and x_bytes(layout) <= AUTO_MAX_X_BYTES


def render(plan: TrainingPlan, layout: PersistentPlan) -> str:
    """The CUDA source of one layer's persistent launch (see the module's docstring)."""
    if layout.heads:
        return render_heads(plan, layout)
    columns, B = plan.columns, layout.batch
    written = written_buffers(layout)
    direction = "forward" if layout.forward else "backward"
    lines = [f"// Generated by engine.autodiff.persistent for cell '{plan.cell.name}' (structure hash "
             f"{plan.cell.structural_hash}): the training step's {direction},",
             f"// steps t0 .. t1 - 1 of one layer in one cooperative launch of {layout.grid} blocks, IEEE fp32.",
             "// Do not edit.",
             "#include <cooperative_groups.h>", helper_source(CELL_HELPERS), helper_source(TILE_GEMM_HELPER),
             helper_source(ROWS_GEMM), ""]
    lines.append(f'extern "C" __global__ void __launch_bounds__({THREADS}, 1) {layout.name}(')
    lines += declare(params_of(layout), written)
    lines += [f"    const float* __restrict__ W_{n}," for n in range(len(layout.stages))]
    lines.append("    const int t0, const int t1, const int I, const int H, const int P)")
    lines += ["{", f"    constexpr int B = {B};                              // batch rows",
              "    cooperative_groups::grid_group grid = cooperative_groups::this_grid();",
              "    extern __shared__ __align__(16) float smem[];"]
    if layout.stages:
        lines.append(f"    float* dots = smem + {layout.dots};          // a fused item's B x columns of its GEMM")
    for it in layout.items:               # the block's rows of each GEMM's weight, once
        if it.stage is None:
            continue
        lines += [f"    {{   // {it.gemm.name}: this block's {it.columns} rows (units x members), resident",
                  f"        const int j0 = blockIdx.x * {it.units}, nu = min({it.units}, {it.dim} - j0);",
                  f"        if (nu > 0) rnn_load_resident(smem + {it.offset}, W_{it.weight} + (long)j0 * {it.members} "
                  f"* {it.k}, {it.k}, {it.k}, nu * {it.members}, {it.rows});",
                  "    }"]
    lines.append("    __syncthreads();")
    lines.append("    for (int t = t0; t < t1; ++t) {                   // the launch's steps" if layout.forward else
                 "    for (int t = t1 - 1; t >= t0; --t) {              // the launch's steps, the last first")
    for it in layout.items:
        lines += item_lines(it, columns, B)
        lines.append("        grid.sync();               // every block's units of this item (a block barrier too)")
    lines.append("    }")
    if layout.last is not None:
        lines += ["    {   // after the loop: the GEMM of step t0 (the next chunk's first kernel reads it)",
                  "        const int t = t0;"]
        lines += item_lines(layout.last, columns, B)
        lines.append("    }")
    lines += ["    (void)I; (void)H; (void)P;", "}"]
    return ascii_identifiers("\n".join(lines) + "\n")


class PersistentLaunch:
    """A layer's persistent launch of one direction on the GPU: the compiled kernel, its weights, the launch."""

    def __init__(self, runner, plan: TrainingPlan, layout: PersistentPlan):
        self.runner, self.plan, self.layout = runner, plan, layout
        self.source = render(plan, layout)
        self.kernel = compile_kernel(self.source, layout.name, not layout.heads, layout.shared_bytes, plan.cell.name,
                                     cluster=layout.split if layout.heads else 0)
        per_sm = runner.xp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(self.kernel.kernel.ptr, THREADS,
                                                                                 layout.shared_bytes)
        if per_sm < 1:
            raise RuntimeError(f"the persistent launch of '{plan.cell.name}' does not fit one block an SM "
                               f"({layout.shared_bytes} bytes of shared memory)")
        self.params = params_of(layout)
        self.attribute = "persistent_weights_" + ("fwd" if layout.forward else "bwd")

    def lay_out(self, layer) -> list:
        """The fused stages' weights of the layer, a row per GEMM column with a unit's members side by side
        (FusedStage.weight_layout, stage_fusion.lay_out), made after load() into arrays the layer keeps; the
        layer's own copy where its fused stages read the same layout (Layer.stage_weights, laid out by then)."""
        xp = self.runner.xp
        layouts = [stage.weight_layout(True) for stage in self.layout.stages]
        targets = getattr(layer, self.attribute, None)
        if targets is None:
            targets = [layer.stacked[key] if layout == "stacked" else
                       layer.stage_weights.get((key, layout, members)) if (key, layout, members) in layer.stage_weights
                       else xp.empty(layer.stacked[key].shape[::-1] if layout == "transposed"
                                     else layer.stacked[key].shape, dtype=xp.float32)
                       for key, layout, members in layouts]
            setattr(layer, self.attribute, targets)
        for (key, layout, members), target in zip(layouts, targets):
            if layout != "stacked" and (key, layout, members) not in layer.stage_weights:
                target[...] = stage_lay_out(xp, layer.stacked[key], layout, members)
        return targets

    def launch(self, layer, steps: range) -> None:
        """The layer's `steps`, one launch, reading the weights lay_out made in Program.load."""
        I, H, P = self.layout.sizes
        args = tuple(layer.buffers[p] for p in self.params) + tuple(getattr(layer, self.attribute))
        grid = ((self.layout.heads * self.layout.split, self.layout.batch // self.layout.rows) if self.layout.heads else
                (self.layout.grid,))
        self.kernel(grid, (THREADS,), args + (np.int32(steps.start), np.int32(steps.stop), np.int32(I), np.int32(H),
                                             np.int32(P)),
                    shared_mem=self.layout.shared_bytes)


def persistent_launch(runner, sizes: dict, B: int, blocks: int, forward: bool):
    """The PersistentLaunch of a layer of these sizes at B rows on at most `blocks` blocks, one direction (cached by
    the runner), or None with PERSISTENT off or where the layer does not qualify (refusal says why). A plan in a
    reduced precision mode takes a head-local launch only (head_local: its GEMMs round their operands to the mode); the
    other launches' GEMMs (rnn_warp_gemvs in RNN_FP32, rnn_rows_gemm) multiply in fp32, so under "auto" such a layer
    runs the fused launches with cuBLAS on rounded operands, and PERSISTENT = True (every layer persistent) is refused
    by name rather than run in fp32 under the mode's name."""
    if not PERSISTENT or not hasattr(runner, "sms"):
        return None
    stages = {key: s for key, s in runner.stages.items() if s.forward == forward}
    try:
        layout = make_plan(runner.plan, stages, sizes, B, blocks, forward)
    except Refused as e:
        if PERSISTENT is True and runner.plan.precision != "float32":
            raise BackendError(f"the persistent training launch cannot run precision={runner.plan.precision!r} here: "
                               f"{e}; hint: persistent.PERSISTENT = 'auto' (the fused launches run the mode through "
                               "cuBLAS), or precision='float32'") from None
        return None
    if PERSISTENT == "auto" and not worthwhile(layout):
        return None
    cache = runner.__dict__.setdefault("persistent_launches", {})      # the runner's: one plan, one device
    key = (tuple(sorted(sizes.items())), B, blocks, forward)
    launch = cache.get(key)
    if launch is None:
        launch = cache[key] = PersistentLaunch(runner, runner.plan, layout)
    return launch
