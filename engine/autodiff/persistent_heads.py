"""Head-local persistent training launches (engine/autodiff/persistent.py): where every step GEMM's weights are
block-diagonal by heads (W(..., heads=k), the dense form's `diagonal` weights: the sLSTM), a block owns a head's units
and a few batch rows, and reads no other block's values, so a direction is one launch with no grid barrier. The GEMMs
(kernels/persistent_gemm.cuh rnn_head_gemm) read only the head's columns of their operand, with the block's weight
rows resident in shared memory in the precision mode's type; operands enter the products rounded to the mode, so
these are the persistent launches a reduced mode may take."""
from __future__ import annotations

from ..c_names import ascii_identifiers, kernel_prefix
from ..codegen.cuda import CELL_HELPERS, helper_source
from ..codegen.precision import precision
from ..codegen.wavefront import MODE_NAMES, TILE_GEMM_HELPER
from ..schedules.tiling import weight_stride
from .fused_codegen import declare
from .fused_plan import TrainingPlan
from .persistent_items import head_stride, item_lines
from .persistent_plan import MAX_SHARED_BYTES, ROWS_GEMM, THREADS, Item, PersistentPlan, Refused, params_of, round_up


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


def head_plan(plan: TrainingPlan, per_step: list, last, sizes: dict, B: int, blocks: int, forward: bool,
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
        offset += round_up(runs * it.columns * weight_stride(units, mode) * mode.weight_bytes, 16) // 4
        widest = max(widest, runs * it.columns)
        items.append(it)
    final = None
    if last is not None:
        twin = next(it for it in items if it.stage is last)
        final = Item(None, last, twin.units, twin.dim, twin.k, twin.members, twin.offset, 0, twin.weight, True)
    direction = "fwd" if forward else "bwd"
    layout = PersistentPlan(f"{kernel_prefix(plan.cell.name)}_heads_{direction}", forward, tuple(items), final,
                            tuple(weights), heads * (B // rows), B, (sizes.get("I", 0), H, sizes.get("P", 0)),
                            offset, offset + round_up(rows * widest, 4), heads, rows, plan.precision)
    if layout.shared_bytes > MAX_SHARED_BYTES:
        raise Refused(f"a block owning a head needs {layout.shared_bytes} bytes of shared memory (the head's weight "
                      f"rows in {plan.precision}), more than {MAX_SHARED_BYTES}")
    return layout


def render_heads(plan: TrainingPlan, layout: PersistentPlan) -> str:
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
        runs, ldr = it.k // H, head_stride(layout, it)
        lines += [f"    // {it.gemm.name}: the head's {it.columns} rows (units x members), {runs} run(s) of {units} "
                  f"columns each, in {plan.precision}",
                  f"    rnn_load_head_rows<{mode}>(reinterpret_cast<RnnWeight<{mode}>::type*>(smem + {it.offset}), "
                  f"W_{it.weight} + (long)j0 * {it.members} * {it.k} + j0, {it.k}, H, {units}, {runs}, "
                  f"{it.columns}, {ldr}, {it.columns * ldr}L);"]
    lines.append("    __syncthreads();")
    lines.append("    for (int t = t0; t < t1; ++t) {                   // the launch's steps" if layout.forward else
                 "    for (int t = t1 - 1; t >= t0; --t) {              // the launch's steps, the last first")
    for it in layout.items:
        lines += item_lines(it, columns, B, layout)
        lines.append("        __syncthreads();           // this block's values of the item, for the next")
    lines.append("    }")
    if layout.last is not None:
        lines += ["    {   // after the loop: the GEMM of step t0 (the next chunk's first kernel reads it)",
                  "        const int t = t0;"]
        lines += item_lines(layout.last, columns, B, layout)
        lines.append("    }")
    lines += ["    (void)I; (void)H; (void)P;", "}"]
    return ascii_identifiers("\n".join(lines) + "\n")
