"""Heads in the persistent schedule: which step GEMMs read one head of h (a block whose units lie in one head then
multiplies only that head's columns: gemm_heads), and whether a head's blocks need wait for no other block
(TileConfig(sync="head"): head_sync). engine/schedules/tiling.py asks both."""
from __future__ import annotations

from ..plan import Program


def gemm_heads(program: Program, gemm) -> int:
    """k where every matmul of an in-step GEMM multiplies its one H-sized operand by the dense form of a weight of k
    heads (attr `diagonal`, engine/dense.py: H x H, zero off its k diagonal blocks), else 1. Unit u's rows of such a
    GEMM are zero outside columns [hd K / k, (hd + 1) K / k), hd = u // (H / k): a block whose units lie in one
    head multiplies only those columns, and its sum is the same (the skipped products are exact zeros)."""
    if gemm.hoisted or len(gemm.operands) != 1 or gemm.operands[0].dim != "H":
        return 1
    cell = program.cell
    weights = {cell[m].args[0] for term in gemm.terms for m in term.matmuls}
    ks = {cell[w].attr("diagonal", 1) for w in weights}
    if len(ks) != 1 or any(term.dim != "H" for term in gemm.terms):
        return 1
    if any(cell[w].attr("rows") != "H" or cell[w].attr("cols") != "H" for w in weights):
        return 1
    return ks.pop()


def head_sync(program: Program, gemm_tiles) -> str | None:
    """Why the blocks of one head cannot wait for each other only (TileConfig(sync="head")), or None when they can:
    every in-step GEMM reads one head (gemm_heads, taken by the tiling), all with the same heads, and no reduction
    over H joins the heads. Then a unit's step reads only its own head's values of the step before (the elementwise
    math reads its own unit; the layer below, read whole, is waited for head by head)."""
    if program.reductions:
        return f"its reduction(s) over H ({', '.join(sorted(program.reductions))}) read every head"
    step = [g for g in gemm_tiles if not g.hoisted]
    if not step:
        return "it has no recurrent GEMM with heads"
    plain = [g.name for g in step if g.heads == 1]
    if plain:
        return (f"GEMM(s) {', '.join(plain)} read all of h (a weight without heads, or a tiling that multiplies the "
                "whole block-diagonal matrix)")
    if len({g.heads for g in step}) > 1:
        return "its GEMMs have different numbers of heads"
    return None
