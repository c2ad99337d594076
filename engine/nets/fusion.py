"""Which blocks of a net run as one wavefront program (fuse_pools=True): runs of one-directional Layers blocks of
one cell and size, pools folded into the layer below them (kernels/pool.cuh)."""
from __future__ import annotations

from dataclasses import dataclass

from ..codegen.wavefront import check_pool_fusable
from ..compiler import compile_program
from ..errors import CompileError
from ..network import Network
from ..schedules.tiling import TileConfig
from .data import Layers, Net, Pool

FUSED_POOL_BACKENDS = ("auto", "graph", "persistent")   # the wavefront schedules' kernels can fold a pool in


@dataclass(frozen=True)
class FusedRun:
    """Blocks first..last (inclusive) of a net run as one wavefront program (fuse_pools=True): one-directional
    Layers blocks of one cell and hidden size with pools between them, and maybe one after the last."""
    first: int
    last: int
    network: Network                       # every layer of the run, stacked
    pools: dict                            # {layer of `network`: Pool}
    layers: tuple                          # (block, layer within it) of each layer of `network`

    @property
    def largest_block(self) -> int:
        """Layers of the run's largest block: the persistent schedule launches that many at a time (the blocks'
        own grouping, where one launch of every layer would stream the weights instead of keeping them on chip)."""
        return max(sum(1 for b, _ in self.layers if b == block) for block, _ in self.layers)

    def tile_config(self, backend: str):
        """The persistent schedule's TileConfig for the run: groups of the largest block keep each group's weights
        resident (DeepSpeech: 2 x 4 layers); where the block sizes do not divide the run (2 + 1 layers), or on the
        graph schedule, None: the tiling chooses, as for any network."""
        L = self.network.num_layers
        if backend != "persistent" or self.largest_block == L or L % self.largest_block:
            return None
        return TileConfig(layers_per_launch=self.largest_block)


def fused_runs(net: Net, precision: str = "float32") -> list[FusedRun]:
    """Where fuse_pools=True makes one wavefront program of several blocks: maximal runs of one-directional Layers
    blocks of the same cell, hidden size and no projection, joined by pools (folded into the layer below them,
    kernels/pool.cuh) or directly, plus a pool right after the run. Runs that would be one block with no pool are
    left out (nothing to fuse). Cells whose layer output cannot take a pool (codegen.check_pool_fusable) make none."""
    blocks, runs, k = net.blocks, [], 0

    def joinable(a, b):
        return (isinstance(b, Layers) and not b.bidirectional and b.proj_size is None and b.cell == a.cell
                and b.hidden_size == a.hidden_size)

    while k < len(blocks):
        head = blocks[k]
        if not isinstance(head, Layers) or head.bidirectional or head.proj_size is not None:
            k += 1
            continue
        try:
            program = compile_program(head.cell, layout="interleaved", precision=precision)
        except CompileError:                   # a cell the schedules cannot plan: its blocks run one by one
            k += 1
            continue
        layers, pools, last = [(k, i) for i in range(head.num_layers)], {}, k
        j = k + 1
        while j < len(blocks):
            block = blocks[j]
            if isinstance(block, Pool):
                try:
                    check_pool_fusable(program, block)
                except CompileError:
                    break
                pools[len(layers) - 1], last = block, j
                if j + 1 < len(blocks) and joinable(head, blocks[j + 1]):
                    j += 1                     # a run goes on through the pool
                    continue
                break
            if not joinable(head, block):
                break
            layers += [(j, i) for i in range(block.num_layers)]
            last, j = j, j + 1
        if last > k:
            runs.append(FusedRun(k, last, Network(head.cell, net.sizes[k], head.hidden_size, len(layers)), pools,
                                 tuple(layers)))
        k = last + 1
    return runs
