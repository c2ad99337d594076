"""The layout of a persistent training launch (engine/autodiff/persistent.py): its items, a block's share of them and
of shared memory, and the constants the generated kernels are built around. Pure data."""
from __future__ import annotations

from dataclasses import dataclass

from .fused_codegen import kernel_params
from .fused_plan import GemmPlan, KernelPlan
from .stage_fusion import FusedStage

THREADS = 256
GEMV_MAX_ROWS = 4                  # rnn_warp_gemvs (kernels/tile_gemm.cuh) up to this many rows, rnn_rows_gemm above
ROWS_GEMM = "persistent_gemm.cuh"  # rnn_rows_gemm, for more rows than the GEMV takes
RW, CG = 8, 8                      # its task: rows x columns a warp (64 partial sums a lane)
MAX_SHARED_BYTES = 227 * 1024      # an H100's or H200's shared memory a block may opt in to


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def row_stride(k: int) -> int:
    """kernels/tile_gemm.cuh rnn_row_stride: a resident row's floats."""
    return round_up(k, 4) + 4


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
        return round_up(self.columns, 8)


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
    split: int = 1                  # head-local: blocks a head (a thread-block cluster where more than 1)

    @property
    def head_units(self) -> int:
        """Head-local: a head's units, H / heads (the head's columns of each run of K)."""
        return self.sizes[1] // self.heads

    @property
    def shared_bytes(self) -> int:
        return 4 * self.shared_floats


def params_of(layout: PersistentPlan) -> list[str]:
    """The buffer arguments of the launch, in the order render declares them (then one weight a fused stage)."""
    names = set()
    for it in layout.items:
        names |= set(kernel_params(it.kernel))
        if it.stage is not None:
            names |= {it.gemm.operand.buffer, it.gemm.out.buffer}
    return sorted(names)


def written_buffers(layout: PersistentPlan) -> set[str]:
    """The buffers the launch writes (its kernels' stores and its GEMMs' outputs): declared without const."""
    written = set()
    for it in layout.items:
        written |= {p.buffer for _, p in it.kernel.stores}
        if it.stage is not None:
            written.add(it.gemm.out.buffer)
    return written
