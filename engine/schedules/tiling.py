"""How a wavefront schedule splits the work of one wavefront step over thread blocks.

Every block owns one layer and a contiguous tile of that layer's hidden units. Because the
program's GEMMs use the interleaved layout (unit j of term k is column j * nterms + k), a tile of
units is a contiguous run of GEMM columns that holds every gate of those units: the block computes
its columns of each recurrent GEMM and then, with no exchange with other blocks, the cell's
elementwise math for the same units. Blocks meet only at the end of a stage (a grid-wide barrier in
the persistent kernel, a kernel boundary in the graph schedule).

    tiling = make_tiling(program, network, batch, TileConfig(units_per_block=16), device)
    tiling.blocks, tiling.smem_bytes, tiling.resident      # what the launch needs

All of it is plain arithmetic on sizes, testable without a GPU. `DeviceLimits` carries the few
device properties it needs (read from CuPy on the GPU, fixed numbers in tests).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..codegen.precision import Precision
from ..codegen.precision import precision as lookup_precision
from ..codegen.shared_outputs import shared_outputs
from ..errors import CompileError
from ..network import Network
from ..plan import Program
from . import cluster as cluster_mode
from . import stream
from .heads import gemm_heads, head_sync
from .staging import (
    BULK_CHUNK,
    FLOAT_BYTES,
    mma_scratch,
    mma_warps,
    round_up,
    tile_scratch,
    weight_floats,
    x_stride,
)

GEMV_MAX_ROWS = 4                      # batches up to this use rnn_warp_gemvs (X in registers), larger rnn_tile_gemms
MAX_THREADS = 1024
# (K columns per chunk, pipeline depth), chunks of at least 64 columns first (a barrier per chunk), then the
# most columns in flight; make_tiling scores them with the weights each leaves room for on chip.
PIPELINES = ((128, 4), (128, 3), (64, 4), (128, 2), (64, 3), (64, 2), (32, 4), (32, 3), (32, 2), (16, 4), (16, 3),
             (16, 2), (8, 2))


@dataclass(frozen=True)
class DeviceLimits:
    multiprocessors: int
    smem_per_block: int                # bytes a block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin)
    name: str = "GPU"
    arch: str = ""
    l2_bytes: int = 50 * 1024 * 1024   # the L2 cache (H100: 50 MB)

    @staticmethod
    def current() -> "DeviceLimits":
        import cupy  # deferred: CuPy is optional (no GPU in CI)
        dev = cupy.cuda.Device()
        attrs = dev.attributes
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return DeviceLimits(attrs["MultiProcessorCount"], attrs["MaxSharedMemoryPerBlockOptin"], name,
                            f"sm_{dev.compute_capability}", attrs["L2CacheSize"])


# An H100 SXM, for tests and for explain() on machines without a GPU.
H100 = DeviceLimits(multiprocessors=132, smem_per_block=232448, name="NVIDIA H100 (nominal)", arch="sm_90")


@dataclass(frozen=True)
class TileConfig:
    """The knobs the autotuner turns. units_per_block=None: as many blocks as the GPU has SMs;
    threads=None: one thread per accumulator tile of the widest GEMM (rounded to warps, 128 to 512),
    or 128 for the warp GEMV of small batches (256 where its widest GEMM has more than 32 columns a block)."""

    units_per_block: int | None = None
    rows_per_thread: int | None = None  # RB: batch rows of a thread's accumulator tile; None (with cols_per_thread):
    cols_per_thread: int | None = None  # RC: GEMM columns of it; 8x8 for big stacked GEMMs, else 4x4 (default_tile)
    threads: int | None = None
    resident: bool = True              # keep weight slices in shared memory when they fit (persistent only)
    warp_tile: tuple[int, int] | None = None   # tensor-core path (tf32/fp16/bf16): MMA tiles of 16 rows x 8
    #                                            columns per warp; None: 2 x 2, fewer where the GEMM is smaller
    layers_per_launch: int | None = None   # persistent: run the layers in groups of this many, one launch
    #                                        each (1: layer by layer, every input projection one cuBLAS GEMM)
    pipeline: tuple[int, int] | None = None   # tiled GEMMs: (K columns a chunk, chunks in flight + 1), one of
    #                                    PIPELINES; None: the one that leaves the most weights on chip (make_tiling)
    sync: str | None = None            # persistent: "grid" (a grid-wide barrier after every stage of a wavefront
    #                                    step), "layer" (per-layer arrival counters: a layer waits for its own blocks
    #                                    and the layer below only, and runs ahead of the layers above), "head" (per-
    #                                    head counters, where every in-step GEMM reads one head: head_sync) or
    #                                    "cluster" (cluster.py); None: "layer" for the warp GEMV of small batches with
    #                                    several layers a launch (`lat`: 8-17% faster, H100), else "grid" (`blogB`)
    wgmma: bool | None = None          # sync="cluster": step GEMMs on wgmma, weights in registers (None: where it can)
    feed_warp: bool = False            # bulk: a warp of threads feeds the ring (else thread 0, between its MMAs)
    stream_wgmma: bool = False         # bulk, weights streamed: the step GEMMs on wgmma, fed by two warps (stream.py)

    def label(self) -> str:
        units = "auto" if self.units_per_block is None else str(self.units_per_block)
        threads = "auto" if self.threads is None else str(self.threads)
        tile = ("auto" if self.rows_per_thread is None and self.cols_per_thread is None
                else f"{self.rows_per_thread or 'auto'}x{self.cols_per_thread or 'auto'}")
        return (f"units={units} tile={tile} threads={threads}"
                + ("" if self.resident else " streamed")
                + ("" if self.pipeline is None else f" pipeline={self.pipeline[0]}x{self.pipeline[1]}")
                + ("" if self.warp_tile is None else f" warp={self.warp_tile[0]}x{self.warp_tile[1]}")
                + ("" if self.layers_per_launch is None else f" layers/launch={self.layers_per_launch}")
                + ("" if self.sync is None else f" sync={self.sync}")
                + ("" if self.wgmma is None else f" wgmma={'on' if self.wgmma else 'off'}")
                + (" feed=warp" if self.feed_warp else "") + (" stream=wgmma" if self.stream_wgmma else ""))


@dataclass(frozen=True)
class GemmTile:
    """One GEMM's slice per block: NC = terms * units columns over K, in layer `layers` ("all" or ">0")."""

    name: str
    terms: int
    hoisted: bool                      # the input projection, computed in the kernel for layers > 0
    k_max: int                         # the largest K over the layers that run it here
    resident: bool
    smem_offset: int                   # floats from the start of shared memory (resident slices only)
    resident_floats: int
    vec: int = 4                       # 4: every K of it is a multiple of 4 (16-byte copies), else 1
    heads: int = 1                     # k: a block reads only its head's K / k columns (gemm_heads); k_max is those


@dataclass(frozen=True)
class Tiling:
    config: TileConfig
    units_per_block: int
    blocks_per_layer: int
    num_layers: int                    # layers in one launch (the network's, unless it runs in groups)
    batch: int
    hidden: int
    k_chunk: int                       # K columns staged per chunk
    gemms: tuple[GemmTile, ...]
    scratch_offset: int                # floats: where the staging area starts
    smem_bytes: int
    limits: DeviceLimits
    persistent: bool                   # one cooperative launch (weights may be resident) or one launch per stage
    notes: tuple[str, ...] = field(default=())
    path: str = "tiled"                # "gemv" (few batch rows: warps over columns) or "tiled" (register tiles)
    layer0_in_kernel: bool = False     # layer 0 projects its input in the kernel (L > 1), else cuBLAS before it
    stages: int = 2                    # depth of the cp.async pipeline of the tiled GEMMs
    nc_streamed: int = 0               # rows of W staged per chunk (the widest streamed GEMM; 0: all resident)
    network_layers: int = 0            # the network's layers (a multiple of num_layers)
    precision: str = "float32"         # engine.codegen.precision: tf32/float16/bfloat16 use tensor-core MMA
    warp_tile: tuple[int, int] = (0, 0)   # tensor-core path: MMA tiles (16 rows x 8 columns) per warp, rows x cols
    bulk: bool = False                 # fp16/bf16 on sm_90: chunks staged by bulk copies from chunked operands
    l2_keep: float = 1.0               # bulk: share of the streamed weights kept in L2 (evict_last), the rest evict_first
    cluster: int = 0                   # sync="cluster": blocks a cluster (a head's or the layer's; cluster.py), else 0
    local_x: tuple = ()                # sync="cluster": the step GEMMs' operands in shared memory (cluster.LocalX)
    local_y: tuple = ()                # sync="cluster": the step GEMMs' outputs in shared memory (cluster.LocalY)
    wgmma: tuple[int, int, int] = (0, 0, 0)   # sync="cluster": the wgmma path's (tiles, parts, k steps a part), or 0s
    y_shared: tuple = ()               # the step GEMMs' outputs in shared memory (shared_outputs.py): (name, at, ld)
    producer_warps: int = 0            # bulk: warps past the MMA warps, in config.threads, that only feed the ring
    stream_n: int = 0                  # stream_wgmma: the step GEMMs' wgmma N (kernels/wgmma_stream.cuh), else 0

    def __post_init__(self):
        if not self.network_layers:
            object.__setattr__(self, "network_layers", self.num_layers)

    @property
    def launches(self) -> int:
        """Launches per sequence: one per group of num_layers layers."""
        return self.network_layers // self.num_layers

    @property
    def mma(self) -> bool:
        """The tiled GEMMs run on tensor cores (kernels/mma_gemm.cuh)."""
        return self.path == "tiled" and lookup_precision(self.precision).tensor_cores

    @property
    def blocks(self) -> int:
        return self.blocks_per_layer * self.num_layers

    @property
    def sync_heads(self) -> int:
        """Arrival counters a layer (sync="head": one a head; else 1)."""
        return next(g.heads for g in self.gemms if not g.hoisted) if self.config.sync == "head" else 1

    @property
    def x_local_floats(self) -> int:
        """sync="cluster": floats of the local X copies and Y tiles from the staging area's start (sums after them)."""
        x = sum(x.versions * x.floats for x in self.local_x)
        return max([x] + [y.offset + y.versions * self.batch * y.floats for y in self.local_y])

    @property
    def blocks_per_head(self) -> int:
        return self.blocks_per_layer // self.sync_heads

    @property
    def resident(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.gemms if g.resident)

    def describe(self) -> str:
        res = ", ".join(self.resident) or "none"
        if self.path == "gemv":
            product = f"warp GEMV ({self.config.threads // 32} warps split the columns, lanes split K)"
        elif self.mma:
            wm, wn = self.warp_tile
            product = (f"tensor-core MMA ({self.precision}), {wm * 16}x{wn * 8} accumulators per warp, "
                       f"K chunk {self.k_chunk} in a {self.stages}-stage pipeline"
                       + (" of bulk copies" if self.bulk else ""))
        else:
            product = (f"{self.config.rows_per_thread}x{self.config.cols_per_thread} accumulators per thread, "
                       f"K chunk {self.k_chunk} in a {self.stages}-stage pipeline")
        groups = "" if self.launches == 1 else f", launched {self.launches} times (one group of layers each)"
        if self.config.sync == "layer":
            groups += ", layers synchronised by per-layer arrival counters"
        elif self.cluster:
            groups += cluster_mode.describe_exchange(self)
        elif self.config.sync == "head":
            groups += (f", heads synchronised by per-head arrival counters ({self.blocks_per_head} blocks a head "
                       "wait for each other only)")
        product = cluster_mode.describe_wgmma(self.wgmma, self.precision) or product
        return (f"{self.blocks} blocks ({self.blocks_per_layer} per layer x {self.num_layers} layers){groups}, "
                f"{self.units_per_block} hidden units per block, {self.config.threads} threads, {product}, "
                f"{self.smem_bytes / 1024:.1f} KiB shared memory per block, "
                f"weights resident in shared memory: {res}"
                + (", layer 0 projects its input in the kernel" if self.layer0_in_kernel else "")
                + (", the GEMMs' outputs kept in shared memory" if self.y_shared else "")
                + "".join(f", {g.name} reads one head's {g.k_max} of {g.k_max * g.heads} columns (heads: {g.heads})"
                          for g in self.gemms if g.heads > 1))


def eligibility(program: Program) -> str | None:
    """Why the wavefront schedules cannot run this program, or None when they can."""
    if program.layout != "interleaved":
        return "the wavefront schedules need the interleaved weight layout (compile with layout='interleaved')"
    if program.cell.uses_projection:
        return ("the cell has values of the projection size P, and the wavefront schedules tile hidden units only; "
                "hint: backend='fused' runs it")
    for g in program.gemms:
        if any(t.dim != "H" for t in g.terms):
            return (f"GEMM '{g.name}' has an output block of size I; a block of hidden units cannot own "
                    "its columns")
        if len(g.terms) > 1 and g.layout != "interleaved":
            return f"GEMM '{g.name}' could not use the interleaved layout (its blocks differ in size)"
    for k in program.kernels:
        if k.dim != "H":
            return f"kernel '{k.name}' runs over (B, {k.dim}); the wavefront schedules tile hidden units only"
    for b in program.buffers:
        if b.rows == "batch" and b.role == "gemm_operands" and b.cols.i:
            return f"buffer '{b.name}' holds an input-sized operand per step (is hoist_inputs off?)"
    return None


def auto_threads(groups: int, most: int = 512) -> int:
    """Threads for a block whose widest GEMM has `groups` accumulator tiles: a whole multiple of the tiles
    (the rest split K), at least 256 (8 warps, two per scheduler, to hide shared-memory latency) and at
    most `most` (512; 256 for 8x8 tiles, whose 64 accumulators and operands need more than the 168 registers a
    thread of 384 gets: ptxas spilled 672 bytes a thread at `large`)."""
    if groups >= 256:
        return min(most, round_up(groups, 32))
    best = max(range(1, most // groups + 1), key=lambda m: (min(m * groups, most) >= 256, -abs(m * groups - 384)))
    return min(most, round_up(best * groups, 32))


def default_tile(program: Program, network: Network, batch: int, layers: int, units: int | None, prec: Precision,
                 limits: DeviceLimits) -> tuple[int, int]:
    """The accumulator tile when the config names none (float32, B >= 64; smaller batches and the tensor-core modes
    keep 4x4), from the widest GEMM a block runs, W columns, counted in tiles of each shape:
    - several layers a launch: 8x8 where (B / 8) x (W / 8) >= 64 (`mid` LSTM: 8 x 8), 8x4 where it is >= 48 (`mid`
      GRU, 48 columns), else 4x4. 8x8 tiles read half the shared memory per FMA and their split-K sums go through
      shared memory in rounds (rnn_store_tile), so the layers keep their weights resident: `mid` LSTM 4.29 ms against
      4.59 with 4x4; the GRU (48 tiles of 8x8, split 4 ways over 192 of 256 threads) ran 3.53 ms with 8x4 against
      3.92 with 8x8 (H100, benchmarks/NOTES.md, 2026-11-24 00:04);
    - one layer a launch (`large` layer by layer, `blogA`): 8x4 where (B / 8) x (W / 4) >= 48: LSTM `large` 12.9 ms
      against 14.1 with 4x4 (8x8: 13.1), `blogA` 38.5 against 39.9 (8x8: 43.2); GRU `large` 10.9 against 11.5,
      `blogA` 30.8 against 34.7 (8x8: 40.6; same H100 call). Narrower blocks keep 4x4 (not measured).
    The autotuner tries the other shapes."""
    if batch < 64 or prec.tensor_cores:
        return 4, 4
    if units is None:
        units = -(-network.hidden_size // max(1, limits.multiprocessors // layers))
    widest = max((len(g.terms) * units for g in program.gemms
                  if not (g.hoisted and layers == 1) and g.name not in program.reductions), default=0)
    if layers < 2:
        return (8, 4) if (batch // 8) * (widest // 4) >= 48 else (4, 4)
    tiles8 = (batch // 8) * (widest // 8)
    return (8, 8) if tiles8 >= 64 else (8, 4) if tiles8 >= 48 else (4, 4)


def bulk_capable(prec: Precision, limits: DeviceLimits, ks) -> bool:
    """Whether the fp16/bf16 GEMMs can use the bulk pipeline: 16-bit operands, sm_90 or newer (cp.async.bulk,
    mbarrier transactions), and every K a multiple of BULK_CHUNK (whole chunks, one copy each)."""
    arch = int("".join(ch for ch in limits.arch if ch.isdigit()) or 0)
    return prec.tensor_cores and prec.weight_bytes == 2 and arch >= 90 and all(k % BULK_CHUNK == 0 for k in ks)


def make_tiling(program: Program, network: Network, batch: int, config: TileConfig | None = None,
                limits: DeviceLimits = H100, *, persistent: bool = True, heads: bool = True) -> Tiling:
    """Partition the hidden units of every layer into blocks and lay out shared memory. heads: GEMMs of heads
    weights read only their block's head (gemm_heads) where every block's units lie in one head and the weight is
    read through the warp GEMV or resident through the bulk tensor-core pipeline; heads=False multiplies the zeros."""
    config = config or TileConfig()
    prec = lookup_precision(program.precision)
    why = eligibility(program)
    if why:
        raise CompileError(f"cell '{program.cell.name}': {why}")
    for field_name, value in (("rows_per_thread", config.rows_per_thread), ("cols_per_thread", config.cols_per_thread)):
        if value is not None and value not in (1, 2, 4, 8):
            raise CompileError(f"TileConfig.{field_name}={value!r} is not a supported tile size; hint: use 1, 2, 4 or 8")
    if config.warp_tile is not None and (len(config.warp_tile) != 2 or any(v not in (1, 2, 4) for v in config.warp_tile)):
        raise CompileError(f"TileConfig.warp_tile={config.warp_tile!r} is not a supported warp tile; hint: two of "
                           "1, 2 or 4 (MMA tiles of 16 rows, of 8 columns), or None")
    if config.pipeline is not None and tuple(config.pipeline) not in PIPELINES:
        raise CompileError(f"TileConfig.pipeline={config.pipeline!r} is not a known pipeline; hint: one of "
                           + ", ".join(f"({kc}, {st})" for kc, st in PIPELINES) + " (K chunk, stages), or None")
    if config.threads is not None and (not isinstance(config.threads, int) or config.threads % 32
                                       or not 64 <= config.threads <= MAX_THREADS):
        raise CompileError(f"TileConfig.threads={config.threads!r} is not a whole number of warps in range; hint: use "
                           f"a multiple of 32 from 64 to {MAX_THREADS}, or None to size it from the tiles")
    cluster_mode.check_wgmma_flag(config.wgmma, config.sync)
    if config.stream_wgmma:
        config = stream.prepare(config)
    if config.sync == "cluster" and config.layers_per_launch is None:
        config = replace(config, layers_per_launch=1)         # clusters run one layer a launch (cluster.py)
    if config.layers_per_launch is None and persistent and network.num_layers > 1:
        # Default: all layers in one launch, unless some recurrent weight then has to be streamed every step and
        # the weights the kernel reads per wavefront step outgrow half the L2 (so they would come from DRAM),
        # while one layer a launch keeps them all on chip (large layers: cuDNN's layer-by-layer order, with the
        # input projections as one cuBLAS GEMM each).
        whole = make_tiling(program, network, batch, replace(config, layers_per_launch=network.num_layers), limits,
                            heads=heads)

        def roomy(t: Tiling) -> bool:         # recurrent weights on chip, and chunks of 64 columns beside them
            return all(g.resident or g.hoisted for g in t.gemms) and (t.path == "gemv" or t.k_chunk >= 64)
        if roomy(whole) or not config.resident:
            return whole
        weight_bytes = sum(g.n(network.layer_sizes(layer)) * g.k(network.layer_sizes(layer)) * prec.weight_bytes
                           for g in program.gemms for layer in range(network.num_layers)
                           if g.name not in program.reductions)
        if weight_bytes <= limits.l2_bytes // 2:
            return whole
        try:
            single = make_tiling(program, network, batch, replace(config, layers_per_launch=1), limits, heads=heads)
        except CompileError:
            return whole
        return single if roomy(single) else whole
    if config.sync not in (None, "grid", "layer", "head", "cluster"):
        raise CompileError(f"TileConfig.sync={config.sync!r} is not 'grid', 'layer', 'head' or 'cluster'; hint: 'grid' "
                           "(a barrier over all blocks after every stage), 'layer' (per-layer arrival counters), 'head' "
                           "(per-head arrival counters, for cells whose recurrent weights all have heads) or 'cluster' "
                           "(a thread-block cluster a head or layer: engine/schedules/cluster.py)")
    if config.sync in ("layer", "head", "cluster") and not persistent:
        raise CompileError(f"TileConfig.sync={config.sync!r} applies to the persistent schedule only (the graph "
                           "schedule's stages are separate launches); hint: leave it 'grid'")
    H, B = network.hidden_size, batch
    L = config.layers_per_launch or network.num_layers        # layers in one launch
    if config.layers_per_launch is not None:
        if not persistent:
            raise CompileError("TileConfig.layers_per_launch applies to the persistent schedule only; hint: leave it "
                               "None for the graph schedule")
        if (not isinstance(L, int) or L < 1 or network.num_layers % L):
            raise CompileError(f"TileConfig.layers_per_launch={L!r} does not divide the network's "
                               f"{network.num_layers} layers; hint: use a divisor of {network.num_layers}, or None")
    if config.rows_per_thread is None or config.cols_per_thread is None:
        rb, rc = default_tile(program, network, B, L, config.units_per_block, prec, limits)
        config = replace(config, rows_per_thread=config.rows_per_thread or rb, cols_per_thread=config.cols_per_thread or rc)
    cluster = config.sync == "cluster"
    group_heads = 1                                  # cluster mode: a cluster owns a head (or, at 1, the layer)
    if cluster:
        group_heads, units = cluster_mode.groups(program, persistent, B > GEMV_MAX_ROWS and prec.tensor_cores,
                                                 prec.weight_bytes, L, H, heads, config.units_per_block)
    elif config.units_per_block is None:
        per_layer = max(1, limits.multiprocessors // L)
        units = -(-H // per_layer)
        if B > GEMV_MAX_ROWS and not prec.tensor_cores:
            # Whole register tiles of columns in every GEMM: a GRU at blogB (H = 256, 3 layers) gets 6 units a block,
            # 18 columns padded to 20 and 320 of 416 threads busy; 8 units (24 columns, 96 blocks instead of 129)
            # ran 1.28 against 1.36 ms on an H100 (benchmarks/NOTES.md).
            terms = [len(g.terms) for g in program.gemms
                     if not (g.hoisted and L == 1) and g.name not in program.reductions]
            rounded = next((u for u in range(units, min(H, units + config.cols_per_thread) + 1)
                            if all(t * u % config.cols_per_thread == 0 for t in terms)), units)
            units = rounded
    else:
        if not isinstance(config.units_per_block, int) or config.units_per_block < 1:
            raise CompileError(f"TileConfig.units_per_block={config.units_per_block!r} is not a positive integer; "
                               "hint: give the hidden units a block owns, or None for one block per SM")
        units = min(config.units_per_block, H)
    bpl = -(-H // units)
    notes = []
    if persistent and bpl * L > limits.multiprocessors:
        raise CompileError(f"{bpl * L} blocks ({bpl} per layer x {L} layers) exceed the "
                           f"{limits.multiprocessors} multiprocessors of {limits.name}: a persistent kernel "
                           "needs every block resident at once; hint: raise units_per_block")
    RB, RC = config.rows_per_thread, config.cols_per_thread
    path = "gemv" if B <= GEMV_MAX_ROWS else "tiled"
    if config.sync is None:
        # Arrival counters where a step is a chain of latencies (the warp GEMV): at `lat` on an H100 LSTM 0.491 ->
        # 0.448 ms, GRU-Cho 0.670 -> 0.614, peephole 0.534 -> 0.443; the grid barrier where the GEMMs are large
        # enough to balance the layers (`blogB`: LSTM 1.32 against 1.43 ms; benchmarks/NOTES.md, 2026-11-23 22:07).
        config = replace(config, sync="layer" if persistent and path == "gemv" and L > 1 else "grid")
    mma = path == "tiled" and prec.tensor_cores        # tensor-core MMA: 16-row x 8-column tiles per warp
    bp = round_up(B, 16) if mma else round_up(B, RB)
    # With several layers a launch, the first projects its input in the kernel like the others: its blocks have
    # only the recurrent GEMM otherwise, so the projection rides free on the wavefront's critical path.
    layer0_in_kernel = L > 1
    tiles, head_of = [], {}
    for g in program.gemms:
        if g.hoisted and L == 1:
            continue                                 # one layer a launch: the projection is one cuBLAS GEMM before it
        if g.name in program.reductions:
            continue                                 # row sums of partials, no weight (engine.codegen.wavefront)
        layers = range(network.num_layers)
        k = gemm_heads(program, g) if heads and (path == "gemv" or mma) and persistent else 1
        k = group_heads if cluster else k
        if k > 1 and (H % k or (H // k) % units):
            k = 1                                    # a block would straddle two heads
        ks = [g.k(network.layer_sizes(layer)) // k for layer in layers]
        copy = 8 if mma and prec.weight_bytes == 2 else 4      # elements of a 16-byte copy of W (or of X)
        tiles.append((g, max(ks), 4 if all(k % copy == 0 for k in ks) else 1))
        head_of[g.name] = k
    ncps = {g.name: round_up(len(g.terms) * units, 8 if mma else RC) for g, _, _ in tiles}
    all_ks = [g.k(network.layer_sizes(layer)) // head_of[g.name] for g, _, _ in tiles
              for layer in range(network.num_layers)]
    bulk = mma and bool(tiles) and bulk_capable(prec, limits, all_ks) and not cluster
    k_all = max((k for _, k, _ in tiles), default=4)
    if mma:
        # Cluster mode: one 8-column tile a warp (sLSTM at H = 768, H200: 3.05 us a step against 4.02 with 16 columns
        # a warp, whose K split went through shared memory; NOTES 2026-11-26 22:35).
        wide = 1 if cluster or max(ncps.values(), default=8) <= 8 else 2
        warp_tile = tuple(config.warp_tile or (1 if bp == 16 else 2, wide))
        groups = {name: -(-bp // (16 * warp_tile[0])) * -(-ncp // (8 * warp_tile[1])) for name, ncp in ncps.items()}
    else:
        warp_tile = (0, 0)
        groups = {name: (bp // RB) * (ncp // RC) for name, ncp in ncps.items()}
    # the bulk pipeline's feed warp (mma_gemm.cuh, PW): one more warp, counted in threads (at least 2 MMA warps left)
    producer = int(bulk and config.feed_warp and (config.threads is None or config.threads >= 96))
    threads = config.threads
    if threads is None:
        # The warp GEMV: 4 warps where each then owns at most 8 columns of the widest GEMM, else 8. At `lat` (32
        # columns a block at most) 128 threads ran every preset faster on an H100: GRU-Cho 0.68 -> 0.59 ms, MGU 0.60
        # -> 0.54, GRU 0.42 -> 0.40, LSTM 0.45 -> 0.44 (benchmarks/NOTES.md, 2026-11-23 22:07); wider blocks keep 8
        # warps, whose accumulators stay in registers.
        gemv_threads = 128 if max(ncps.values(), default=0) <= 32 else 256
        threads = (gemv_threads if path == "gemv" else 32 * (mma_warps(max(groups.values(), default=1)) + producer)
                   if mma else auto_threads(max(groups.values(), default=1), 256 if RB * RC >= 64 else 512))
    config = replace(config, threads=threads)
    workers = threads // 32 - producer if mma else threads   # what the tiles are dealt to: MMA warps or threads
    reduce = path == "tiled" and any(n < workers for n in groups.values())
    tile = warp_tile[0] * warp_tile[1] * 4 if mma else RB * RC

    def scratch_for(nc_streamed: int, k_chunk: int, stages: int) -> int:
        if mma:
            return mma_scratch(bp, nc_streamed, k_chunk, stages, threads - 32 * producer, tile, reduce, prec, bulk)
        return tile_scratch(bp, nc_streamed, k_chunk, stages, threads, tile, reduce)
    smem_floats = limits.smem_per_block // FLOAT_BYTES
    # Recurrent GEMMs first: they are read every step by every layer; the input projections next.
    order = sorted(tiles, key=lambda item: item[0].hoisted)

    def lay_out(k_chunk: int, stages: int):
        want = persistent and config.resident
        need = {g.name: weight_floats(ncps[g.name], k, prec) for g, k, _ in order}
        if path == "gemv":
            return (set(need) if want and sum(need.values()) <= smem_floats else _greedy(need, 0, want)), 0, 0
        scratch_all = scratch_for(0, k_chunk, stages)
        if want and sum(need.values()) + scratch_all <= smem_floats:
            return set(need), scratch_all, 0
        streamed = max(ncps.values(), default=RC)
        scratch_some = scratch_for(streamed, k_chunk, stages)
        return _greedy(need, scratch_some, want), scratch_some, streamed

    def _greedy(need: dict, scratch: int, want: bool) -> set:
        resident, used = set(), 0
        for g, _, _ in order:               # recurrent GEMMs first
            if want and used + need[g.name] + scratch <= smem_floats:
                resident.add(g.name)
                used += need[g.name]
        return resident

    local, outputs, rs = (), (), (0, 0, 0)
    if path == "gemv":
        k_chunk, stages = round_up(k_all, 4), 1
        resident, scratch, nc_streamed = lay_out(k_chunk, stages)
    elif cluster:                                    # X in every block's shared memory, W resident: no pipeline
        k_chunk, stages, nc_streamed = round_up(k_all, 16), 1, 0
        rs = cluster_mode.wgmma_plan(config.wgmma, program.cell.name, tiles, units, bp, threads, prec, limits)
        local, outputs, x_floats = cluster_mode.shared_layout(program, tiles, B, bp, units,
                                                              lambda cols: x_stride(cols, prec), swizzled=rs[0] > 0)
        scratch = x_floats + (threads * tile if reduce else 0) + cluster_mode.register_sums(rs, bp)
        smem_floats -= cluster_mode.ARGS_FLOATS           # the argument table, copied to static shared memory
        need = {g.name: weight_floats(ncps[g.name], k, prec) for g, k, _ in order}
        wider = H // group_heads // cluster_mode.CLUSTER_MAX       # units a block at 16 blocks a cluster
        if sum(need.values()) + scratch > smem_floats and config.units_per_block is None and 0 < wider < units:
            return make_tiling(program, network, batch, replace(config, units_per_block=wider), limits,
                               persistent=persistent, heads=heads)   # the default's 8 blocks do not fit: 16
        if not config.resident or sum(need.values()) + scratch > smem_floats:
            raise CompileError(f"TileConfig.sync='cluster' keeps every step weight in shared memory, and cell "
                               f"'{program.cell.name}' needs {(sum(need.values()) + scratch) * FLOAT_BYTES} bytes a "
                               f"block of the {limits.smem_per_block}; hint: fewer units_per_block, or sync='grid'")
        resident = set(need)
    else:
        step = 16 if mma else 4                         # chunks of whole MMA steps
        cap = round_up(k_all, step)
        options = ([(kc, st) for kc, st in PIPELINES if kc % BULK_CHUNK == 0 and all(k % kc == 0 for k in all_ks)]
                   if bulk else [(min(kc, cap), st) for kc, st in PIPELINES if kc >= step])
        if bulk and any(k > 1 for k in head_of.values()) and len(set(all_ks)) == 1 and all_ks[0] % 128:
            # A head whose columns are whole chunks of 64 but not of 128 as one chunk: at 192 (the sLSTM at
            # H = 768, 4 heads) each chunk of 64 cost ~1.2 us of the step's latency (phase profile, H200: the GEMM
            # took 3.74 us in three chunks, 2.14 us in one).
            options = [(all_ks[0], 2)] + options
        if config.pipeline is not None:
            kc, st = config.pipeline
            if bulk and (kc % BULK_CHUNK or any(k % kc for k in all_ks)):
                raise CompileError(f"TileConfig.pipeline={config.pipeline!r}: the bulk pipeline copies chunks of a "
                                   f"multiple of {BULK_CHUNK} columns that divide every K ({sorted(set(all_ks))}); "
                                   "hint: such a chunk, or None")
            options = [(min(kc, cap), st)]
        laid = [(kc, st, *lay_out(kc, st)) for kc, st in dict.fromkeys(options)]
        fits = [item for item in laid if item[3] <= smem_floats] or laid[-1:]
        recurrent = {g.name for g, _, _ in order if not g.hoisted}

        def score(item):
            # Recurrent weights on chip first (read every step by every layer), then chunks of at least 64
            # columns (a barrier per chunk: small chunks cost more than streaming a projection), then more
            # weights on chip; ties go to the earlier pipeline in PIPELINES.
            return (len(item[2] & recurrent), item[0] >= 64, len(item[2]))
        best = max(score(item) for item in fits)
        k_chunk, stages, resident, scratch, nc_streamed = next(item for item in fits if score(item) == best)

    gemm_tiles, offset = [], 0
    for g, k_max, vec in order:
        floats = weight_floats(ncps[g.name], k_max, prec)
        is_resident = g.name in resident
        if persistent and config.resident and not is_resident:
            notes.append(f"{g.name}: {floats * FLOAT_BYTES / 1024:.0f} KiB per block does not fit in shared "
                         "memory beside the others; streamed from L2 every step")
        gemm_tiles.append(GemmTile(g.name, len(g.terms), g.hoisted, k_max, is_resident,
                                   offset if is_resident else 0, floats if is_resident else 0, vec, head_of[g.name]))
        if is_resident:
            offset += floats
    # Weights streamed every step that outgrow half the L2 would all cycle through DRAM (LRU over a sweep larger
    # than the cache): the bulk copies mark a share that fits as evict_last, so that share stays on chip.
    streamed = sum(g.n(network.layer_sizes(layer)) * g.k(network.layer_sizes(layer)) * prec.weight_bytes
                   for g, _, _ in tiles if g.name not in resident for layer in range(L))
    l2_keep = min(1.0, limits.l2_bytes / 2 / streamed) if streamed else 1.0
    smem = (offset + scratch) * FLOAT_BYTES
    if smem > limits.smem_per_block:
        raise CompileError(f"the tiling needs {smem} bytes of shared memory per block, more than the "
                           f"{limits.smem_per_block} of {limits.name}; hint: fewer rows_per_thread or threads"
                           + (", or a smaller TileConfig.pipeline" if config.pipeline else ""))
    if path == "tiled" and not gemm_tiles:
        stages, nc_streamed, smem = 1, 0, offset * FLOAT_BYTES     # no GEMM in the kernel (e.g. IndRNN, one layer)
    if any(t.heads > 1 and not (path == "gemv" or (bulk and t.resident) or cluster) for t in gemm_tiles):
        # the tiled paths stage X with its row stride K: a head's columns only as the bulk pipeline's chunks
        return make_tiling(program, network, batch, config, limits, persistent=persistent, heads=False)
    if cluster and any(t.heads != group_heads for t in gemm_tiles):
        raise CompileError(f"TileConfig.sync='cluster' cannot run cell '{program.cell.name}': a step GEMM reads more "
                           "than its cluster's units; hint: sync='grid'")
    if config.sync == "head":
        why = head_sync(program, gemm_tiles)
        if why:
            raise CompileError(f"TileConfig.sync='head' cannot synchronise cell '{program.cell.name}' by heads: {why}; "
                               "hint: sync='grid' or 'layer'")
    tiling = shared_outputs(program, Tiling(config, units, bpl, L, B, H, k_chunk, tuple(gemm_tiles), offset, smem,
        limits, persistent, tuple(notes), path, layer0_in_kernel, stages, nc_streamed, network.num_layers, prec.name,
        warp_tile, bulk, round(l2_keep, 3), bpl // group_heads if cluster else 0, local, outputs, rs,
        producer_warps=producer))
    return stream.finish(tiling) if config.stream_wgmma else tiling
