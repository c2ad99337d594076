"""Pass prune_dead: drop computed values that no next state depends on."""
from __future__ import annotations

import dataclasses

from .lowering import Lowering


def prune_dead(low: Lowering) -> tuple[Lowering, str]:
    """Values no next state depends on cost launches and bytes and change nothing."""
    cell = low.cell
    live = cell.live_nodes
    dead = [n.name for n in cell.nodes if not n.is_leaf and n.name not in live]
    if not dead:
        return low, "nothing to prune"
    # Leaves stay (an unused parameter is harmless and the input and states must exist).
    nodes = tuple(n for n in cell.nodes if n.is_leaf or n.name in live)
    return dataclasses.replace(low, cell=cell.replace(nodes=nodes)), f"removed {len(dead)}: {', '.join(dead)}"
