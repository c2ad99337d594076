"""The order the fused training step issues a network's layers in as a wavefront (engine/autodiff/fused_program.py):
chunks of steps, a stream a layer, layer l's chunk c after layer l-1's (forward) or l+1's (backward), and the cut of
that order into graphs of whole diagonals.
"""
from __future__ import annotations


def wavefront_order(layers: int, chunks: int) -> list[tuple[int, int]]:
    """(layer, chunk) pairs diagonal by diagonal: every (l - 1, c) comes before (l, c), and (l, c - 1) before (l, c)."""
    return [(l, d - l) for d in range(layers + chunks - 1) for l in range(layers) if 0 <= d - l < chunks]


def forward_wavefront(layers: int, chunks: int) -> list[tuple[int, int, tuple[int, int] | None]]:
    """(layer, chunk, the chunk it waits for) in issue order: layer l's chunk c after layer l-1's chunk c."""
    return [(l, c, (l - 1, c) if l else None) for l, c in wavefront_order(layers, chunks)]


def backward_wavefront(layers: int, chunks: int) -> list[tuple[int, int, tuple[int, int] | None]]:
    """The same, reversed: the top layer first, the last chunk first; layer l's chunk c after layer l+1's chunk c
    (whose input adjoint is layer l's d_out of those steps)."""
    top, last = layers - 1, chunks - 1
    return [(top - w, last - k, (top - w + 1, last - k) if w else None) for w, k in wavefront_order(layers, chunks)]


def diagonal_pieces(items: list, layers: int, chunks: int) -> list[list]:
    """A wavefront's items (in wavefront_order's order) cut into pieces of whole diagonals: 1, 2, 4, 8, ... diagonals
    each. Each piece is a graph of its own, launched in order: the GPU starts on the first (one chunk) while the host
    still launches the rest (one graph of every layer and step cost ~2 ms of host time to launch, with the GPU idle)."""
    diagonals = [l + c for l, c in wavefront_order(layers, chunks)]
    pieces: list[list] = [[]]
    bound, width = 1, 1
    for d, item in zip(diagonals, items):
        if d >= bound:
            pieces.append([])
            width *= 2
            bound += width
        pieces[-1].append(item)
    return pieces
