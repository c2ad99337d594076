"""The persistent schedule's cluster mode (TileConfig(sync="cluster")): the blocks that exchange a step's values form
one thread-block cluster, and a step's cross-block traffic stays in distributed shared memory.

Where every GEMM of a step reads one group of the hidden units (a head: engine/schedules/heads.py gemm_heads; or, in
a cell without heads, the whole layer), the blocks owning that group's units are all a unit's step depends on. They
run as one cluster of CS <= 16 blocks (Hopper, PTX ISA "Cluster of cooperative thread arrays"):
- each block keeps the group's operand, the 16-bit copy of h, in its own shared memory (`local X`), one copy per
  version of the buffer (a double buffer has two), zero-padded to whole MMA tiles; the GEMMs' outputs for its units
  (`local Y`) and the kernel's argument table stay there too, and the rows of the input projection (one cuBLAS GEMM
  before the launch) are copied in a step ahead (cp.async), so a stage reads nothing from L2 on its critical path
  but its states (a cluster barrier's acquire leaves no L1 line to hit);
- the cell code writes a unit's 16-bit value into its own block's local X; after a block barrier the block copies
  its slice into the local X of every other block of the cluster (st.shared::cluster through mapa, 16 bytes at a
  time where the slice allows: kernels/cluster_sync.cuh rnn_cluster_share);
- a cluster barrier ends every stage instead of a grid barrier: the arrive (release) after the copies, the stage's
  global stores (states, output) between it and the wait (acquire). It orders the copies before the next stage's
  GEMM, which then reads X from its own shared memory: no L2 round trip for the operand and no grid-wide barrier on
  the step's critical path;
- the clusters (one a head) never wait for each other, so the launch is not cooperative.
The GEMMs are the tensor-core MMAs of kernels/mma_gemm.cuh (rnn_mma_gemms_local), weights resident; on an H100 /
H200 (sm_90) with 16, 32 or 64 batch rows after padding, wgmma with the weights held in registers for the whole
launch instead (kernels/wgmma_gemm.cuh, TileConfig.wgmma; register_plan says where it applies): shared memory then
carries only h, once a warpgroup, the local copies take wgmma's B layout (LocalX.swizzled), and a block reads the
other blocks' units from their shared memory after the barrier (a pull) instead of storing its own into theirs
before it; and where every copy is a double buffer, a block sends its units with st.async into the others' copies,
completing on their transaction barriers, and no cluster barrier stands on the step's path (exchange()). One layer a
launch: layers above run after it, their input projection one cuBLAS GEMM over the sequence (layers_per_launch=1).

Why: a grid barrier or an arrival counter costs ~1.3 us a stage on an H100 or H200 (L2 atomics and polling, whatever
the number of blocks: benchmarks/NOTES.md, 2026-11-26 22:35), and staging X from L2 ~1 us more; at B = 16 the
sLSTM's MMAs take a fraction of that.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..codegen.cluster import exchange
from ..errors import CompileError
from .heads import gemm_heads

CLUSTER_MAX = 16          # blocks of a cluster: 8 portable, 16 with cudaFuncAttributeNonPortableClusterSizeAllowed
CLUSTER_DEFAULT = 8       # blocks a group, unless TileConfig.units_per_block says otherwise
ARGS_FLOATS = 1024        # shared memory kept for the kernel's argument table (LayerArgs, static __shared__)


@dataclass(frozen=True)
class LocalX:
    """A buffer a step GEMM reads, kept in every block's shared memory in cluster mode: `versions` copies (2 for a
    double buffer) of round_up(B, 16) rows x `stride` 16-bit elements (the group's `cols` columns, padded), from
    float `offset` of the staging area. swizzled: wgmma's B layout instead of padded rows (the wgmma path,
    kernels/wgmma_gemm.cuh rnn_swz_index: chunks of 64 columns, `stride` the columns rounded up to 64), from float
    `offset` after the first 1024-byte boundary of the staging area."""

    buffer: str
    versions: int
    cols: int
    stride: int
    offset: int
    floats: int                    # one version's floats
    swizzled: bool = False


def group_units(hidden: int, heads: int) -> int:
    """Hidden units a cluster owns: a head's, or the whole layer's."""
    return hidden // heads


def cluster_units(hidden: int, heads: int, requested: int | None) -> tuple[int, str | None]:
    """(units a block, why not) for a group of hidden // heads units: the requested units, or the group over
    CLUSTER_DEFAULT blocks (16 where 8 does not divide it); the group must be whole blocks, at most CLUSTER_MAX."""
    units_of_group = group_units(hidden, heads)
    if requested is None:
        blocks = next((n for n in (CLUSTER_DEFAULT, CLUSTER_MAX, 4, 2, 1) if units_of_group % n == 0), None)
        requested = units_of_group // blocks if blocks else units_of_group
    if units_of_group % requested:
        fits = [n for n in range(1, CLUSTER_MAX + 1) if units_of_group % n == 0]
        return requested, (f"{requested} units a block do not divide the {units_of_group} units of a "
                           f"{'head' if heads > 1 else 'layer'}; hint: units_per_block one of "
                           f"{sorted({units_of_group // n for n in fits})}")
    if units_of_group // requested > CLUSTER_MAX:
        return requested, (f"{units_of_group // requested} blocks a {'head' if heads > 1 else 'layer'} exceed a "
                           f"cluster's {CLUSTER_MAX}; hint: units_per_block >= {-(-units_of_group // CLUSTER_MAX)}")
    return requested, None


@dataclass(frozen=True)
class LocalY:
    """A step GEMM's output for this block's units, kept in shared memory in cluster mode: B rows of `ld` floats
    (its columns, terms x units) from float `offset` of the staging area, where the cell code reads it."""

    gemm: str
    terms: int
    ld: int
    offset: int
    versions: int = 1              # 2: an input projection's rows, step t at version t % 2 (copied a step ahead)

    @property
    def floats(self) -> int:
        """One version's floats, whole 16 bytes (times the batch: LocalY.rows_floats)."""
        return -(-self.ld // 4) * 4


def local_x(reads: list[tuple[str, bool, int]], rows: int, stride_of,
            swizzled: bool = False) -> tuple[tuple[LocalX, ...], int]:
    """The local X copies of the buffers the step GEMMs read ((name, double, group columns) each) and their floats:
    rows x stride_of(cols) 16-bit elements a version, whole 16 bytes; swizzled, chunks of 64 columns (whole 1024
    bytes at 16 rows and more) and 1024 bytes more, to start them on a 1024-byte boundary."""
    out, offset = [], 0
    for name, double, cols in reads:
        stride = -(-cols // 64) * 64 if swizzled else stride_of(cols)
        floats = -(-rows * stride * 2 // 16) * 4
        versions = 2 if double else 1
        out.append(LocalX(name, versions, cols, stride, offset, floats, swizzled))
        offset += versions * floats
    return tuple(out), offset + (ALIGN_FLOATS if swizzled and out else 0)


ALIGN_FLOATS = 256                 # 1024 bytes: room to start the swizzled local copies on a 1024-byte boundary
WGMMA_ROWS = (16, 32, 64)          # batch rows (padded to 16) the wgmma path takes: its N (kernels/wgmma.cuh)


def register_plan(tiles, units: int, rows: int, threads: int, prec, limits) -> tuple[tuple[int, int, int], str | None]:
    """((tiles, parts, k steps a part), None) of the step GEMMs on wgmma with the weights in registers
    (kernels/wgmma_gemm.cuh), or ((0, 0, 0), why not). tiles: the step GEMMs (gemm, K, vec) of the tiling; rows: the
    batch rounded up to 16. The weights' registers are at most half a thread's share of the register file."""
    none = (0, 0, 0)
    if limits.arch != "sm_90":
        return none, f"wgmma is Hopper's (sm_90), and this is {limits.arch or 'an unknown GPU'}"
    if prec.weight_bytes != 2:
        return none, "wgmma from registers runs fp16 / bf16 operands"
    if rows not in WGMMA_ROWS:
        return none, f"{rows} batch rows (padded) are not one of wgmma's N here ({', '.join(map(str, WGMMA_ROWS))})"
    if threads % 128:
        return none, f"{threads} threads are not whole warpgroups"
    count = sum(-(-len(g.terms) * units // 64) for g, _, _ in tiles)
    groups = threads // 128
    if not count or count > groups:
        return none, f"{count} tiles of 64 weight rows need as many warpgroups, and {threads} threads have {groups}"
    parts = groups // count
    ksteps = max(-(-k // 16) for _, k, _ in tiles)
    ksp = -(-ksteps // parts)
    if 4 * ksp > 65536 // threads // 2:
        return none, (f"a warpgroup would hold {4 * ksp} registers of weights a thread, more than half of the "
                      f"{65536 // threads} a thread of {threads} has")
    return (count, parts, ksp), None


def check_wgmma_flag(wanted, sync: str | None) -> None:
    """TileConfig.wgmma: None, or True / False with sync='cluster'; else a CompileError that names the field."""
    if wanted is not None and (not isinstance(wanted, bool) or sync != "cluster"):
        raise CompileError(f"TileConfig.wgmma={wanted!r} applies to sync='cluster' only, as True or False; hint: "
                           "leave it None (wgmma where cluster mode can take it)")


def wgmma_plan(wanted: bool | None, cell: str, tiles, units: int, rows: int, threads: int, prec,
               limits) -> tuple[int, int, int]:
    """The wgmma path's plan for TileConfig.wgmma=`wanted` (None: where it applies; False: never; True: a
    CompileError that says why where it does not apply)."""
    plan, why = register_plan(tiles, units, rows, threads, prec, limits)
    if wanted and why:
        raise CompileError(f"TileConfig.wgmma=True cannot run cell '{cell}': {why}; hint: wgmma=None or False")
    return (0, 0, 0) if wanted is False or why else plan


def describe_wgmma(plan: tuple[int, int, int], precision: str) -> str:
    """The wgmma path in Tiling.describe's words, or "" where the tiling does not take it."""
    tiles, parts, ksp = plan
    if not tiles:
        return ""
    return (f"wgmma ({precision}) with the weights in registers: {tiles} tiles of 64 weight rows, "
            f"K in {parts} part{'s' if parts > 1 else ''} of {ksp} k steps a warpgroup")


def describe_exchange(tiling) -> str:
    """Tiling.describe's words for the clusters and their exchange."""
    group = "head" if tiling.blocks_per_layer > tiling.cluster else "layer"
    how = {"share": "a cluster barrier a stage",
           "pull": "a cluster barrier a stage, then each block pulls the others' units",
           "push": "each block pushing its units into the others' with st.async and waiting on its own transaction "
                   "barrier (no cluster barrier a step)"}[exchange(tiling)]
    return (f", clusters of {tiling.cluster} blocks (a {group} each) exchanging h through distributed shared memory, "
            f"{how}")


def register_sums(plan: tuple[int, int, int], rows: int) -> int:
    """Floats the wgmma path's parts of K leave their sums in (parts 1.. of every tile, rows / 2 a thread)."""
    tiles, parts, _ = plan
    return max(parts - 1, 0) * tiles * 128 * (rows // 2)


def local_y(gemms: list[tuple[str, int]], batch: int, units: int, offset: int,
            versions: int = 1) -> tuple[tuple[LocalY, ...], int]:
    """GEMM outputs ((name, terms) each) for this block's units in shared memory from float `offset`, `versions`
    copies each, and the float after them."""
    out = []
    for name, terms in gemms:
        out.append(LocalY(name, terms, terms * units, offset, versions))
        offset += versions * batch * out[-1].floats
    return tuple(out), offset


def shared_layout(program, tiles, batch: int, rows: int, units: int, stride_of, swizzled: bool = False):
    """(local X copies, local Y tiles, floats of both) of the staging area in cluster mode: the operand of each step
    GEMM (tiles: (gemm, its K, vec) each), each step GEMM's output, and the input projections' rows of two steps
    (where they come as 16-byte copies). swizzled: the X copies in wgmma's B layout (the wgmma path)."""
    reads = {g.in_buffer: (g.in_buffer, program.buffer(g.in_buffer).double, k) for g, k, _ in tiles}
    local, floats = local_x(list(reads.values()), rows, stride_of, swizzled)
    outputs, floats = local_y([(g.name, len(g.terms)) for g, _, _ in tiles], batch, units, floats)
    hoisted = [(g.name, len(g.terms)) for g in program.hoisted_gemms]
    if hoisted and all(terms * units % 4 == 0 for _, terms in hoisted):
        projections, floats = local_y(hoisted, batch, units, floats, versions=2)
        outputs += projections
    return local, outputs, floats


def groups(program, persistent: bool, mma: bool, half_bytes: int, layers: int, hidden: int, heads: bool,
           requested: int | None) -> tuple[int, int]:
    """(heads a cluster owns one of, 1 for the whole layer; units a block) of cluster mode, or a CompileError that
    says why the program cannot run so. heads=False: the tiling multiplies whole block-diagonal matrices."""
    why = why_not(program, persistent, mma, half_bytes, layers)
    found = {gemm_heads(program, g) if heads else 1 for g in program.gemms
             if not g.hoisted and g.name not in program.reductions}
    group = found.pop() if len(found) == 1 else 1
    units = 0
    if not why:
        units, why = cluster_units(hidden, group, requested)
    if why:
        raise CompileError(f"TileConfig.sync='cluster' cannot run cell '{program.cell.name}': {why}")
    return group, units


def why_not(program, persistent: bool, mma: bool, half_bytes: int, layers: int) -> str | None:
    """Why the program cannot run in cluster mode at all (before tiling), or None."""
    if not persistent:
        return "clusters are a mode of the persistent schedule; hint: leave sync None for the graph schedule"
    if not mma or half_bytes != 2:
        return ("cluster mode runs the step GEMMs on fp16 / bf16 tensor cores (B > 4); hint: precision='bfloat16' "
                "or 'float16' with more than 4 batch rows, or sync='grid'")
    if layers != 1:
        return "cluster mode runs one layer a launch; hint: layers_per_launch=1"
    if program.reductions:
        return (f"its reduction(s) over H ({', '.join(sorted(program.reductions))}) need every block of the layer; "
                "hint: sync='grid'")
    if not any(not g.hoisted for g in program.gemms):
        # Nothing to keep on chip: no matmul reads a state (minGRU, IndRNN). The kernel's shared layout had no room
        # for its exchange then, and wrote past it (compute-sanitizer, minGRU in bf16, 2026-11-27).
        return ("no matmul reads a state, so there are no recurrent weights to hold in the cluster; hint: "
                "sync='grid', or backend='scan' for a linear recurrence")
    return None
