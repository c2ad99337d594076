"""Pass wavefront: run the layers as a wavefront over (layer, step) diagonals, on one stream per layer."""
from __future__ import annotations

import dataclasses

from .lowering import Lowering


def schedule_wavefront(low: Lowering) -> tuple[Lowering, str]:
    """Layer l step t needs only layer l-1 step t and layer l step t-1: layers overlap along diagonals."""
    return dataclasses.replace(low, schedule="wavefront"), ("layers overlap: layer l runs a chunk of steps "
                                                             "behind layer l-1, on its own stream")


def layer_by_layer(low: Lowering) -> tuple[Lowering, str]:
    return dataclasses.replace(low, schedule="layers"), "each layer runs the whole sequence before the next"
