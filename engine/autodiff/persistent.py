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

Sizes, the batch and the grid are compile-time constants: one module a (plan, direction, layer sizes, B, grid).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..c_names import ascii_identifiers, kernel_prefix
from ..codegen.cuda import CELL_HELPERS, helper_source
from ..codegen.precision import precision
from ..codegen.wavefront import MODE_NAMES, TILE_GEMM_HELPER, gemv_ksteps
from ..errors import BackendError
from ..schedules.base import compile_kernel
from ..schedules.tiling import weight_stride
from .fused_codegen import declare, element, gemm_loads, kernel_params, statement_body, statement_expr, store_lines, var
from .fused_plan import GemmPlan, KernelPlan, TrainingPlan
from .stage_fusion import FusedStage, launch_sequence
from .stage_fusion import lay_out as stage_lay_out

THREADS = 256
GEMV_MAX_ROWS = 4                  # rnn_warp_gemvs (kernels/tile_gemm.cuh) up to this many rows, rnn_rows_gemm above
ROWS_GEMM = "persistent_gemm.cuh"  # rnn_rows_gemm, for more rows than the GEMV takes
RW, CG = 8, 8                      # its task: rows x columns a warp (64 partial sums a lane)
MAX_SHARED_BYTES = 227 * 1024      # an H100's or H200's shared memory a block may opt in to
PERSISTENT = "auto"                # the fused step runs persistent launches where a layer qualifies (Program): True
                                   # wherever it qualifies, "auto" only where worthwhile() expects a win, False never
AUTO_MAX_X_BYTES = 256 * 1024      # "auto": the most X a block may read from L2 a step (see worthwhile)
AUTO_MIN_STAGES = 2                # "auto": the fewest GEMM stages a step (see worthwhile)


def _round(n: int, m: int) -> int:
    return -(-n // m) * m


def row_stride(k: int) -> int:
    """kernels/tile_gemm.cuh rnn_row_stride: a resident row's floats."""
    return _round(k, 4) + 4


class Refused(Exception):
    """A layer that cannot run persistent; the message says why."""


@dataclass(frozen=True)
class Item:
    """One item of a step, in order: a fused stage (a GEMM of step t + lag, then the kernel of step t on the same
    units), a kernel alone, or (gemm_only) the last GEMM of a backward chunk alone."""
    kernel: KernelPlan | None
    stage: FusedStage | None
    units: int                      # TU: units a block owns
    dim: int                        # D: the kernel's size (a GEMM's output block)
    k: int = 0                      # the GEMM's K
    members: int = 1
    offset: int = 0                 # floats of shared memory before the block's resident rows
    lag: int = 0
    weight: int = -1                # which of the launch's weights (W_<weight>) the GEMM reads
    gemm_only: bool = False

    @property
    def gemm(self) -> GemmPlan | None:
        return None if self.stage is None else self.stage.gemm

    @property
    def columns(self) -> int:
        return self.units * self.members

    @property
    def rows(self) -> int:
        """Resident rows, zeros past the block's columns up to a multiple of 8 (the GEMM's tasks read them)."""
        return _round(self.columns, 8)


@dataclass(frozen=True)
class PersistentPlan:
    name: str
    forward: bool
    items: tuple[Item, ...]         # a step's, in order
    last: Item | None               # backward: the GEMM of step t0 alone, after the loop
    stages: tuple[FusedStage, ...]  # one weight each, in the launch's order
    grid: int                       # blocks (at most one an SM)
    batch: int
    sizes: tuple                    # (I, H, P) of the layer
    dots: int                       # floats of shared memory where a block's GEMM columns go (B x the widest)
    shared_floats: int
    heads: int = 0                  # head-local (head_local): the heads a block owns one of; 0: blocks own slices of
                                    # every item's units and meet at grid barriers
    rows: int = 0                   # head-local: the batch rows a block owns (head_rows)
    mode: str = "float32"           # head-local: the GEMMs' precision mode (engine/codegen/precision.py)

    @property
    def shared_bytes(self) -> int:
        return 4 * self.shared_floats


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
            return _head_plan(plan, per_step, last, sizes, B, blocks, forward, heads)
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
                            dots, dots + _round(B * widest, 4))
    if layout.shared_bytes > MAX_SHARED_BYTES:
        raise Refused(f"a block needs {layout.shared_bytes} bytes of shared memory (its weight rows and GEMM "
                      f"columns), more than {MAX_SHARED_BYTES}")
    return layout


def head_local(plan: TrainingPlan, per_step: list, sizes: dict) -> int | str:
    """The heads a block may own whole, or why not (a str). Where every item is of the hidden size and every step
    GEMM's weights are block-diagonal by the same k heads (`W(..., heads=k)`, marked `diagonal` in the dense form:
    engine/dense.py), the outputs of a head's units read only that head's columns of the operand: H / k of each run of
    H columns (the backward's operand holds the members' adjoints side by side, a run each). A block that owns a head
    and a few batch rows then reads no other block's values, and the launch needs no grid barrier."""
    H = sizes.get("H", 0)
    found = set()
    for kind, item, _ in per_step:
        kernel = item.kernel if kind == "fused" else item
        if kernel.dim != "H":
            return f"kernel {kernel.name} is not of the hidden size"
        if kind != "fused":
            continue
        gemm = item.gemm
        if gemm.grid != 1:
            return f"GEMM {gemm.name} stacks a grid of weights"
        found |= {plan.cell.by_name[w].attr("diagonal", 1) if w in plan.cell.by_name else 1 for w in gemm.weights}
        if not H or gemm.k(sizes) % H:
            return f"GEMM {gemm.name}'s K is not whole runs of H"
    if len(found) != 1 or min(found) < 2:
        return "the step GEMMs' weights are not block-diagonal by one number of heads"
    heads = found.pop()
    if H % heads or (H // heads) % 4:
        return f"H = {H} does not split into {heads} heads of a multiple of 4 units"
    return heads


def head_rows(B: int, heads: int, blocks: int) -> int:
    """Batch rows a head-local block owns: the fewest of 1, 2, 4 that divides B and keeps heads x B / rows blocks
    within `blocks` (one wave), else the most of them that divides B (rnn_head_gemm's tasks take 1, 2 or 4 rows)."""
    fits = [r for r in (1, 2, 4) if B % r == 0]
    return next((r for r in fits if heads * B // r <= blocks), fits[-1])


def _head_plan(plan: TrainingPlan, per_step: list, last, sizes: dict, B: int, blocks: int, forward: bool,
               heads: int) -> PersistentPlan:
    """The head-local layout (head_local): blocks (head, rows), each a head's HU = H / heads units of every item and
    its rows of each GEMM's weight, the head's columns only, resident in the mode's weight type (weight_stride)."""
    mode = precision(plan.precision)
    H = sizes["H"]
    units = H // heads
    rows = head_rows(B, heads, blocks)
    items, weights, offset, widest = [], [], 0, 0
    for kind, item, lag in per_step:
        if kind != "fused":
            items.append(Item(item, None, units, H))
            continue
        k = item.gemm.k(sizes)
        it = Item(item.kernel, item, units, H, k, item.members, offset, lag, len(weights))
        weights.append(item)
        runs = k // H
        offset += _round(runs * it.columns * weight_stride(units, mode) * mode.weight_bytes, 16) // 4
        widest = max(widest, runs * it.columns)
        items.append(it)
    final = None
    if last is not None:
        twin = next(it for it in items if it.stage is last)
        final = Item(None, last, twin.units, twin.dim, twin.k, twin.members, twin.offset, 0, twin.weight, True)
    direction = "fwd" if forward else "bwd"
    layout = PersistentPlan(f"{kernel_prefix(plan.cell.name)}_heads_{direction}", forward, tuple(items), final,
                            tuple(weights), heads * (B // rows), B, (sizes.get("I", 0), H, sizes.get("P", 0)),
                            offset, offset + _round(rows * widest, 4), heads, rows, plan.precision)
    if layout.shared_bytes > MAX_SHARED_BYTES:
        raise Refused(f"a block owning a head needs {layout.shared_bytes} bytes of shared memory (the head's weight "
                      f"rows in {plan.precision}), more than {MAX_SHARED_BYTES}")
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
    lstm_proj) faster (benchmarks/results/training-20261125-0628-H100/)."""
    if layout.heads:
        return True
    stages = sum(1 for it in layout.items if it.stage is not None and not it.gemm_only)
    return stages >= AUTO_MIN_STAGES and x_bytes(layout) <= AUTO_MAX_X_BYTES


def params_of(layout: PersistentPlan) -> list[str]:
    """The buffer arguments of the launch, in the order render declares them (then one weight a fused stage)."""
    names = set()
    for it in layout.items:
        names |= set(kernel_params(it.kernel))
        if it.stage is not None:
            names |= {it.gemm.operand.buffer, it.gemm.out.buffer}
    return sorted(names)


def render(plan: TrainingPlan, layout: PersistentPlan) -> str:
    """The CUDA source of one layer's persistent launch (see the module's docstring)."""
    if layout.heads:
        return _render_heads(plan, layout)
    columns, B = plan.columns, layout.batch
    written = set()
    for it in layout.items:
        written |= {p.buffer for _, p in it.kernel.stores}
        if it.stage is not None:
            written.add(it.gemm.out.buffer)
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
        lines += _item(it, columns, B)
        lines.append("        grid.sync();               // every block's units of this item (a block barrier too)")
    lines.append("    }")
    if layout.last is not None:
        lines += ["    {   // after the loop: the GEMM of step t0 (the next chunk's first kernel reads it)",
                  "        const int t = t0;"]
        lines += _item(layout.last, columns, B)
        lines.append("    }")
    lines += ["    (void)I; (void)H; (void)P;", "}"]
    return ascii_identifiers("\n".join(lines) + "\n")


def _render_heads(plan: TrainingPlan, layout: PersistentPlan) -> str:
    """The CUDA source of a head-local launch (head_local): block (hd, g) owns the units of head hd and batch rows
    g * RB .. g * RB + RB - 1 of every item; its rows of each weight, the head's columns only, stay in shared memory
    in the mode's type; a block barrier, no grid barrier, between items, as every value an item reads was written by
    this block (global memory written before __syncthreads is visible to the block after it)."""
    columns, B = plan.columns, layout.batch
    written = set()
    for it in layout.items:
        written |= {p.buffer for _, p in it.kernel.stores}
        if it.stage is not None:
            written.add(it.gemm.out.buffer)
    direction = "forward" if layout.forward else "backward"
    units, H = layout.items[0].units, layout.sizes[1]
    mode = MODE_NAMES[precision(layout.mode).mode]
    lines = [f"// Generated by engine.autodiff.persistent for cell '{plan.cell.name}' (structure hash "
             f"{plan.cell.structural_hash}): the training step's {direction},",
             f"// steps t0 .. t1 - 1 of one layer in one launch of {layout.heads} heads x {B // layout.rows} row "
             f"groups, each block a head's {units} units and {layout.rows} batch row(s), GEMMs in {plan.precision} "
             "(operands rounded, fp32 sums).",
             "// Do not edit.", helper_source(CELL_HELPERS), helper_source(TILE_GEMM_HELPER), helper_source(ROWS_GEMM),
             ""]
    lines.append(f'extern "C" __global__ void __launch_bounds__({THREADS}, 1) {layout.name}(')
    lines += declare(params_of(layout), written)
    lines += [f"    const float* __restrict__ W_{n}," for n in range(len(layout.stages))]
    lines.append("    const int t0, const int t1, const int I, const int H, const int P)")
    lines += ["{", f"    constexpr int B = {B};                              // batch rows",
              f"    constexpr int RB = {layout.rows};                              // of them this block's",
              f"    const int j0 = blockIdx.x * {units}, nu = {units};       // the head's units",
              "    const int r0 = blockIdx.y * RB;                   // the block's first batch row",
              "    extern __shared__ __align__(16) float smem[];"]
    if layout.stages:
        lines.append(f"    float* dots = smem + {layout.dots};          // a fused item's RB x columns of its GEMM, a "
                     "part a run")
    for it in layout.items:               # the block's rows of each GEMM's weight, the head's columns, once
        if it.stage is None:
            continue
        runs, ldr = it.k // H, _head_stride(layout, it)
        lines += [f"    // {it.gemm.name}: the head's {it.columns} rows (units x members), {runs} run(s) of {units} "
                  f"columns each, in {plan.precision}",
                  f"    rnn_load_head_rows<{mode}>(reinterpret_cast<RnnWeight<{mode}>::type*>(smem + {it.offset}), "
                  f"W_{it.weight} + (long)j0 * {it.members} * {it.k} + j0, {it.k}, H, {units}, {runs}, "
                  f"{it.columns}, {ldr}, {it.columns * ldr}L);"]
    lines.append("    __syncthreads();")
    lines.append("    for (int t = t0; t < t1; ++t) {                   // the launch's steps" if layout.forward else
                 "    for (int t = t1 - 1; t >= t0; --t) {              // the launch's steps, the last first")
    for it in layout.items:
        lines += _item(it, columns, B, layout)
        lines.append("        __syncthreads();           // this block's values of the item, for the next")
    lines.append("    }")
    if layout.last is not None:
        lines += ["    {   // after the loop: the GEMM of step t0 (the next chunk's first kernel reads it)",
                  "        const int t = t0;"]
        lines += _item(layout.last, columns, B, layout)
        lines.append("    }")
    lines += ["    (void)I; (void)H; (void)P;", "}"]
    return ascii_identifiers("\n".join(lines) + "\n")


def _head_stride(layout: PersistentPlan, it: Item) -> int:
    """Elements between a head-local block's resident weight rows (rnn_wstride of the mode)."""
    return weight_stride(it.units, precision(layout.mode))


def _head_gemm_lines(it: Item, columns: dict, layout: PersistentPlan, tg: str, pad: str) -> list[str]:
    """A head-local block's GEMM of step tg: its RB rows x the head's columns (rnn_head_gemm, a part a run of K), the
    parts added in order into dots and where the GEMM writes (to what is there when it accumulates)."""
    gemm, out = it.gemm, it.gemm.out
    M, COLS, runs, rows = it.members, it.columns, it.k // layout.sizes[1], layout.rows
    mode = MODE_NAMES[precision(layout.mode).mode]
    operand = gemm.operand
    ldx = f"({columns[operand.buffer].c_expr()})"
    offset = operand.offset.c_expr()
    x = (f"{operand.buffer} + ((long)({tg} + {operand.shift}) * B + r0) * {ldx}"
         + (f" + ({offset})" if offset != "0" else "") + " + j0")
    parts = " + ".join(f"dots[{p * rows * COLS} + i]" for p in range(runs))
    lines = [f"{pad}rnn_head_gemm<{mode}, RB, {64 // rows}, {it.units}, {runs}>({x}, {ldx}, H, RB, "
             f"reinterpret_cast<const RnnWeight<{mode}>::type*>(smem + {it.offset}), {_head_stride(layout, it)}, "
             f"{COLS * _head_stride(layout, it)}L, {COLS}, dots, {COLS}, {rows * COLS});",
             f"{pad}__syncthreads();                       // the block's GEMM columns are in dots, a part a run",
             f"{pad}for (int i = threadIdx.x; i < RB * {COLS}; i += blockDim.x) {{   // ... summed, and where the GEMM "
             "writes",
             f"{pad}    const int r = i / {COLS}, c = i - r * {COLS}, u = c / {M}, m = c - u * {M};",
             f"{pad}    float* o = {out.buffer} + ((long)({tg} + {out.shift}) * B + r0 + r) * "
             f"({columns[out.buffer].c_expr()}) + ({out.offset.c_expr()}) + m * {it.dim} + j0 + u;",
             f"{pad}    const float v = {'*o + ' if gemm.accumulate else ''}({parts});",
             f"{pad}    *o = v;",
             f"{pad}    dots[i] = v;",
             f"{pad}}}",
             f"{pad}__syncthreads();"]
    return lines


def _gemm_lines(it: Item, columns: dict, B: int, tg: str, pad: str) -> list[str]:
    """The block's columns of the item's GEMM of step tg into dots, then where the GEMM writes (added to what is
    there when it accumulates; then dots holds the sums too)."""
    gemm, out = it.gemm, it.gemm.out
    M, K, COLS = it.members, it.k, it.columns
    x = f"{gemm.operand.buffer} + (long)({tg} + {gemm.operand.shift}) * B * {K}"
    if B <= GEMV_MAX_ROWS:
        cw = -(-COLS // (THREADS // 32))
        weight = f"W_{it.weight} + (long)j0 * {M} * {K}"
        lines = [f"{pad}const RnnGemvJob<RNN_FP32> jobs[1] = {{{{{x}, {K}, {K}, {weight}, {K}, "
                 f"smem + {it.offset}, nu * {M}, dots, {COLS}, nullptr}}}};",
                 f"{pad}rnn_warp_gemvs<B, {cw}, 4, RNN_FP32, 1, {gemv_ksteps(1, B, K)}, 1u>(jobs);"]
    else:
        lines = [f"{pad}rnn_rows_gemm<{RW}, {CG}, {K}>({x}, B, smem + {it.offset}, {row_stride(K)}, nu * {M}, "
                 f"dots, {COLS});"]
    lines += [f"{pad}__syncthreads();                       // the block's GEMM columns are in dots",
              f"{pad}for (int i = threadIdx.x; i < B * nu * {M}; i += blockDim.x) {{   // ... and, in place, where "
              "the GEMM writes",
              f"{pad}    const int r = i / (nu * {M}), c = i - r * (nu * {M}), u = c / {M}, m = c - u * {M};",
              f"{pad}    float* o = {out.buffer} + ((long)({tg} + {out.shift}) * B + r) * "
              f"({columns[out.buffer].c_expr()}) + ({out.offset.c_expr()}) + m * {it.dim} + j0 + u;",
              f"{pad}    const float v = {'*o + ' if gemm.accumulate else ''}dots[r * {COLS} + c];",
              f"{pad}    *o = v;"]
    if gemm.accumulate:
        return lines + [f"{pad}    dots[r * {COLS} + c] = v;", f"{pad}}}", f"{pad}__syncthreads();"]
    return lines + [f"{pad}}}"]


def _item(it: Item, columns: dict, B: int, heads: PersistentPlan | None = None) -> list[str]:
    """One item of step t on this block's units. Where the block's elements fit its threads (B x TU <= THREADS) each
    thread issues its element's loads other than the GEMM's before the GEMM, so their latency hides behind it (as the
    fused stages do); the grid barrier after the item is the block's barrier too. A lag-1 item's GEMM (of step t + 1)
    is skipped at the chunk's first step: the kernel then reads those values where the GEMM wrote them. heads: the
    head-local layout, whose block owns RB batch rows from r0 and the head's units from j0 (_render_heads)."""
    kernel, stage = it.kernel, it.stage
    pad = "                "
    what = (f"GEMM {it.gemm.name} of step t alone" if it.gemm_only else
            f"{kernel.name}" + (f" after GEMM {it.gemm.name} of step t{' + 1' if it.lag else ''}" if stage else ""))
    rows, first = ("RB", "r0 + ") if heads else ("B", "")
    lines = [f"        {{   // {what}, on this block's units"]
    if not heads:
        lines.append(f"            const int j0 = blockIdx.x * {it.units}, nu = min({it.units}, {it.dim} - j0);")
    lines.append("            if (nu > 0) {")
    close = [f"{pad[:-4]}}}", "        }"]

    def gemm_lines(tg: str, indent: str) -> list[str]:
        return _head_gemm_lines(it, columns, heads, tg, indent) if heads else _gemm_lines(it, columns, B, tg, indent)

    def element_index(indent: str) -> list[str]:
        if heads:
            return [f"{indent}const int er = e / nu;", f"{indent}const long b = r0 + er;",
                    f"{indent}const int j = j0 + (e - er * nu);"]
        return [f"{indent}const long b = e / nu;", f"{indent}const int j = j0 + (int)(e - b * nu);"]
    if it.gemm_only:
        return lines + gemm_lines("t", pad) + close
    if stage is None:
        lines += [f"{pad}for (int e = threadIdx.x; e < {rows} * nu; e += blockDim.x) {{"] + element_index(pad + "    ")
        lines += statement_body(kernel, columns, pad + "    ")
        return lines + [f"{pad}}}"] + close
    M, COLS = it.members, it.columns
    from_dots = gemm_loads(stage)
    early = [(value, place) for value, place in kernel.loads if value not in from_dots]
    gemm_values = [(value, place) for value, place in kernel.loads if value in from_dots]
    row = "(b - r0)" if heads else "b"

    def from_gemm(value, place) -> str:
        dot = f"dots[{row} * {COLS} + (j - j0) * {M} + {from_dots[value]}]"
        return f"here ? {dot} : {element(place, columns)}" if it.lag else dot
    math = [f"const float {var(st.var)} = {statement_expr(st)};" for st in kernel.statements]
    stores = store_lines(kernel, columns)
    one_each = (heads.rows if heads else B) * it.units <= THREADS
    if it.lag:
        lines.append(f"{pad}const bool here = t + 1 < t1;         // else the chunk before ran this GEMM")
    if one_each:                         # an element a thread: its other loads in flight during the GEMM
        lines.append(f"{pad}const int e = (int)threadIdx.x < {rows} * nu ? (int)threadIdx.x : 0;")
        lines += element_index(pad)
        lines += [f"{pad}const float {var(value)} = {element(place, columns)};" for value, place in early]
    tg = "t + 1" if it.lag else "t"
    gemm = gemm_lines(tg, pad + ("    " if it.lag else ""))
    lines += ([f"{pad}if (here) {{"] + gemm + [f"{pad}}}"]) if it.lag else gemm
    if one_each:
        lines.append(f"{pad}if ((int)threadIdx.x < {rows} * nu) {{")
        body = [f"const float {var(value)} = {from_gemm(value, place)};" for value, place in gemm_values]
    else:
        lines += [f"{pad}for (int e = threadIdx.x; e < {rows} * nu; e += blockDim.x) {{"] + element_index(pad + "    ")
        body = ([f"const float {var(value)} = {element(place, columns)};" for value, place in early]
                + [f"const float {var(value)} = {from_gemm(value, place)};" for value, place in gemm_values])
    lines += [f"{pad}    {line}" for line in body + math + stores]
    return lines + [f"{pad}}}"] + close


class PersistentLaunch:
    """A layer's persistent launch of one direction on the GPU: the compiled kernel, its weights, the launch."""

    def __init__(self, runner, plan: TrainingPlan, layout: PersistentPlan):
        self.runner, self.plan, self.layout = runner, plan, layout
        self.source = render(plan, layout)
        self.kernel = compile_kernel(self.source, layout.name, not layout.heads, layout.shared_bytes, plan.cell.name)
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
        grid = ((self.layout.heads, self.layout.batch // self.layout.rows) if self.layout.heads else
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
