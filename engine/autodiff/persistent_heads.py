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
from ..schedules.staging import weight_stride
from .fused_codegen import declare
from .fused_plan import TrainingPlan
from .persistent_items import head_on_tensor_cores, head_stride, item_lines
from .persistent_plan import (
    MAX_SHARED_BYTES,
    ROWS_GEMM,
    THREADS,
    Item,
    PersistentPlan,
    Refused,
    params_of,
    round_up,
    written_buffers,
)


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


MMA_GEMM = "mma_gemm.cuh"    # rnn_mma, rnn_ldmatrix4: the 16-bit modes' head GEMM (rnn_head_mma)
SPLITS = (1, 2, 4, 8)    # blocks a head may take: a cluster of at most 8 (the portable cluster size)
MIN_SPLIT = 1            # the fewest (the tests raise it to run the clusters at small sizes)
MAX_BLOCKS = None        # a cap on the blocks a launch fills (None: the SMs it is given; probes lower it)


def head_rows(B: int, heads: int, blocks: int) -> int:
    """Batch rows a head-local block owns: the fewest of 1, 2, 4 that divides B and keeps heads x B / rows blocks
    within `blocks` (one wave), else the most of them that divides B (rnn_head_gemm's tasks take 1, 2 or 4 rows)."""
    fits = [r for r in (1, 2, 4) if B % r == 0]
    return next((r for r in fits if heads * B // r <= blocks), fits[-1])


def head_plan(plan: TrainingPlan, per_step: list, last, sizes: dict, B: int, blocks: int, forward: bool,
              heads: int) -> PersistentPlan:
    """The head-local layout (head_local): the fewest blocks a head (`split`, from MIN_SPLIT: 1, 2, 4 or 8, a
    thread-block cluster where more than one) whose share of the head's weight rows fits shared memory. Block (head,
    part, rows) owns H / heads / split units of every item and its rows of each GEMM's weight, the head's columns
    only, resident in the mode's weight type (weight_stride)."""
    why = ""
    for split in (s for s in SPLITS if s >= MIN_SPLIT):
        if (sizes["H"] // heads) % split:
            continue
        try:
            return _split_plan(plan, per_step, last, sizes, B, blocks, forward, heads, split)
        except Refused as e:
            why = str(e)
    raise Refused(why or f"a head of {sizes['H'] // heads} units does not split into {SPLITS} blocks")


def _split_plan(plan: TrainingPlan, per_step: list, last, sizes: dict, B: int, blocks: int, forward: bool,
                heads: int, split: int) -> PersistentPlan:
    mode = precision(plan.precision)
    H = sizes["H"]
    units = H // heads // split
    rows = head_rows(B, heads * split, min(blocks, MAX_BLOCKS or blocks))
    stride = weight_stride(H // heads, mode)
    items, weights, offset, widest = [], [], 0, 0
    for kind, item, lag in per_step:
        if kind != "fused":
            items.append(Item(item, None, units, H))
            continue
        k = item.gemm.k(sizes)
        it = Item(item.kernel, item, units, H, k, item.members, offset, lag, len(weights))
        weights.append(item)
        runs = k // H
        offset += round_up(runs * it.columns * stride * mode.weight_bytes, 16) // 4
        widest = max(widest, runs * it.columns)
        items.append(it)
    final = None
    if last is not None:
        twin = next(it for it in items if it.stage is last)
        final = Item(None, last, twin.units, twin.dim, twin.k, twin.members, twin.offset, 0, twin.weight, True)
    direction = "fwd" if forward else "bwd"
    layout = PersistentPlan(f"{kernel_prefix(plan.cell.name)}_heads_{direction}", forward, tuple(items), final,
                            tuple(weights), heads * split * (B // rows), B, (sizes.get("I", 0), H, sizes.get("P", 0)),
                            offset, offset + round_up(rows * widest, 4), heads, rows, plan.precision, split)
    if layout.shared_bytes > MAX_SHARED_BYTES:
        raise Refused(f"a block owning {'a head' if split == 1 else f'1/{split} of a head'} needs "
                      f"{layout.shared_bytes} bytes of shared memory (its weight rows in {plan.precision}), more than "
                      f"{MAX_SHARED_BYTES}")
    return layout


def render_heads(plan: TrainingPlan, layout: PersistentPlan) -> str:
    """The CUDA source of a head-local launch (head_local): block (hd * SPLIT + part, g) owns units part * U ..
    part * U + U - 1 of head hd (U = H / heads / SPLIT) and batch rows g * RB .. g * RB + RB - 1 of every item; its
    rows of each weight, the head's columns only, stay in shared memory in the mode's type. Between items a block
    barrier, or with SPLIT > 1 a barrier of the head's cluster, and no grid barrier: every value an item reads was
    written by the block or its cluster (global memory written before __syncthreads, or before the cluster barrier's
    arrive, which releases at cluster scope, is visible after it)."""
    columns, B = plan.columns, layout.batch
    written = written_buffers(layout)
    direction = "forward" if layout.forward else "backward"
    units, H, split = layout.items[0].units, layout.sizes[1], layout.split
    head = layout.head_units
    mode = MODE_NAMES[precision(layout.mode).mode]
    ldr = head_stride(layout)
    barrier = ("cooperative_groups::this_cluster().sync();   // the cluster's values of the item, for the next"
               if split > 1 else "__syncthreads();           // this block's values of the item, for the next")
    lines = [f"// Generated by engine.autodiff.persistent for cell '{plan.cell.name}' (structure hash "
             f"{plan.cell.structural_hash}): the training step's {direction},",
             f"// steps t0 .. t1 - 1 of one layer in one launch of {layout.heads} heads x {B // layout.rows} row "
             f"groups, each block {units} units of a head ({split} block(s) a head) and {layout.rows} batch row(s), "
             f"GEMMs in {plan.precision} (operands rounded, fp32 sums).",
             "// Do not edit.", *(["#include <cooperative_groups.h>"] if split > 1 else []),
             helper_source(CELL_HELPERS), helper_source(TILE_GEMM_HELPER),
             *([helper_source(MMA_GEMM)] if head_on_tensor_cores(layout) else []), helper_source(ROWS_GEMM), ""]
    cluster = f" __cluster_dims__({split}, 1, 1)" if split > 1 else ""
    lines.append(f'extern "C" __global__ void __launch_bounds__({THREADS}, 1){cluster} {layout.name}(')
    lines += declare(params_of(layout), written)
    lines += [f"    const float* __restrict__ W_{n}," for n in range(len(layout.stages))]
    lines.append("    const int t0, const int t1, const int I, const int H, const int P)")
    lines += ["{", f"    constexpr int B = {B};                              // batch rows",
              f"    constexpr int RB = {layout.rows};                              // of them this block's",
              f"    const int k0 = blockIdx.x / {split} * {head};          // the head's first unit: its columns of K",
              f"    const int j0 = k0 + blockIdx.x % {split} * {units}, nu = {units};   // the block's units",
              "    const int r0 = blockIdx.y * RB;                   // the block's first batch row",
              "    extern __shared__ __align__(16) float smem[];"]
    if layout.stages:
        lines.append(f"    float* dots = smem + {layout.dots};          // a fused item's RB x columns of its GEMM, a "
                     "part a run")
    for it in layout.items:               # the block's rows of each GEMM's weight, the head's columns, once
        if it.stage is None:
            continue
        runs = it.k // H
        lines += [f"    // {it.gemm.name}: the block's {it.columns} rows (units x members), {runs} run(s) of the head's "
                  f"{head} columns each, in {plan.precision}",
                  f"    rnn_load_head_rows<{mode}>(reinterpret_cast<RnnWeight<{mode}>::type*>(smem + {it.offset}), "
                  f"W_{it.weight} + (long)j0 * {it.members} * {it.k} + k0, {it.k}, H, {head}, {runs}, "
                  f"{it.columns}, {ldr}, {it.columns * ldr}L);"]
    lines.append("    __syncthreads();")
    lines.append("    for (int t = t0; t < t1; ++t) {                   // the launch's steps" if layout.forward else
                 "    for (int t = t1 - 1; t >= t0; --t) {              // the launch's steps, the last first")
    for it in layout.items:
        lines += item_lines(it, columns, B, layout)
        lines.append(f"        {barrier}")
    lines.append("    }")
    if layout.last is not None:
        lines += ["    {   // after the loop: the GEMM of step t0 (the next chunk's first kernel reads it)",
                  "        const int t = t0;"]
        lines += item_lines(layout.last, columns, B, layout)
        lines.append("    }")
    lines += ["    (void)I; (void)H; (void)P;", "}"]
    return ascii_identifiers("\n".join(lines) + "\n")
