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

from dataclasses import dataclass, field

from ..errors import CompileError
from ..network import Network
from ..plan import Program

FLOAT_BYTES = 4
SCRATCH_BUDGET_BYTES = 48 * 1024       # staging of X (and W when not resident) per K chunk


@dataclass(frozen=True)
class DeviceLimits:
    multiprocessors: int
    smem_per_block: int                # bytes a block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin)
    name: str = "GPU"
    arch: str = ""

    @staticmethod
    def current() -> "DeviceLimits":
        import cupy
        dev = cupy.cuda.Device()
        attrs = dev.attributes
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return DeviceLimits(attrs["MultiProcessorCount"], attrs["MaxSharedMemoryPerBlockOptin"], name,
                            f"sm_{dev.compute_capability}")


# An H100 SXM, for tests and for explain() on machines without a GPU.
H100 = DeviceLimits(multiprocessors=132, smem_per_block=232448, name="NVIDIA H100 (nominal)", arch="sm_90")


@dataclass(frozen=True)
class TileConfig:
    """The knobs the autotuner turns. units_per_block=None: as many blocks as the GPU has SMs."""

    units_per_block: int | None = None
    rows_per_thread: int = 4           # RB: batch rows of a thread's accumulator tile
    cols_per_thread: int = 4           # RC: GEMM columns of a thread's accumulator tile
    threads: int = 256
    resident: bool = True              # keep weight slices in shared memory when they fit (persistent only)

    def label(self) -> str:
        units = "auto" if self.units_per_block is None else str(self.units_per_block)
        return (f"units={units} tile={self.rows_per_thread}x{self.cols_per_thread} threads={self.threads}"
                + ("" if self.resident else " streamed"))


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


@dataclass(frozen=True)
class Tiling:
    config: TileConfig
    units_per_block: int
    blocks_per_layer: int
    num_layers: int
    batch: int
    hidden: int
    k_chunk: int                       # K columns staged per chunk
    gemms: tuple[GemmTile, ...]
    scratch_offset: int                # floats: where the staging area starts
    smem_bytes: int
    limits: DeviceLimits
    persistent: bool                   # one cooperative launch (weights may be resident) or one launch per stage
    notes: tuple[str, ...] = field(default=())

    @property
    def blocks(self) -> int:
        return self.blocks_per_layer * self.num_layers

    @property
    def resident(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.gemms if g.resident)

    def describe(self) -> str:
        res = ", ".join(self.resident) or "none"
        return (f"{self.blocks} blocks ({self.blocks_per_layer} per layer x {self.num_layers} layers), "
                f"{self.units_per_block} hidden units per block, {self.config.threads} threads, "
                f"{self.config.rows_per_thread}x{self.config.cols_per_thread} accumulators per thread, "
                f"K chunk {self.k_chunk}, {self.smem_bytes / 1024:.1f} KiB shared memory per block, "
                f"weights resident in shared memory: {res}")


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def eligibility(program: Program) -> str | None:
    """Why the wavefront schedules cannot run this program, or None when they can."""
    if program.layout != "interleaved":
        return "the wavefront schedules need the interleaved weight layout (compile with layout='interleaved')"
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


def make_tiling(program: Program, network: Network, batch: int, config: TileConfig | None = None,
                limits: DeviceLimits = H100, *, persistent: bool = True) -> Tiling:
    """Partition the hidden units of every layer into blocks and lay out shared memory."""
    config = config or TileConfig()
    why = eligibility(program)
    if why:
        raise CompileError(f"cell '{program.cell.name}': {why}")
    for field_name, value in (("rows_per_thread", config.rows_per_thread), ("cols_per_thread", config.cols_per_thread)):
        if value not in (1, 2, 4, 8):
            raise CompileError(f"TileConfig.{field_name}={value!r}: use 1, 2, 4 or 8")
    if config.threads not in (64, 128, 256, 512):
        raise CompileError(f"TileConfig.threads={config.threads!r}: use 64, 128, 256 or 512")
    L, H, B = network.num_layers, network.hidden_size, batch
    if config.units_per_block is None:
        per_layer = max(1, limits.multiprocessors // L)
        units = -(-H // per_layer)
    else:
        if not isinstance(config.units_per_block, int) or config.units_per_block < 1:
            raise CompileError(f"TileConfig.units_per_block={config.units_per_block!r}: give a positive integer")
        units = min(config.units_per_block, H)
    bpl = -(-H // units)
    notes = []
    if persistent and bpl * L > limits.multiprocessors:
        raise CompileError(f"{bpl * L} blocks ({bpl} per layer x {L} layers) exceed the "
                           f"{limits.multiprocessors} multiprocessors of {limits.name}: a persistent kernel "
                           "needs every block resident at once; hint: raise units_per_block")
    RB, RC = config.rows_per_thread, config.cols_per_thread
    bp = round_up(B, RB)

    tiles = []
    for g in program.gemms:
        if g.hoisted and L == 1:
            continue                                 # layer 0 projects with cuBLAS before the kernel
        layers = range(1, L) if g.hoisted else range(L)
        k_max = max(g.k(network.layer_sizes(layer)) for layer in layers)
        tiles.append((g, k_max))
    nc_max = max((round_up(len(g.terms) * units, RC) for g, _ in tiles), default=RC)
    k_all = max((k for _, k in tiles), default=1)
    # The K chunk: as much of K as fits the staging budget, a multiple of 8.
    per_k = (bp + nc_max) * FLOAT_BYTES
    k_chunk = max(8, min(round_up(k_all, 8), (SCRATCH_BUDGET_BYTES // per_k) // 8 * 8))
    scratch = k_chunk * (bp + nc_max) + config.threads * RB * RC
    budget = limits.smem_per_block // FLOAT_BYTES - scratch

    gemm_tiles, offset = [], 0
    # Recurrent GEMMs first: they are read every step by every layer; the projections of layers > 0 next.
    for g, k_max in sorted(tiles, key=lambda item: item[0].hoisted):
        floats = k_max * round_up(len(g.terms) * units, RC)
        resident = persistent and config.resident and floats <= budget - offset
        if persistent and config.resident and not resident:
            notes.append(f"{g.name}: {floats * FLOAT_BYTES / 1024:.0f} KiB per block does not fit in shared "
                         "memory beside the others; streamed from L2 every step")
        gemm_tiles.append(GemmTile(g.name, len(g.terms), g.hoisted, k_max, resident,
                                   offset if resident else 0, floats if resident else 0))
        if resident:
            offset += floats
    smem = (offset + scratch) * FLOAT_BYTES
    if smem > limits.smem_per_block:
        raise CompileError(f"the tiling needs {smem} bytes of shared memory per block, more than the "
                           f"{limits.smem_per_block} of {limits.name}; hint: fewer rows_per_thread or threads")
    return Tiling(config, units, bpl, L, B, H, k_chunk, tuple(gemm_tiles), offset, smem, limits, persistent,
                  tuple(notes))
