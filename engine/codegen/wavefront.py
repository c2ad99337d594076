"""CUDA for the wavefront schedules: every layer of a wavefront step in one launch, GEMM and cell math fused.

A block owns one layer and a tile of its hidden units (engine/schedules/tiling.py). For one stage of
one time step it computes its columns of that stage's GEMMs with the hand-written tile GEMM
(kernels/tile_gemm.cuh) and then, on the same units, the stage's elementwise statements: the very
lines of the fused backend's kernel (engine.codegen.cuda.kernel_body), so both schedules compute
the same function op by op. With several layers, every layer computes its input projection for step
t here too, from x or from row block t of the layer below (written by the previous wavefront step);
a one-layer network projects the whole sequence with one cuBLAS GEMM before the launch. The GEMM is
rnn_warp_gemvs for batches of at most 4 rows, rnn_tile_gemm otherwise (kernels/tile_gemm.cuh).

Two entry points per program:
- `<cell>_wave_s<stage>(layers, T, k)`: one stage of wavefront step k, for the graph schedule,
  which captures (T + L - 1) x stages launches into a CUDA graph once and replays it;
- `<cell>_persistent(layers, T)`: the whole sequence in one cooperative launch, a grid-wide
  barrier after every stage, the block's weight slices loaded into shared memory once.

Sizes (B, H, the input size of layer 0, L) and the tiling are compile-time constants: the source is
specific to one network and batch, and the code specializes on them (no runtime switches).
"""
from __future__ import annotations

import re

from ..c_names import kernel_prefix
from ..errors import CompileError
from ..network import Network
from ..plan import Gemm, Kernel, Program
from . import cluster as cluster_source
from .carried import carried
from .carried import places as carried_places
from .cuda import c_factor, helper_source, index_expr, kernel_body, stored
from .equations import text_equations
from .layer_args import HALF_SUFFIX, half_copies, param_fields, struct_lines
from .precision import precision as lookup_precision
from .reductions import (
    STAGING_SKIP,
    direct_partials,
    partial_stage,
    reduction_partials,
    reduction_sums,
    stage_shared,
    staged_floats,
)
from .shared_outputs import places as output_places
from .shared_outputs import staging_floats
from .stream_source import stream_ahead, stream_drain

TILE_GEMM_HELPER = "tile_gemm.cuh"
MMA_GEMM_HELPER = "mma_gemm.cuh"
STREAM_HELPERS = ("wgmma.cuh", "wgmma_ss.cuh", "wgmma_stream.cuh")
LAYER_SYNC_HELPER = "layer_sync.cuh"
POOL_HELPER = "pool.cuh"
MODE_NAMES = {0: "RNN_FP32", 1: "RNN_TF32", 2: "RNN_FP16", 3: "RNN_BF16", 4: "RNN_TF32X3"}   # kernels/tile_gemm.cuh
LENGTHS_NOTE = ("// lengths= (L.lengths): at a step t >= lengths[b] row b's stores hold its states and write 0 as its "
                "output (engine/passes/lengths.py).")


def _pointer(program: Program, param, suffix: str = "") -> str:
    """The C expression a kernel argument (or, with suffix HALF_SUFFIX, its 16-bit copy) becomes inside a
    wavefront stage."""
    if param.kind == "param":
        return f"L.{param_fields(program)[param.source]}"
    if program.buffer(param.source).double:
        return f"L.{param.source}{suffix}[{_version(param)}]"
    return f"L.{param.source}{suffix}"


def _version(param) -> str:
    """The version of a double buffer a kernel argument is, as a C expression of t ("0" for a single buffer)."""
    return "0" if param.version is None else "(t + 1) & 1" if param.version == "next" else "t & 1"


def _head_columns(heads: int, head_k: str) -> str:
    """The first column of this block's head (its units lie in one: heads.gemm_heads), head_k columns a head."""
    return f"(long)(u0 / (H / {heads})) * {head_k}"


def _gemm_operands(program: Program, gemm: Gemm, tile, tiling, halves=()) -> dict[str, str]:
    """The C expressions of one GEMM's operands for this block (its nt x tu columns); X is the 16-bit copy
    when the buffer has one (half_copies), and in cluster mode the block's own copy of it in shared memory; Y is in
    shared memory where the tiling keeps it there (shared_outputs.py). A weight streamed by the bulk pipeline is chunked per block (engine/schedules/base.py
    chunked_weight): NC_STREAMED rows a block."""
    nt = len(gemm.terms)
    bulk, cluster = tiling.bulk, (tiling if tiling.cluster else None)
    wt = lookup_precision(program.precision).weight_type
    resident = f"smem + {tile.smem_offset}" if wt == "float" else f"reinterpret_cast<const {wt}*>(smem + {tile.smem_offset})"
    rows = "(u0 / UNITS) * NC_STREAMED" if bulk and not tile.resident else f"u0 * {nt}"
    out = {"K": f"K_{gemm.name}", "N": f"N_{gemm.name}", "NC": f"{nt} * tu", "NCT": f"{nt} * UNITS",
           "W": f"L.W_{gemm.name} + (long){rows} * K_{gemm.name}", "ld": f"K_{gemm.name}",
           "Ws": resident if tile.resident else "nullptr"}
    head = ""                            # a GEMM of heads (heads.gemm_heads): this block's head's K / k columns
    if tile.heads > 1:
        out["K"] = f"(K_{gemm.name} / {tile.heads})"
        head = _head_columns(tile.heads, out["K"])
        out["W"] += f" + {head}"
        if bulk:                         # the chunked 16-bit copy: a head's columns are whole chunks of B rows
            head += " * B"
    half = HALF_SUFFIX if (program.input_buffer if gemm.hoisted else gemm.in_buffer) in halves else ""
    if gemm.hoisted:
        out["X"] = f"L.{program.input_buffer}{half} + (long)t * B * K_{gemm.name}"
        out["Y"] = f"L.{gemm.out_buffer} + (long)t * B * N_{gemm.name} + (long)u0 * {nt}"
        out["bias"] = f"L.bias_{gemm.name} ? L.bias_{gemm.name} + (long)u0 * {nt} : nullptr"
        out["what"] = f"input projection of step t ({program.cell.input.name}, or row block t of the layer below)"
    else:
        out["X"] = (cluster_source.pointer(cluster, gemm.in_buffer, "t & 1") if cluster else   # the block's own copy
                    f"L.{gemm.in_buffer}{half}" + ("[t & 1]" if program.buffer(gemm.in_buffer).double else "")
                    + (f" + {head}" if head else ""))
        out["Y"] = f"L.{gemm.out_buffer} + (long)u0 * {nt}"
        if cluster:                      # the block's tile in shared memory, where its cell code reads it
            out["Y"], out["N"] = cluster_source.gemm_output(cluster, gemm)
        out["bias"] = "nullptr"
        out["what"] = ", ".join(t.name for t in gemm.terms)
    for name, offset, _ in tiling.y_shared:
        if name == gemm.name:
            out["Y"] = f"smem + {offset}"
    return out


GEMV_X_FLOATS = 64             # X registers a lane of rnn_warp_gemvs fills per pass (all its loads in flight at once)


def gemv_ksteps(jobs: int, batch: int, k_max: int) -> int:
    """128-column steps of K a lane of rnn_warp_gemvs loads per pass: all of K when jobs x batch x 4 floats a step
    fit GEMV_X_FLOATS registers (one L2 round trip a stage), else as many steps as fit."""
    return max(1, min(-(-k_max // 128), GEMV_X_FLOATS // (4 * jobs * batch)))


def _prefetch_projections(program: Program, indent: str) -> list[str]:
    """Layer by layer the input projections are one cuBLAS GEMM over the whole sequence before the launch, so the
    rows of step t are in DRAM when the cell math reads them after the GEMMs: ask L2 for them first (a hint, no
    effect on the results), one thread a batch row, so the GEMMs hide the DRAM latency."""
    lines = [f"{indent}// This step's rows of the projections made before the launch (cuBLAS, in DRAM), into L2 while the "
             "GEMMs run"]
    lines.append(f"{indent}for (int r = threadIdx.x; r < B; r += blockDim.x) {{")
    for g in program.hoisted_gemms:
        nt = len(g.terms)
        lines.append(f"{indent}    rnn_prefetch_l2(L.{g.out_buffer} + ((long)t * B + r) * ({g.n.c_expr()}) + (long)u0 * {nt}, "
                     f"{nt} * tu);")
    lines.append(f"{indent}}}")
    return lines


def _gemm_calls(program: Program, gemms: list[Gemm], tiling, indent: str) -> list[str]:
    """Every GEMM of one stage for this block, then a barrier: their outputs are complete for the block."""
    tiles = {t.name: t for t in tiling.gemms}
    halves = half_copies(program, tiling)
    ops = [_gemm_operands(program, g, tiles[g.name], tiling, halves) for g in gemms]
    lines = [f"{indent}{{   // the stage's GEMMs, this block's columns: "
             + "; ".join(f"{g.name} ({o['what']})" for g, o in zip(gemms, ops))]
    kept = {name: ld for name, _, ld in tiling.y_shared}   # Y in shared memory: N is its row stride there
    for g in gemms:                      # (cluster mode: Y is a tile of its own width in shared memory)
        lines.append(f"{indent}    const int K_{g.name} = {g.k.c_expr()}" +
                     (";" if tiling.cluster and not g.hoisted else f", N_{g.name} = {kept.get(g.name, g.n.c_expr())};"))
    prec = lookup_precision(program.precision)
    if tiling.path == "gemv":
        warps = tiling.config.threads // 32
        cw = max(-(-len(g.terms) * tiling.units_per_block // warps) for g in gemms)
        vec = min(tiles[g.name].vec for g in gemms)
        ksteps = gemv_ksteps(len(gemms), tiling.batch, max(tiles[g.name].k_max for g in gemms))
        lines.append(f"{indent}    const RnnGemvJob<{MODE_NAMES[prec.mode]}> jobs[{len(gemms)}] = {{")
        for o in ops:
            lines.append(f"{indent}        {{{o['X']}, {o['ld']}, {o['K']}, {o['W']}, {o['ld']}, {o['Ws']}, {o['NC']},")
            lines.append(f"{indent}         {o['Y']}, {o['N']}, {o['bias']}}},")
        lines.append(f"{indent}    }};")
        resident = sum(1 << i for i, g in enumerate(gemms) if tiles[g.name].resident)
        lines.append(f"{indent}    rnn_warp_gemvs<B, {cw}, {vec}, {MODE_NAMES[prec.mode]}, {len(gemms)}, {ksteps}, "
                     f"{resident}u>(jobs);")
        lines.append(f"{indent}    __syncthreads();")
    else:
        vec = min(tiles[g.name].vec for g in gemms)
        job = f"RnnMmaJob<{MODE_NAMES[prec.mode]}>" if tiling.mma else "RnnGemm"
        lines.append(f"{indent}    const {job} jobs[{len(gemms)}] = {{")
        for o in ops:
            lines.append(f"{indent}        {{{o['X']}, {o['W']}, {o['Ws']},")
            tail = "" if tiling.mma else f", {o['NCT']}"          # the tile GEMM's tiles: every block's full width
            lines.append(f"{indent}         {o['Y']}, {o['N']}, {o['bias']}, {o['K']}, {o['NC']}{tail}}},")
        lines.append(f"{indent}    }};")
        if tiling.wgmma[0]:
            first = cluster_source.first_tiles(program, tiling)[gemms[0].name]
            lines += cluster_source.gather(tiling, [g.in_buffer for g in gemms], indent + "    ")
            lines.append(f"{indent}    rnn_wgmma_gemms_rs<{MODE_NAMES[prec.mode]}, NB, KSP, PARTS, TILES>(jobs, wreg, {first}, B, "
                         "smem + SCRATCH + X_LOCAL);")
        elif tiling.cluster:
            lines.append(f"{indent}    rnn_mma_gemms_local<{MODE_NAMES[prec.mode]}, WM, WN>(jobs, B, smem + SCRATCH + X_LOCAL);")
        elif tiling.stream_n:
            lines.append(f"{indent}    rnn_stream_gemms<{MODE_NAMES[prec.mode]}, STREAM_N, STAGES, STREAM_AHEAD>(jobs, B, "
                         "smem + SCRATCH, NC_STREAMED, W_KEEP);")
        elif tiling.mma:
            lines.append(f"{indent}    rnn_mma_gemms<{MODE_NAMES[prec.mode]}, WM, WN, {vec}, STAGES, K_CHUNK, BULK, "
                         "PRODUCER_WARPS>(jobs, B, smem + SCRATCH, NC_STREAMED, W_KEEP);")
        else:
            lines.append(f"{indent}    rnn_tile_gemms<RB, RC, {vec}, STAGES, K_CHUNK>(jobs, B, smem + SCRATCH, NC_STREAMED);")
    return lines + [f"{indent}}}"]


def _half_index(access, bulk: bool) -> str:
    """Where element (b, j) of a store goes in the 16-bit copy: the fp32 index, or the bulk pipeline's chunked
    index (kernels/mma_gemm.cuh rnn_chunked: row block t of a sequence buffer, 0 of a (B, K) one)."""
    if not bulk:
        return index_expr(access)
    offset = access.offset.c_expr()
    col = "j" if access.stride == 1 else f"{access.stride} * j"
    col = col if offset == "0" else f"{offset} + {col}"
    block = "t" if access.rows == "sequence" else "0"
    return f"rnn_chunked<K_CHUNK>({block}, (int)b, {col}, B, {access.ld.c_expr()})"


def _pooled_store(kernel: Kernel, program: Program, precision, body: list[str], indent: str) -> list[str]:
    """The kernel body with its store of the layer output replaced by the fused pool (kernels/pool.cuh) in a layer
    that a pool follows (L.pool_out not null), and kept in the others."""
    out = []
    for store in kernel.stores:
        param = next(p for p in kernel.params if p.name == store.access.param)
        if param.kind != "buffer" or param.source != program.output_buffer:
            continue
        target = f"{store.access.param}[{index_expr(store.access)}] = {precision.store(store.var)};"
        pooled = f"L.pool_out + {index_expr(store.access, row='b')}"
        out = [line for line in body if line.strip() != target]
        if len(out) != len(body) - 1:
            raise CompileError(f"cell '{program.cell.name}': the store of the layer output {program.output_buffer!r} "
                               f"was not found in kernel {kernel.name}; hint: this is a bug in engine.codegen.wavefront, "
                               "run the net without fuse_pools meanwhile")
        out += [f"{indent}if (L.pool_out)   // a pool follows this layer: {program.cell.output}[t] folded into it, the "
                "sequence never stored",
                f"{indent}    rnn_pool_step({pooled}, (long)B * {c_factor(store.access.ld)}, {precision.store(store.var)}, t,",
                f"{indent}                  (int)L.pool_steps, (int)L.pool_op, (int)L.pool_window, (int)L.pool_stride);",
                f"{indent}else",
                f"{indent}    {target}"]
        return out
    return body


def _elementwise(kernel: Kernel, program: Program, precision, indent: str, halves=(), bulk: bool = False,
                 pooled: bool = False, cluster=None, around=None, places=None) -> list[str]:
    """The kernel's statements on this block's units; a store of a buffer a GEMM reads also writes its 16-bit copy
    (in cluster mode, cluster: the tiling, into this block's copy). around: (the stage's GEMM lines, their output
    buffers), cluster mode with one element a thread: the loads that need no GEMM output go before the GEMMs
    (engine/codegen/cluster.py preloaded). places: kernel_body's, the params kept in shared memory
    (engine/codegen/reductions.py StageShared)."""
    lines = [f"{indent}{{   // {kernel.name}: the fused backend's kernel body, on this block's units"]
    copied = {p.name for p in kernel.params if p.writes and p.kind == "buffer" and p.source in halves}
    kernel, tiles = cluster_source.reads_tiles(kernel, program, cluster) if cluster else (kernel, {})
    body = kernel_body(kernel, precision, indent + "        ", lengths="L.lengths", places=places)
    for p in kernel.params:
        if places and p.name in places and not any(re.search(rf"\b{p.name}\[", line) for line in body):
            continue                           # every element in shared memory: no pointer to declare
        qualifier = "" if p.writes else "const "
        lines.append(f"{indent}    {qualifier}float* __restrict__ {p.name} = {tiles.get(p.name) or _pointer(program, p)};")
        if p.name in copied and not cluster:
            lines.append(f"{indent}    unsigned short* __restrict__ {p.name}{HALF_SUFFIX} = "
                         f"{_pointer(program, p, HALF_SUFFIX)};   // its 16-bit copy, read by a GEMM")
    mode = MODE_NAMES[lookup_precision(program.precision).mode]
    versions = dict(_copied_versions(kernel, halves))
    copies = []
    for store in kernel.stores:
        if store.access.param in copied and cluster:
            param = next(p for p in kernel.params if p.name == store.access.param)
            copies.append(cluster_source.store(cluster, param.source, versions[param.name], store.access,
                                               f"rnn_bits16<{mode}>({stored(store)})"))
        elif store.access.param in copied:
            copies.append(f"{store.access.param}{HALF_SUFFIX}[{_half_index(store.access, bulk)}] = "
                          f"rnn_bits16<{mode}>({stored(store)});")
    if around is not None:
        return lines + cluster_source.preloaded(kernel, precision, indent, around, copies, cluster)
    lines.append(f"{indent}    for (int e = threadIdx.x; e < B * tu; e += blockDim.x) {{")
    lines.append(f"{indent}        const long b = e / tu;")
    lines.append(f"{indent}        const int j = u0 + (int)(e - b * tu);")
    lines += _pooled_store(kernel, program, precision, body, indent + "        ") if pooled else body
    lines += [f"{indent}        {line}" for line in copies]
    lines.append(f"{indent}    }}")
    lines.append(f"{indent}}}")
    return lines


def _copied_versions(kernel: Kernel, halves) -> list[tuple[str, str]]:
    """(param, version) of each buffer the kernel writes that a GEMM reads in 16 bits: the version a C expression
    of t ("t & 1", "(t + 1) & 1" for a double buffer's next; "0" for a single buffer)."""
    return [(p.name, _version(p)) for p in kernel.params if p.writes and p.kind == "buffer" and p.source in halves]


def stages(program: Program) -> tuple[int, ...]:
    """The stages that have work: each ends with a barrier between all blocks."""
    present = {k.stage for k in program.kernels} | {g.stage for g in program.gemms if not g.hoisted}
    return tuple(sorted(present))


POOL_OPS = {"max": 0, "mean": 1}          # RNN_POOL_MAX, RNN_POOL_MEAN of kernels/pool.cuh


def check_pool_fusable(program: Program, pool) -> None:
    """A pool over time can be folded into the store of the layer output when that output is written once a step
    and read by nothing in the layer (it is only the next layer's input). CompileError otherwise."""
    if pool.op not in POOL_OPS:
        raise CompileError(f"pool op {pool.op!r} is not one of {', '.join(POOL_OPS)}")
    out = program.output_buffer
    writes = [(k.name, st) for k in program.kernels for st in k.stores
              if next(p for p in k.params if p.name == st.access.param).source == out]
    readers = [k.name for k in program.kernels for p in k.params if p.source == out and not p.writes]
    readers += [g.name for g in program.gemms if not g.hoisted and g.in_buffer == out]
    if len(writes) != 1 or readers:
        why = (f"it is written {len(writes)} times a step" if len(writes) != 1 else
               f"{readers[0]} reads it within the layer")
        raise CompileError(f"cell '{program.cell.name}': the pool cannot be fused into the store of the layer output "
                           f"{out!r}: {why}; hint: run the net without fuse_pools (the pool then runs as its own pass)")


def render_wavefront(program: Program, network: Network, tiling, doc: str = "", pools=None) -> str:
    """The CUDA module for one program, network, batch and tiling: the persistent kernel when
    tiling.persistent, else the graph schedule's per-stage kernels. pools ({layer: engine.nets.data.Pool}): a pool over
    time after those layers, each folded into its layer's store of its output (kernels/pool.cuh), the layers above
    reading the pooled sequence; every layer then runs on its own step timing from its argument row
    (engine/schedules/steps.py: one wavefront through the pools)."""
    for pool in (pools or {}).values():
        check_pool_fusable(program, pool)
    pooled = bool(pools)
    if pooled and program.lengths:
        raise CompileError(f"cell '{program.cell.name}': the wavefront schedules run lengths= without pools between "
                           "or after the layers; hint: run the pools' net without lengths, or on backend='reference'")
    prec = lookup_precision(program.precision)
    prefix = program.kernels[0].name.rsplit("_stage", 1)[0] if program.kernels else kernel_prefix(program.cell.name)
    present = stages(program)
    halves = half_copies(program, tiling)
    partial_from = {g.name: partial_stage(program, g, present) for g in program.gemms if g.name in program.reductions}
    lines = [f"// Generated by engine.codegen.wavefront for cell '{program.source_cell.name}' "
             f"(structure hash {program.source_cell.structural_hash}).",
             "// Do not edit: regenerate from the cell instead.", "//", "// Equations (from the graph):"]
    lines += [f"//   {eq}" for eq in text_equations(program.cell)]
    if doc.strip():
        lines += ["//", "// From the cell's documentation:"] + [f"//   {ln}".rstrip() for ln in doc.strip().splitlines()]
    lines += ["//", f"// Tiling: {tiling.describe()}.", "//", "// One stage of one time step of one layer, per block:"]
    if program.lengths:
        lines[-1:-1] = [LENGTHS_NOTE, "//"]
    for s in present:
        gemms = [g.name for g in program.step_gemms(s)] if s else []
        kernels = [k.name for k in program.stage_kernels(s)]
        lines.append(f"//   stage {s}: " + " then ".join(x for x in (", ".join(gemms), ", ".join(kernels)) if x)
                     + "; then every block waits for every other")
    hoisted = [g.name for g in program.hoisted_gemms]
    if hoisted:
        lines.append(f"//   before the first stage, every layer: {', '.join(hoisted)} for step t"
                     if tiling.layer0_in_kernel else
                     f"//   before the launch: {', '.join(hoisted)} as one cuBLAS GEMM over the whole sequence")
    lines += [""] + (["#include <cooperative_groups.h>", ""] if tiling.persistent else [])
    lines += [helper_source("cell_ops.cuh"), helper_source(TILE_GEMM_HELPER)]
    if tiling.persistent and tiling.config.sync in ("layer", "head"):
        lines.append(helper_source(LAYER_SYNC_HELPER))
    if tiling.mma:
        lines.append(helper_source(MMA_GEMM_HELPER))
    if tiling.stream_n:                  # the step GEMMs on wgmma, fed by two warps (engine/schedules/stream.py)
        lines += [helper_source(name) for name in STREAM_HELPERS]
    if tiling.cluster:
        if pooled:
            raise CompileError(f"cell '{program.cell.name}': TileConfig.sync='cluster' runs without pools between or "
                               "after its layers; hint: sync='grid'")
        lines.append(helper_source(cluster_source.CLUSTER_HELPER))
        if tiling.wgmma[0]:
            lines += [helper_source(name) for name in cluster_source.WGMMA_HELPERS]
    if pooled:
        lines.append(helper_source(POOL_HELPER))
    lines += [f"constexpr int B = {tiling.batch};                 // batch rows",
              f"constexpr int H = {tiling.hidden};                 // hidden size",
              f"constexpr int UNITS = {tiling.units_per_block};              // hidden units per block",
              f"constexpr int BLOCKS_PER_LAYER = {tiling.blocks_per_layer};                 // x {tiling.num_layers} layers",
              f"constexpr int THREADS = {tiling.config.threads};"]
    if tiling.cluster:                    # no staging pipeline: X is in shared memory already (cluster.py)
        lines += ([] if tiling.wgmma[0] else
                  [f"constexpr int WM = {tiling.warp_tile[0]}, WN = {tiling.warp_tile[1]};"
                   f"          // MMA tiles (16 rows x 8 columns) of a warp, {prec.describe()}"])
        lines += [f"constexpr int SCRATCH = {tiling.scratch_offset};   // floats of resident weights before the local X"]
        lines += cluster_source.constants(tiling)
    elif tiling.path == "tiled" and tiling.gemms:
        keep = f"constexpr float W_KEEP = {tiling.l2_keep}f;      // share of streamed weights kept in L2 (BULK)"
        ahead = "true" if stream_ahead(program, tiling, stages(program)) else "false"
        lines += ([keep, f"constexpr int STREAM_N = {tiling.stream_n};   // the step GEMMs' wgmma N (wgmma_stream.cuh)",
                   f"constexpr bool STREAM_AHEAD = {ahead};   // the next step's weight chunks staged as a step ends"]
                  if tiling.stream_n else
                  [f"constexpr int WM = {tiling.warp_tile[0]}, WN = {tiling.warp_tile[1]};"
                   f"          // MMA tiles (16 rows x 8 columns) of a warp, {prec.describe()}",
                   f"constexpr bool BULK = {'true' if tiling.bulk else 'false'};      // chunks staged by bulk copies "
                   "of chunked operands (mma_gemm.cuh)", keep,
                   f"constexpr int PRODUCER_WARPS = {tiling.producer_warps};   // BULK: warps that only feed the ring "
                   "(the block's last)"]
                  if tiling.mma else
                  [f"constexpr int RB = {tiling.config.rows_per_thread}, RC = {tiling.config.cols_per_thread};"
                   "          // accumulator tile of a thread"]) + [
                  f"constexpr int K_CHUNK = {tiling.k_chunk}, STAGES = {tiling.stages};"
                  "   // K columns staged in shared memory at a time, chunks in flight + 1",
                  f"constexpr int NC_STREAMED = {tiling.nc_streamed};       // rows of W staged per chunk (0: all resident)",
                  f"constexpr int SCRATCH = {tiling.scratch_offset};   // floats of resident weights before the staging area"]
    lines.append("")
    lines += struct_lines(program, tiling, pooled) + [""]

    carry = carried(program, tiling)           # values kept in registers between stages and steps (carried.py)
    for s in present:
        lines.append(f"// Stage {s} of step t for this block's units [u0, u0 + tu) of layer `layer`.")
        lines.append(f"__device__ __forceinline__ void {prefix}_stage_{s}(const LayerArgs& L, const int layer, "
                     f"const int t, const int u0, const int tu, float* smem{cluster_source.stage_params(tiling)[0]}"
                     + (", float* carry)" if carry else ")"))
        lines.append("{")
        lines.append("    const int I = (int)L.I;")
        gemms = list(program.hoisted_gemms) if s == present[0] and tiling.num_layers > 1 else []
        gemms += list(program.step_gemms(s)) if s else []
        reductions = [g for g in gemms if g.name in program.reductions]
        gemms = [g for g in gemms if g.name not in program.reductions]
        if s == present[0] and tiling.num_layers == 1 and program.hoisted_gemms and not tiling.cluster:
            lines += _prefetch_projections(program, "    ")
        kernels = program.stage_kernels(s)
        # cluster mode, one element a thread: the cell code's loads that need no GEMM output go before the GEMMs
        preload = (tiling.cluster and gemms and not reductions and len(kernels) == 1
                   and tiling.batch * tiling.units_per_block <= tiling.config.threads)
        if gemms and not preload:
            lines += _gemm_calls(program, gemms, tiling, "    ")
        produced = [g for g in program.gemms if g.name in program.reductions and partial_from[g.name] == s]
        free = staging_floats(tiling) - tiling.scratch_offset - STAGING_SKIP
        shared = (stage_shared(program, s, reductions, produced, tiling.units_per_block, tiling.batch, free,
                               frozenset(carry))
                  if tiling.path == "tiled" and tiling.gemms and not tiling.cluster else None)
        if reductions:
            lines += reduction_sums(program, reductions, {g.name: partial_from[g.name] is not None for g in reductions},
                                    "    ", shared)
            lines.append("    __syncthreads();   // the reductions' sums are stored for the cell math")
        written = []                           # cluster mode: (buffer, version) whose slice goes to the cluster
        for k in kernels:
            sources = {p.name: p.source for p in k.params}
            written += [(sources[name], version) for name, version in _copied_versions(k, halves)]
            around = ((_gemm_calls(program, gemms, tiling, "    "), {g.out_buffer for g in gemms},
                       cluster_source.share(tiling, written, "    ")) if preload else None)
            places = {**(shared.places(k) if shared else {}), **output_places(k, program, tiling)}
            places.update(carried_places(k, program, carry, places))
            lines += _elementwise(k, program, prec, "    ", halves, tiling.bulk, pooled,
                                  tiling if tiling.cluster else None, around, places or None)
        if tiling.cluster and not preload:     # (the preloaded kernel shares and arrives itself, before its stores)
            lines += cluster_source.share(tiling, written, "    ") + cluster_source.arrive(tiling, "    ")
        end = shared.end if shared else 0
        direct = [(g, shared.vals[g.name][1]) for g in produced if shared and g.name in shared.vals]
        if direct:                             # one loop for all whose values the cell code left in shared memory
            lines += direct_partials(program, direct, "    ")
        for g in produced:
            if not (shared and g.name in shared.vals):
                staging = (tiling.path == "tiled"
                           and end + staged_floats(g, tiling.units_per_block, tiling.batch) <= free)
                lines += reduction_partials(program, g, "    ", staging, offset=end)
        lines.append("    (void)I;")
        lines.append("}")
        lines.append("")

    block_setup = ["    __builtin_assume(blockDim.x == THREADS);      // launched so: tile counts and K steps fold to constants",
                   "    extern __shared__ float smem[];",
                   "    const int layer = blockIdx.x / BLOCKS_PER_LAYER;",
                   "    const int u0 = (blockIdx.x % BLOCKS_PER_LAYER) * UNITS;",
                   "    const int tu = min(UNITS, H - u0);             // units of this block (the last may have fewer)",
                   "    const LayerArgs& L = layers[layer];"]
    if tiling.stream_n:
        block_setup.append("    rnn_stream_init<STAGES>(smem + SCRATCH);   // the wgmma routine's barriers, once a launch")
    elif tiling.bulk:
        block_setup.append("    rnn_bulk_init<STAGES, PRODUCER_WARPS>(smem + SCRATCH);   // the bulk pipeline's "
                           "barriers, once a launch")
    if tiling.cluster:
        block_setup = block_setup[:-1] + cluster_source.ARGS
    if tiling.persistent:
        return "\n".join(lines + _persistent_entry(program, tiling, prefix, present, block_setup, pooled,
                                                    carry)) + "\n"
    for s in present:
        timing = ("each layer on its own step timing, T wavefront steps" if pooled else
                  "layer l runs step k - l, T + L - 1 wavefront steps")
        lines.append(f"// Graph schedule: stage {s} of wavefront step k ({timing}); every stage of every step "
                     "launched once from one CUDA graph.")
        lines.append(f'extern "C" __global__ void __launch_bounds__(THREADS) {prefix}_wave_s{s}('
                     "const LayerArgs* __restrict__ layers, const int T, const int k)")
        lines.append("{")
        lines += block_setup
        if pooled:                             # T: wavefront steps; each layer on its own timing
            lines += _stepped("    ", "k")
            lines.append(f"    if (busy) {prefix}_stage_{s}(L, layer, t, u0, tu, smem);")
        else:
            lines.append("    const int t = k - layer;")
            lines.append(f"    if (tu > 0 && t >= 0 && t < T) {prefix}_stage_{s}(L, layer, t, u0, tu, smem);")
        lines.append("}")
        lines.append("")
    return "\n".join(lines) + "\n"


def _stepped(indent: str, k: str) -> list[str]:
    """Whether this block's layer runs a step at wavefront step k, and which (engine/schedules/steps.py)."""
    return [f"{indent}const int tk = {k} - (int)L.offset;           // its steps come every L.scale wavefront steps",
            f"{indent}const int t = tk >= 0 ? tk / (int)L.scale : -1;",
            f"{indent}const bool busy = tu > 0 && tk >= 0 && tk == t * (int)L.scale && t < (int)L.steps;"]


def _persistent_entry(program: Program, tiling, prefix: str, present, block_setup: list[str],
                      pooled: bool = False, carry: dict | None = None) -> list[str]:
    by_layer = tiling.config.sync in ("layer", "head")
    heads = tiling.sync_heads
    lines = ["// Persistent schedule: the whole sequence in one " + ("launch of clusters." if tiling.cluster else
                                                                   "cooperative launch, one block per SM.")]
    if by_layer and heads > 1:
        lines.append("// Heads synchronised by arrival counters (kernels/layer_sync.cuh): arrivals[l * HEADS + hd] "
                     "counts the finished stages of the blocks of layer l's head hd. Every GEMM of a step reads its "
                     "block's head only (heads.head_sync), so a block waits for its own head's blocks.")
    elif by_layer:
        lines.append("// Layers synchronised by arrival counters (kernels/layer_sync.cuh): arrivals[l] counts the "
                     "finished stages of layer l's blocks.")
    if tiling.cluster:
        meet = ("send their units of h into each other's with st.async onto transaction barriers, no cluster "
                "barrier a step" if cluster_source.exchange(tiling) == "push" else
                "meet at a cluster barrier after every stage")
        lines.append("// Cluster mode (engine/schedules/cluster.py): the blocks of a cluster exchange h through their shared "
                     f"memory and {meet}; clusters never wait for each other.")
        lines.append(cluster_source.signature(prefix))
    elif by_layer:
        lines.append(f'extern "C" __global__ void __launch_bounds__(THREADS, 1) {prefix}_persistent('
                     "const LayerArgs* __restrict__ layers, const int T, unsigned* __restrict__ arrivals)")
    else:
        lines.append(f'extern "C" __global__ void __launch_bounds__(THREADS, 1) {prefix}_persistent('
                     "const LayerArgs* __restrict__ layers, const int T)")
    lines.append("{")
    if not by_layer and not tiling.cluster:
        lines.append("    cooperative_groups::grid_group grid = cooperative_groups::this_grid();")
    lines += block_setup
    lines.append("    const int I = (int)L.I;")
    for g in tiling.gemms:
        if not g.resident:
            continue
        gemm = next(x for x in program.gemms if x.name == g.name)
        nt = len(gemm.terms)
        lines.append(f"    if (tu > 0) {{   // {g.name}: this block's rows of the weight, kept in shared memory")
        lines.append(f"        const int K = {gemm.k.c_expr()};")
        prec = lookup_precision(program.precision)
        ncp = 8 if tiling.mma else tiling.config.cols_per_thread
        if prec.mode == 0:
            target, load = f"smem + {g.smem_offset}", "rnn_load_resident"
        else:
            target = f"reinterpret_cast<{prec.weight_type}*>(smem + {g.smem_offset})"
            load = f"rnn_load_resident<{MODE_NAMES[prec.mode]}>"
        rows = f"{nt} * tu" if tiling.mma else f"{nt} * UNITS"  # tile GEMM: zeros up to the full width it covers
        k = f"K / {g.heads}" if g.heads > 1 else "K"      # only the block's head's columns (heads.gemm_heads)
        source = f"L.W_{g.name} + (long)u0 * {nt} * K" + (f" + {_head_columns(g.heads, f'({k})')}" if g.heads > 1
                                                           else "")
        lines.append(f"        {load}({target}, {source}, K, {k}, {nt} * tu, rnn_round_up({rows}, {ncp}));")
        lines.append("    }")
    lines.append("    (void)I;")
    carry_arg = ", carry" if carry else ""
    if carry:
        lines.append(f"    float carry[{len(carry)}];   // " + ", ".join(carry) + ": this thread's element, from the stage "
                     "that stores it to the later stages or steps that load it (carried.py)")
    lines.append("    __syncthreads();")
    if tiling.cluster:
        columns = {g.in_buffer: g.k.c_expr() for g in program.gemms if g.name in {t.name for t in tiling.gemms}}
        return lines + cluster_source.loop(program, tiling, prefix, present, columns)
    if by_layer:
        stages_per_step = len(present)
        lines.append(f"    constexpr unsigned S = {stages_per_step};                 // stages a step")
        lines.append(f"    constexpr int HEADS = {heads}, BLOCKS_PER_HEAD = BLOCKS_PER_LAYER / HEADS;   // counters a layer")
        lines.append("    unsigned* const own = arrivals + layer * HEADS + (blockIdx.x % BLOCKS_PER_LAYER) / BLOCKS_PER_HEAD;")
        group = "head" if heads > 1 else "layer"
        steps = "(int)L.steps" if pooled else "T"
        lines.append(f"    for (int t = 0; t < {steps}; ++t) {{   // this block's layer, step by step")
        below = ("((unsigned)(t * (int)L.below_scale + (int)L.below_offset) + 1u) * S" if pooled
                 else "((unsigned)t + 1u) * S")    # the step of the layer below that completes this one's input
        for i, s in enumerate(present):
            when = (f"once every block of this {group} has finished step t - 1 (its state) and the layer below step t "
                    f"(its output row block t)" if i == 0 else
                    f"once every block of this {group} has finished the stage before")
            lines.append(f"        // stage {s}: {when}")
            lines.append(f"        rnn_wait_for(own, BLOCKS_PER_HEAD * ((unsigned)t * S + {i}u));")
            if i == 0:                             # the layer below is read whole: every head of it
                lines.append("        if (layer > 0)")
                lines.append("            for (int hd = 0; hd < HEADS; ++hd)")
                lines.append(f"                rnn_wait_for(arrivals + (layer - 1) * HEADS + hd, BLOCKS_PER_HEAD * {below});")
            lines.append("        __syncthreads();")
            lines.append(f"        if (tu > 0) {prefix}_stage_{s}(L, layer, t, u0, tu, smem{carry_arg});")
            lines.append("        rnn_arrive(own);")
        lines.append("    }")
        return lines + stream_drain(tiling) + ["}"]
    if pooled:
        lines.append("    for (int k = 0; k < T; ++k) {   // T: the launch's wavefront steps (engine/schedules/steps.py)")
        lines += _stepped("        ", "k")
    else:
        lines.append(f"    for (int k = 0; k < T + {tiling.num_layers} - 1; ++k) {{   // wavefront step k: layer l runs "
                     "step k - l")
        lines.append("        const int t = k - layer;")
        lines.append("        const bool busy = tu > 0 && t >= 0 && t < T;")
    for s in present:
        lines.append(f"        if (busy) {prefix}_stage_{s}(L, layer, t, u0, tu, smem{carry_arg});")
        lines.append("        grid.sync();")
    lines.append("    }")
    return lines + stream_drain(tiling) + ["}"]


def entry_points(program: Program) -> dict[str, object]:
    prefix = program.kernels[0].name.rsplit("_stage", 1)[0] if program.kernels else kernel_prefix(program.cell.name)
    return {"wave": tuple(f"{prefix}_wave_s{s}" for s in stages(program)), "persistent": f"{prefix}_persistent"}
