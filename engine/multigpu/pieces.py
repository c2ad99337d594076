"""What each GPU runs of a pipeline plan: its pieces (layers of a block, or a pool), and whether they join into one
wavefront program with the pools folded in (fuse_pools)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..nets.data import Layers, Net, Pool
from ..nets.fusion import fused_runs
from .plan import PipelinePlan


@dataclass(frozen=True)
class Piece:
    """What one GPU runs of one block: layers [first, last) of a Layers block, or a whole Pool block."""

    block: int
    first: int = 0
    last: int = 0

    def is_pool(self, net: Net) -> bool:
        return isinstance(net.blocks[self.block], Pool)


def pieces_of(plan: PipelinePlan) -> list[list[Piece]]:
    """Each GPU's pieces, in order. A pool goes with the GPU that produces its input (it hands over the pooled,
    smaller sequence); a pool before any layer goes with the first GPU."""
    net = plan.net
    owner = {}                                   # (block, layer) -> GPU
    for g, run in enumerate(plan.split):
        for u in run:
            owner[(plan.units[u].block, plan.units[u].layer)] = g
    out: list[list[Piece]] = [[] for _ in plan.split]
    last_gpu = 0
    for k, block in enumerate(net.blocks):
        if isinstance(block, Pool):
            out[last_gpu].append(Piece(k))
            continue
        layer = 0
        while layer < block.num_layers:
            g = owner[(k, layer)]
            end = layer
            while end < block.num_layers and owner[(k, end)] == g:
                end += 1
            out[g].append(Piece(k, layer, end))
            last_gpu, layer = g, end
    return out



def gpu_fused_runs(plan: PipelinePlan, precision: str = "float32") -> tuple[dict, dict]:
    """({GPU: (FusedRun, [(block, layer) of the net for each layer of the run])}, {GPU: why not}) for
    PipelineProgram(fuse_pools=True): a GPU whose pieces (layers of blocks of one cell and size, pools between or
    after them) make one wavefront program (nets.fusion.fused_runs over the GPU's pieces as a net of their own) runs
    each chunk as that one program, pools folded in: one run for the host to issue instead of one per piece. A GPU
    with one piece and no pool has nothing to fuse; a net whose length is not a multiple of its pools' strides would
    leave a tail chunk a pool cannot take whole, so no GPU fuses."""
    net = plan.net
    stride = math.prod(b.stride for b in net.blocks if isinstance(b, Pool))
    fused, why = {}, {}
    for g, pieces in enumerate(pieces_of(plan)):
        if plan.steps % stride:
            why[g] = (f"T={plan.steps} is not a multiple of the pools' stride {stride}: the last chunk would end inside "
                      "a pool window")
            continue
        if len(pieces) < 2:
            why[g] = "one piece: nothing to fuse"
            continue
        blocks, origin = [], []
        for piece in pieces:
            block = net.blocks[piece.block]
            if piece.is_pool(net):
                blocks.append(block)
                origin.append(None)
            else:
                blocks.append(Layers(block.cell, block.hidden_size, piece.last - piece.first, block.direction,
                                     block.merge, block.proj_size, name=f"{block.label}[{piece.first}:{piece.last}]"))
                origin.append(piece)
        first = pieces[0]
        size = (net.sizes[first.block] if first.is_pool(net)
                else net.blocks[first.block].layer_input_size(first.first, net.sizes[first.block]))
        runs = fused_runs(Net(size, tuple(blocks), name=f"{net.name}@GPU{g}"), precision)
        if len(runs) != 1 or runs[0].first != 0 or runs[0].last != len(blocks) - 1:
            why[g] = "its pieces are not one run of blocks of one cell and size (engine.nets.fusion.fused_runs)"
            continue
        run = runs[0]
        layers = [(origin[b].block, origin[b].first + i) for b, i in run.layers]
        fused[g] = (run, layers)
    return fused, why
