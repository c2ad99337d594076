"""The layer x time wavefront ("dependency diagonals").

Layer l at step t depends on layer l-1 at step t (its input) and on layer l at step t-1 (its state),
so every (l, t) with l + t = k can run together: wavefront step k. A network of L layers over T steps
takes L + T - 1 wavefront steps instead of L * T sequential ones. The grid is derived with networkx
(topological generations of the dependency DAG) so that later schedules with other dependencies
(pooling blocks, bidirectional layers) reuse the same machinery.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx


@dataclass(frozen=True)
class Wavefront:
    num_layers: int
    num_steps: int
    steps: tuple[tuple[tuple[int, int], ...], ...]   # wavefront step k -> the (layer, t) cells in it

    @property
    def depth(self) -> int:
        return len(self.steps)

    def step_of(self) -> list[list[int]]:
        """(L, T) grid of wavefront step indices, for heatmaps."""
        grid = [[-1] * self.num_steps for _ in range(self.num_layers)]
        for k, cells in enumerate(self.steps):
            for layer, t in cells:
                grid[layer][t] = k
        return grid

    @property
    def max_parallel(self) -> int:
        return max(len(c) for c in self.steps)

    def to_dict(self) -> dict:
        return {"num_layers": self.num_layers, "num_steps": self.num_steps, "depth": self.depth,
                "max_parallel": self.max_parallel, "grid": self.step_of(),
                "steps": [[list(c) for c in cells] for cells in self.steps]}


def dependency_graph(num_layers: int, num_steps: int) -> nx.DiGraph:
    g = nx.DiGraph()
    for layer in range(num_layers):
        for t in range(num_steps):
            g.add_node((layer, t))
            if layer > 0:
                g.add_edge((layer - 1, t), (layer, t))
            if t > 0:
                g.add_edge((layer, t - 1), (layer, t))
    return g


def wavefront(num_layers: int, num_steps: int) -> Wavefront:
    g = dependency_graph(num_layers, num_steps)
    steps = tuple(tuple(sorted(gen)) for gen in nx.topological_generations(g))
    return Wavefront(num_layers, num_steps, steps)
