"""Pass hoist_inputs: matmuls on the layer input leave the time loop."""
from __future__ import annotations

import dataclasses

from .lowering import Lowering


def hoist_inputs(low: Lowering) -> tuple[Lowering, str]:
    """x_t does not depend on the recurrence: one GEMM over all T*B rows replaces T small ones."""
    cell = low.cell
    x = cell.input.name
    hoisted = frozenset(n.name for n in cell.nodes if n.op == "matmul" and n.args[1] == x)
    if not hoisted:
        return low, "no matmul reads the input"
    ordered = [n for n in cell.topo_order if n in hoisted]
    return dataclasses.replace(low, hoisted=hoisted), f"{len(ordered)} matmul(s) on {x}: {', '.join(ordered)}"
