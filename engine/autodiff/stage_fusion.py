"""Fused stages of the training step (engine/autodiff/fused_runner.py): a step GEMM and the kernel that reads it as one
launch, for batches of up to FUSE_MAX_ROWS rows; above that, where the GEMM splits K, the kernel sums the parts itself.

At small batch a step is a chain of short dependent launches (at `lat`, B = 1, a GEMV of ~3 us and a kernel of ~2 us,
with ~1 us between graph nodes), so the launches, not the arithmetic, set the step's time. A fused stage computes, in
each thread block, the GEMM's columns of a few hidden units (every member's column of those units), writes them where
the GEMM would have, and then runs the kernel's elementwise statements on the same units: the kernel reads a GEMM value
only at its own element (b, j), so no block waits for another. At larger batches cuBLAS keeps the GEMM; where it
splits K (engine/autodiff/cublas.py) the same pair becomes the split GEMM and the kernel that first sums the parts of
its own elements (FusedStage.summed), so the reduce launch between them goes.

    stages = fused_stages(plan)                     # {(gemm, kernel, lag): FusedStage} the plan allows
    launches = launch_sequence(plan.backward, steps, forward=False, stages=stages)
        # [("gemm", GemmPlan, t) | ("kernel", KernelPlan, t) | ("fused" | "split", FusedStage, t_gemm, t)]

The pairs are adjacent items of a chunk's launches, in order: within a step forward ([GEMM, kernel], lag 0), and in
the backward also across steps: [kernel, GEMM] a step becomes the first step's kernel, then [GEMM of step t + 1,
kernel of step t] (lag 1), then the last GEMM. A pair fuses only where nothing races: the kernel reads the GEMM's
output of the rows the launch writes only at the GEMM members' own columns, and writes neither the GEMM's operand rows
nor its output rows (fusible() says why not). engine/autodiff/fused_codegen.py renders a FusedStage (render_fused, a
variant per block width of WIDTHS; render_summed); the GEMM part is kernels/fused_stage.cuh's warp GEMV (B <= 2) or
kernels/tile_gemm.cuh's register-tiled GEMM.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..plan import Lin
from .fused_plan import GemmPlan, KernelPlan, StepPlan, TrainingPlan

FUSE = True              # fuse stages where the batch allows (False: every GEMM through cuBLAS, every kernel alone)
SPLIT_SUMS = True        # where a stage is not fused and its GEMM splits K (engine/autodiff/cublas.py), the kernel
                         # sums the parts itself (FusedStage.summed): no reduce launch between them
FUSE_MAX_ROWS = 2        # batches of more rows keep cuBLAS by default: at blogB (B = 64) the tiled form lost to it on
                         # the H100 (LSTM 7.9 against 5.6 ms a step; benchmarks/NOTES.md, 2026-11-25 00:55). Up to
                         # 64 rows work (the GPU tests run them).
WIDTHS = (8, 16, 32)     # GEMM columns a block of a fused stage covers, one compiled variant each (a warp takes
                         # width / 8 of them at small batch): its units are width // members (at least 1), every
                         # member's column of each. choose_width picks one per launch.
WIDTH = None             # a width of WIDTHS for every fused launch (probes, tests); None: choose_width's
INTERLEAVED = True       # True: the GEMV reads a copy of the weights with a unit's members interleaved, made each call;
                         # False: it reads them in place, row m * D + unit, no copy. Back to back on the H100 (same
                         # machine, 2026-11-25 02:13) in place was as fast for the LSTM and GRU-Cho and slower for
                         # lstm_fgr's forward (6.5 against 5.5 us: a block reads 4 runs of 64 KiB instead of one of
                         # 256 KiB). The tiled form always interleaves (it stages a block's rows as one run).
THREADS = 256
GEMV_MAX_ROWS = 2        # batches up to this: the warp GEMV (kernels/fused_stage.cuh), else kernels/tile_gemm.cuh's tiles
# rnn_tile_gemms' shape for the larger batches: a thread's RB x RC accumulators, K chunks of KC staged STAGES deep.
# (4, 2, 32, 2) was the best of five at blogB with FUSE_MAX_ROWS = 64 (LSTM 6.8 ms a step, cuBLAS with SPLIT_SUMS 5.6)
TILE_RB, TILE_RC, TILE_KC, TILE_STAGES = 4, 2, 32, 2


@dataclass(frozen=True)
class FusedStage:
    """gemm (of step t + lag) then kernel (of step t), one launch over blocks of `units` units of the kernel's size.
    The launch's weight has a row per GEMM column (weight_layout): the forward's stacked weight, the backward's
    transposed (row j: column j of the stacked weight, for out = dy @ W); the GEMV reads member m's row of unit j at
    m * D + j. With the tiled form compiled in, a unit's members are interleaved instead (row j * members + m), so a
    block's rows are one run."""
    name: str
    gemm: GemmPlan
    kernel: KernelPlan
    lag: int
    forward: bool
    members: int              # the GEMM's output column blocks, each of the kernel's size (GemmPlan.out_blocks)

    def units(self, width: int) -> int:
        """Units a block of the variant `width` covers."""
        return max(1, width // self.members)

    def columns(self, width: int) -> int:
        return self.units(width) * self.members

    def variant(self, width: int) -> str:
        """The compiled function of the variant `width`."""
        return f"{self.name}_w{width}"

    @property
    def summed(self) -> str:
        """The compiled kernel that sums the GEMM's split-K parts, then runs the statements (SPLIT_SUMS)."""
        return f"{self.kernel.name}__sums_{self.gemm.name}"

    @property
    def member_offsets(self) -> tuple[Lin, ...]:
        """Each member's first column in the GEMM's output buffer."""
        return _member_offsets(self.gemm.out.offset, Lin.of(self.kernel.dim), self.members)

    def weight_layout(self, interleaved: bool) -> tuple[tuple, str, int]:
        """(the stacked weight's key, "stacked" | "interleaved" | "transposed", members): the array the launch reads
        (lay_out makes it from the stacked weight). The GEMV can find a unit's rows itself (row m * D + unit: the
        forward's stacked weight as it is, the backward's transposed); the tiled GEMM, which stages a block's rows as
        one run, needs a unit's members interleaved (interleaved: the module reads them so, Runner.interleaved)."""
        members = self.members if interleaved else 1
        if not self.forward:
            return self.gemm.stack, "transposed", members
        return self.gemm.stack, "interleaved" if members > 1 else "stacked", members


def _member_offsets(start: Lin, width: Lin, members: int) -> tuple[Lin, ...]:
    offsets = [start]
    for _ in range(members - 1):
        offsets.append(offsets[-1] + width)
    return tuple(offsets)


def fusible(plan: TrainingPlan, gemm: GemmPlan, kernel: KernelPlan, lag: int, forward: bool) -> str | None:
    """Why `gemm` (of step t + lag) and `kernel` (of step t) cannot be one launch, or None when they can."""
    columns = plan.columns
    if gemm.hoisted:
        return "the GEMM is hoisted (once a layer, over every step)"
    operand, out = gemm.operand, gemm.out
    if operand.kind != "row" or operand.offset != Lin() or columns[operand.buffer] != gemm.k:
        return "the GEMM's operand is not a whole buffer of K columns (the tiled GEMM stages rows of stride K)"
    if out.kind != "row":
        return "the GEMM's output is not a buffer"
    width, total = Lin.of(kernel.dim), Lin()
    for w in gemm.out_blocks:
        total = total + w
    if total != gemm.n:
        return "the GEMM's output blocks do not make up its columns"
    if any(w != width for w in gemm.out_blocks):
        return f"the GEMM's output blocks are not {kernel.dim} columns each, the kernel's size"
    owned = set(_member_offsets(out.offset, width, len(gemm.out_blocks)))
    gemm_block = lag + out.shift                       # row blocks relative to the kernel's step t
    for value, place in kernel.loads:
        if place.kind == "row" and place.buffer == out.buffer and place.shift == gemm_block \
                and place.offset not in owned:
            return f"the kernel reads {value} from the GEMM's output rows at another element than its own"
    for value, place in kernel.stores:
        if place.kind != "row":
            continue
        if place.buffer == operand.buffer and place.shift == lag + operand.shift:
            return f"the kernel writes {value} into the rows the GEMM reads"
        if place.buffer == out.buffer and place.shift == gemm_block:
            return f"the kernel writes {value} into the rows the GEMM writes"
    return None


def _stage(plan: TrainingPlan, gemm: GemmPlan, kernel: KernelPlan, lag: int, forward: bool) -> FusedStage | None:
    if fusible(plan, gemm, kernel, lag, forward) is not None:
        return None
    return FusedStage(f"{kernel.name}__with_{gemm.name}", gemm, kernel, lag, forward, len(gemm.out_blocks))


def _pairs(step: StepPlan, forward: bool):
    """Adjacent (GEMM, kernel, lag) items of a chunk's launches: within a step, and from a step's last item to the
    next step's first (forward t + 1: lag -1; backward t - 1: lag 1)."""
    order = step.order
    for (k1, a), (k2, b) in zip(order, order[1:]):
        if k1 == "gemm" and k2 == "kernel":
            yield a, b, 0
    if len(order) > 1 and order[-1][0] == "gemm" and order[0][0] == "kernel":
        yield order[-1][1], order[0][1], -1 if forward else 1


def fused_stages(plan: TrainingPlan) -> dict:
    """{(gemm name, kernel name, lag): FusedStage} of every adjacent pair of the training plan that fuses."""
    stages = {}
    for step, forward in ((plan.forward, True), (plan.backward, False)):
        for gemm, kernel, lag in _pairs(step, forward):
            stage = _stage(plan, gemm, kernel, lag, forward)
            if stage is not None:
                stages[(gemm.name, kernel.name, lag)] = stage
    return stages


def stage_weights(stages: dict, interleaved: bool) -> tuple[tuple[tuple, str, int], ...]:
    """The weight layouts the fused stages read other than the stacked weights themselves (FusedStage.weight_layout)."""
    layouts = (s.weight_layout(interleaved) for s in stages.values())
    return tuple(dict.fromkeys(layout for layout in layouts if layout[1] != "stacked"))


def lay_out(xp, stacked, layout: str, members: int):
    """The stacked weight (rows, K) in a fused stage's layout: "transposed", (K, rows), then as "interleaved" where
    members > 1; "interleaved": member m's row j (row m * rows / members + j) at row j * members + m."""
    if layout == "transposed":
        stacked = stacked.T
    if members == 1:
        return stacked
    rows, k = stacked.shape
    return stacked.reshape(members, rows // members, k).transpose(1, 0, 2).reshape(rows, k)


HALF = 0.45              # "about half the SMs": 64 blocks count on the H100's 132


def widths(stage: FusedStage, B: int) -> list[int]:
    """The variants whose shared memory at B rows is within MAX_SHARED_BYTES."""
    return [w for w in WIDTHS if 4 * shared_floats(stage, B, w) <= MAX_SHARED_BYTES]


def choose_width(stage: FusedStage, D: int, B: int, multiprocessors: int) -> int:
    """Of the variants that fit (widths), the widest that still launches at least half as many blocks as the GPU has
    SMs for a kernel size of D units (a layer's launch then leaves room for the wavefront's other layers, and each
    block reads more of W at once), else the narrowest. WIDTH forces one, where it fits."""
    fit = widths(stage, B)
    if WIDTH in fit:
        return WIDTH
    wide = [w for w in fit if -(-D // stage.units(w)) >= HALF * multiprocessors]
    return max(wide) if wide else min(fit)


def shared_floats(stage: FusedStage, B: int, width: int) -> int:
    """Floats of dynamic shared memory a fused stage takes at B rows: its GEMM columns (B x columns), then the tiled
    GEMM's staging for B > GEMV_MAX_ROWS (kernels/tile_gemm.cuh: STAGES slots of (round_up(B, RB) + columns) rows of
    rnn_row_stride(KC), then the split-K partial sums)."""
    dots = -(-B * stage.columns(width) // 4) * 4     # the staging after it starts 16-byte aligned (cp.async)
    if B <= GEMV_MAX_ROWS:
        return dots
    row_stride = -(-TILE_KC // 4) * 4 + 4
    staging = TILE_STAGES * (-(-B // TILE_RB) * TILE_RB + stage.columns(width)) * row_stride
    return dots + staging + THREADS * min(TILE_RB * TILE_RC, 16)


MAX_SHARED_BYTES = 48 * 1024     # what a launch may take without opting in to more


def switches() -> tuple:
    """The module's switches that shape a program's launches (a cached program's captured graphs keep them)."""
    return FUSE, FUSE_MAX_ROWS, SPLIT_SUMS, WIDTH, INTERLEAVED


def fuses(stages: dict, B: int, layer_sizes: list[dict]) -> bool:
    """Whether steps of B rows of layers of these sizes run the fused stages: FUSE on, B <= FUSE_MAX_ROWS, a stage to
    fuse, every GEMM's K a multiple of 4 (16-byte loads: the one form compiled) and a variant of every stage within
    MAX_SHARED_BYTES."""
    return (FUSE and 0 < B <= FUSE_MAX_ROWS and bool(stages)
            and all(s.gemm.k(sizes) % 4 == 0 for s in stages.values() for sizes in layer_sizes)
            and all(widths(s, B) for s in stages.values()))


def launch_sequence(step: StepPlan, steps: range, forward: bool, stages: dict, as_: str = "fused") -> list[tuple]:
    """The launches of `steps` (the backward: last step first), adjacent pairs in `stages` as one item (as_, stage,
    t_gemm, t): "fused" (one launch) or "split" (cuBLAS's split-K parts, then the summing kernel)."""
    items = [(kind, item, t) for t in (steps if forward else reversed(steps)) for kind, item in step.order]
    out, i = [], 0
    while i < len(items):
        kind, item, t = items[i]
        if kind == "gemm" and i + 1 < len(items) and items[i + 1][0] == "kernel":
            _, kernel, tk = items[i + 1]
            stage = stages.get((item.name, kernel.name, t - tk))
            if stage is not None:
                out.append((as_, stage, t, tk))
                i += 2
                continue
        out.append(items[i])
        i += 1
    return out


def describe(plan: TrainingPlan) -> list[str]:
    """Lines for explain(): which launches fuse at small batch."""
    stages = fused_stages(plan)
    if not stages:
        return [f"  fused stages (B <= {FUSE_MAX_ROWS}): none"]
    lines = [f"  fused stages (B <= {FUSE_MAX_ROWS}; above, where the GEMM splits K, the kernel sums its parts):"]
    for s in stages.values():
        when = "the same step" if s.lag == 0 else f"GEMM of step t{s.lag:+d}, kernel of step t"
        lines.append(f"    {'forward' if s.forward else 'backward'}: GEMM {s.gemm.name} + kernel {s.kernel.name} "
                     f"({when}; blocks of {', '.join(str(s.units(w)) for w in WIDTHS)} units)")
    return lines
