"""Pass fold_constants: ops whose arguments are all numbers become numbers."""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..ir import make_node
from ..ops import apply_elementwise
from .lowering import Lowering


def fold_constants(low: Lowering) -> tuple[Lowering, str]:
    """Ops on numbers alone are computed once at compile time, not in every thread at every step."""
    cell = low.cell
    value: dict[str, float] = {n.name: float(n.attr("value")) for n in cell.nodes if n.op == "const"}
    replaced: dict[str, object] = {}
    for name in cell.topo_order:
        node = cell[name]
        if node.is_leaf or node.op == "matmul" or not all(a in value for a in node.args):
            continue
        with np.errstate(all="ignore"):
            result = float(apply_elementwise(node.op, [np.float64(value[a]) for a in node.args], node.attr_dict))
        if not math.isfinite(result):
            continue          # leave it to run time, where it behaves exactly as the reference
        value[name] = result
        replaced[name] = make_node(name, "const", value=result)
    if not replaced:
        return low, "no constant expressions"
    nodes = tuple(replaced.get(n.name, n) for n in cell.nodes)
    summary = "folded " + ", ".join(f"{k} = {value[k]:g}" for k in replaced)
    return dataclasses.replace(low, cell=cell.replace(nodes=nodes)), summary
