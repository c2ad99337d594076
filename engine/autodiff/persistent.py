"""The training step's forward as persistent launches (issue #13; benchmarks/NOTES.md, fifteenth session). Off by
default (PERSISTENT): in the wavefront it matches the fused forward at `blogB` and `lat` and is slower at `mid`
(benchmarks/results/session15/persistent-forward-tiles-H100.md); the base of the persistent backward.

The fused forward (engine/autodiff/fused.py) launches each stage of each step: a GEMM (cuBLAS, or the fused GEMV at
B <= 2) and a kernel, T x stages launches a layer, each reading its weight rows from L2 again. Here a chunk of a
layer's steps is one cooperative launch of at most one block an SM (Diamos et al., "Persistent RNNs", ICML 2016):
block g owns units [g * TU, (g + 1) * TU) of each stage, loads its rows of the stage's weight into shared memory once,
and at every step computes its columns of the stage's GEMM from there (the warp GEMV of kernels/tile_gemm.cuh for
B <= 4 rows, kernels/persistent_gemm.cuh above), writes them where the GEMM would, runs the stage's statements on its
units (the same loads, statements and stores as the fused kernels: fused_codegen), and waits at a grid-wide barrier
for every other block before the next stage. The hoisted input projection stays one cuBLAS GEMM over the chunk
before the launch. Layer by layer a launch covers the sequence on every SM; in the wavefront (the default order) a
launch covers a chunk of WAVEFRONT_CHUNK steps on SMs / L blocks, so the L layers' launches of a diagonal run side by
side (each launch waits only at its own barriers: no spinning on another launch, so no deadlock when they cannot all
be resident).

    forward = persistent_forward(runner, sizes, B, blocks)   # None where the layer does not qualify (refusal says why)
    forward.lay_out(layer)                                   # after Program.load: the weights, members interleaved
    forward.launch(layer, steps)                             # after the chunk's hoisted GEMMs, on the same stream

A plan qualifies when a step is a fixed sequence of fused stages (a GEMM and the kernel that reads it, the same step)
and kernels alone (stage_fusion.launch_sequence), every GEMM's K a multiple of 4, and the weights of a block and its
staging fit the shared memory of a block. Sizes, the batch and the grid are compile-time constants: one module a
(plan, layer sizes, B, grid).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..codegen.cuda import CELL_HELPERS, helper_source
from ..codegen.wavefront import TILE_GEMM_HELPER, gemv_ksteps
from .fused_codegen import _body, _declare, _gemm_loads, element, kernel_params, statement_expr, var
from .fused_plan import KernelPlan, TrainingPlan
from .stage_fusion import FusedStage, launch_sequence

THREADS = 256
GEMV_MAX_ROWS = 4                  # rnn_warp_gemvs (kernels/tile_gemm.cuh) up to this many rows, rnn_rows_gemm above
ROWS_GEMM = "persistent_gemm.cuh"  # rnn_rows_gemm, for more rows than the GEMV takes
RW, CG = 8, 8                      # its task: rows x columns a warp (64 partial sums a lane)
MAX_SHARED_BYTES = 227 * 1024      # an H100's or H200's shared memory a block may opt in to
PERSISTENT = False                 # the fused step's forward runs persistent where a layer qualifies (Program)


def _round(n: int, m: int) -> int:
    return -(-n // m) * m


def row_stride(k: int) -> int:
    """kernels/tile_gemm.cuh rnn_row_stride: a resident row's floats."""
    return _round(k, 4) + 4


@dataclass(frozen=True)
class Item:
    """One item of a step, in order: a fused stage (GEMM, then the kernel on the same units) or a kernel alone."""
    kernel: KernelPlan
    stage: FusedStage | None
    units: int                      # TU: units a block owns
    dim: int                        # D: the kernel's size
    k: int = 0                      # the GEMM's K
    members: int = 1
    offset: int = 0                 # floats of shared memory before the block's resident rows

    @property
    def columns(self) -> int:
        return self.units * self.members

    @property
    def rows(self) -> int:
        """Resident rows, zeros past the block's columns up to a multiple of 8 (the GEMM's tiles read them)."""
        return _round(self.columns, 8)


@dataclass(frozen=True)
class PersistentPlan:
    name: str
    items: tuple[Item, ...]
    grid: int                       # blocks (at most one an SM)
    batch: int
    sizes: tuple                    # (I, H, P) of the layer
    dots: int                       # floats of shared memory where a block's GEMM columns go (B x the widest)
    shared_floats: int

    @property
    def shared_bytes(self) -> int:
        return 4 * self.shared_floats


def refusal(plan: TrainingPlan, stages: dict, sizes: dict, B: int, blocks: int) -> str | None:
    """Why a layer of these sizes at B rows cannot run its forward persistent on `blocks` blocks, or None."""
    items = launch_sequence(plan.forward, range(2), True, stages)
    per_step = len(items) // 2
    if not items or len(items) % 2 or any(i[0] == "gemm" for i in items):
        return "a step GEMM does not fuse with the kernel after it (stage_fusion.fusible)"
    if any(len(i) == 4 and i[2] != i[3] for i in items):
        return "a fused stage reads the GEMM of another step"
    if [i[1] for i in items[:per_step]] != [i[1] for i in items[per_step:]]:
        return "the steps' launches differ"
    for kind, item, *_ in items[:per_step]:
        if kind == "fused" and item.gemm.k(sizes) % 4:
            return f"GEMM {item.gemm.name}'s K ({item.gemm.k(sizes)}) is not a multiple of 4"
    layout = make_plan(plan, stages, sizes, B, blocks)
    if layout.shared_bytes > MAX_SHARED_BYTES:
        return (f"a block needs {layout.shared_bytes} bytes of shared memory (its weight rows and GEMM columns), "
                f"more than {MAX_SHARED_BYTES}")
    return None


def make_plan(plan: TrainingPlan, stages: dict, sizes: dict, B: int, blocks: int) -> PersistentPlan:
    """The items of a step on at most `blocks` blocks (no more than the widest item's units), a block's units of
    each, and the shared memory: the stages' resident rows one after another, then the GEMM columns (dots)."""
    per_step = launch_sequence(plan.forward, range(1), True, stages)
    dims = [sizes[i[1].kernel.dim if i[0] == "fused" else i[1].dim] for i in per_step]
    grid = max(1, min(blocks, max(dims)))
    items, offset, widest = [], 0, 0
    for (kind, item, *_), dim in zip(per_step, dims):
        units = -(-dim // grid)
        if kind == "fused":
            k = item.gemm.k(sizes)
            it = Item(item.kernel, item, units, dim, k, item.members, offset)
            offset += it.rows * row_stride(k)
            widest = max(widest, it.columns)
        else:
            it = Item(item, None, units, dim)
        items.append(it)
    dots = offset
    return PersistentPlan(f"{plan.cell.name}_persistent_fwd".replace(" ", "_"), tuple(items), grid, B,
                          (sizes.get("I", 0), sizes.get("H", 0), sizes.get("P", 0)), dots,
                          dots + _round(B * widest, 4))


def params_of(items) -> list[str]:
    """The buffer arguments of the launch, in the order render declares them (then one weight a fused item)."""
    names = set()
    for it in items:
        names |= set(kernel_params(it.kernel))
        if it.stage is not None:
            names |= {it.stage.gemm.operand.buffer, it.stage.gemm.out.buffer}
    return sorted(names)


def render(plan: TrainingPlan, layout: PersistentPlan) -> str:
    """The CUDA source of one layer's persistent forward (see the module's docstring)."""
    columns, B = plan.columns, layout.batch
    written = set()
    for it in layout.items:
        written |= {p.buffer for _, p in it.kernel.stores}
        if it.stage is not None:
            written.add(it.stage.gemm.out.buffer)
    fused = [it for it in layout.items if it.stage is not None]
    lines = [f"// Generated by engine.autodiff.persistent for cell '{plan.cell.name}' (structure hash "
             f"{plan.cell.structural_hash}): the training step's forward,",
             f"// steps t0 .. t1 - 1 of one layer in one cooperative launch of {layout.grid} blocks, IEEE fp32.",
             "// Do not edit.",
             "#include <cooperative_groups.h>", helper_source(CELL_HELPERS), helper_source(TILE_GEMM_HELPER),
             helper_source(ROWS_GEMM), ""]
    lines.append(f'extern "C" __global__ void __launch_bounds__({THREADS}, 1) {layout.name}(')
    lines += _declare(params_of(layout.items), written)
    lines += [f"    const float* __restrict__ W_{n}," for n in range(len(fused))]
    lines.append("    const int t0, const int t1, const int I, const int H, const int P)")
    lines += ["{", f"    constexpr int B = {B};                              // batch rows",
              "    cooperative_groups::grid_group grid = cooperative_groups::this_grid();",
              "    extern __shared__ __align__(16) float smem[];"]
    if fused:
        lines.append(f"    float* dots = smem + {layout.dots};          // a fused item's B x columns of its GEMM")
    for n, it in enumerate(fused):        # the block's rows of each stage's weight, once
        lines += [f"    {{   // {it.stage.gemm.name}: this block's {it.columns} rows (units x members), resident",
                  f"        const int j0 = blockIdx.x * {it.units}, nu = min({it.units}, {it.dim} - j0);",
                  f"        if (nu > 0) rnn_load_resident(smem + {it.offset}, W_{n} + (long)j0 * {it.members} * "
                  f"{it.k}, {it.k}, {it.k}, nu * {it.members}, {it.rows});",
                  "    }"]
    lines += ["    __syncthreads();", "    for (int t = t0; t < t1; ++t) {                   // the launch's steps"]
    n = 0
    for it in layout.items:
        lines += _item(it, n, columns, B)
        n += it.stage is not None
        lines.append("        grid.sync();               // every block's units of this item (a block barrier too)")
    lines += ["    }", "    (void)I; (void)H; (void)P;", "}"]
    return "\n".join(lines) + "\n"


def _item(it: Item, n: int, columns: dict, B: int) -> list[str]:
    """One item of step t on this block's units. Where the block's elements fit its threads (B x TU <= THREADS) each
    thread issues its element's loads other than the GEMM's before the GEMM, so their latency hides behind it (as the
    fused stages do); the grid barrier after the item is the block's barrier too."""
    kernel, stage = it.kernel, it.stage
    pad = "                "
    lines = [f"        {{   // {kernel.name}" + (f" after GEMM {stage.gemm.name}" if stage else "")
             + " on this block's units",
             f"            const int j0 = blockIdx.x * {it.units}, nu = min({it.units}, {it.dim} - j0);",
             "            if (nu > 0) {"]
    if stage is None:
        lines += [f"{pad}for (int e = threadIdx.x; e < B * nu; e += blockDim.x) {{",
                  f"{pad}    const long b = e / nu;",
                  f"{pad}    const int j = j0 + (int)(e - b * nu);"]
        lines += _body(kernel, columns, pad + "    ")
        return lines + [f"{pad}}}", "            }", "        }"]
    gemm, out = stage.gemm, stage.gemm.out
    M, K, COLS = it.members, it.k, it.columns
    from_dots = _gemm_loads(stage)
    early = [(value, place) for value, place in kernel.loads if value not in from_dots]
    dots = [(value, f"dots[b * {COLS} + (j - j0) * {M} + {from_dots[value]}]") for value, _ in kernel.loads
            if value in from_dots]
    math = [f"const float {var(st.var)} = {statement_expr(st)};" for st in kernel.statements]
    stores = [f"{element(place, columns)} = {var(value)};" for value, place in kernel.stores]
    one_each = B * it.units <= THREADS
    if one_each:                         # an element a thread: its other loads in flight during the GEMM
        lines += [f"{pad}const int e = (int)threadIdx.x < B * nu ? (int)threadIdx.x : 0;",
                  f"{pad}const long b = e / nu;",
                  f"{pad}const int j = j0 + (int)(e - b * nu);"]
        lines += [f"{pad}const float {var(value)} = {element(place, columns)};" for value, place in early]
    x = f"{gemm.operand.buffer} + (long)(t + {gemm.operand.shift}) * B * {K}"
    if B <= GEMV_MAX_ROWS:
        cw = -(-COLS // (THREADS // 32))
        weight = f"W_{n} + (long)j0 * {M} * {K}"
        lines += [f"{pad}const RnnGemvJob<RNN_FP32> jobs[1] = {{{{{x}, {K}, {K}, {weight}, {K}, "
                  f"smem + {it.offset}, nu * {M}, dots, {COLS}, nullptr}}}};",
                  f"{pad}rnn_warp_gemvs<B, {cw}, 4, RNN_FP32, 1, {gemv_ksteps(1, B, K)}, 1u>(jobs);"]
    else:
        lines.append(f"{pad}rnn_rows_gemm<{RW}, {CG}, {K}>({x}, B, smem + {it.offset}, {row_stride(K)}, nu * {M}, "
                     f"dots, {COLS});")
    lines += [f"{pad}__syncthreads();                       // the block's GEMM columns are in dots",
              f"{pad}for (int i = threadIdx.x; i < B * nu * {M}; i += blockDim.x) {{   // ... and, in place, where "
              "the GEMM writes",
              f"{pad}    const int r = i / (nu * {M}), c = i - r * (nu * {M}), u = c / {M}, m = c - u * {M};",
              f"{pad}    float* o = {out.buffer} + ((long)(t + {out.shift}) * B + r) * "
              f"({columns[out.buffer].c_expr()}) + ({out.offset.c_expr()}) + m * {it.dim} + j0 + u;",
              f"{pad}    const float v = {'*o + ' if gemm.accumulate else ''}dots[r * {COLS} + c];",
              f"{pad}    *o = v;"]
    if gemm.accumulate:
        lines += [f"{pad}    dots[r * {COLS} + c] = v;", f"{pad}}}", f"{pad}__syncthreads();"]
    else:
        lines.append(f"{pad}}}")
    if one_each:
        lines.append(f"{pad}if ((int)threadIdx.x < B * nu) {{")
        body = [f"const float {var(value)} = {source};" for value, source in dots] + math + stores
    else:
        lines += [f"{pad}for (int e = threadIdx.x; e < B * nu; e += blockDim.x) {{",
                  f"{pad}    const long b = e / nu;",
                  f"{pad}    const int j = j0 + (int)(e - b * nu);"]
        body = ([f"const float {var(value)} = {element(place, columns)};" for value, place in early]
                + [f"const float {var(value)} = {source};" for value, source in dots] + math + stores)
    lines += [f"{pad}    {line}" for line in body]
    return lines + [f"{pad}}}", "            }", "        }"]


class PersistentForward:
    """A layer's persistent forward on the GPU: the compiled kernel, its interleaved weights, the launch."""

    def __init__(self, runner, plan: TrainingPlan, layout: PersistentPlan):
        from ..schedules.base import compile_kernel
        self.runner, self.plan, self.layout = runner, plan, layout
        self.source = render(plan, layout)
        self.kernel = compile_kernel(self.source, layout.name, True, layout.shared_bytes, plan.cell.name)
        xp = runner.xp
        per_sm = xp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(self.kernel.kernel.ptr, THREADS,
                                                                          layout.shared_bytes)
        if per_sm < 1:
            raise RuntimeError(f"the persistent forward of '{plan.cell.name}' does not fit one block an SM "
                               f"({layout.shared_bytes} bytes of shared memory)")
        self.fused = [it for it in layout.items if it.stage is not None]
        self.params = params_of(layout.items)

    def lay_out(self, layer) -> list:
        """The fused items' weights of the layer, a unit's members side by side (stage_fusion.lay_out), made after
        load() into arrays the layer keeps (layer.persistent_weights)."""
        from .stage_fusion import lay_out
        xp = self.runner.xp
        targets = getattr(layer, "persistent_weights", None)
        if targets is None:
            targets = layer.persistent_weights = [
                layer.stacked[it.stage.gemm.stack] if it.members == 1 else
                xp.empty_like(layer.stacked[it.stage.gemm.stack]) for it in self.fused]
        for it, target in zip(self.fused, targets):
            if it.members > 1:
                target[...] = lay_out(xp, layer.stacked[it.stage.gemm.stack], "interleaved", it.members)
        return targets

    def launch(self, layer, steps: range) -> None:
        """The layer's `steps`, one launch (their hoisted GEMMs issued before, on the same stream), reading the
        weights lay_out made in Program.load."""
        weights = layer.persistent_weights
        I, H, P = self.layout.sizes
        args = tuple(layer.buffers[p] for p in self.params) + tuple(weights)
        self.kernel((self.layout.grid,), (THREADS,), args + (np.int32(steps.start), np.int32(steps.stop), np.int32(I),
                                                              np.int32(H), np.int32(P)),
                    shared_mem=self.layout.shared_bytes)



def persistent_forward(runner, sizes: dict, B: int, blocks: int):
    """The PersistentForward of a layer of these sizes at B rows on at most `blocks` blocks (cached by the runner), or
    None with PERSISTENT off or where the layer does not qualify (refusal says why)."""
    if not PERSISTENT or not hasattr(runner, "sms"):
        return None
    stages = {key: s for key, s in runner.stages.items() if s.forward and s.lag == 0}
    if refusal(runner.plan, stages, sizes, B, blocks) is not None:
        return None
    cache = runner.__dict__.setdefault("persistent_forwards", {})      # the runner's: one plan, one device
    key = (tuple(sorted(sizes.items())), B, blocks)
    forward = cache.get(key)
    if forward is None:
        forward = cache[key] = PersistentForward(runner, runner.plan, make_plan(runner.plan, stages, sizes, B,
                                                                                blocks))
    return forward
