"""The FLOP counting rule, in one place: the Plan's cost model (engine/plan.py) and the benchmark's napkin math
(engine/bench/flops.py) both count with it.

- a matmul of a (rows x cols) weight with a batch of B vectors is 2 * rows * cols * B FLOPs;
- an elementwise op is OpDef.flops FLOPs per element it produces (1; `identity` only names a value: 0);
  a sum of n terms (a backward step's adjoint) n - 1;
- a statement of a fused kernel costs at least 1 per element, even where its op counts 0 (a copy still
  issues an instruction);
- on a cell graph, a value that reads no input and no state has no batch dimension: it counts once, not B
  times.

Per step means one time step of the whole network (every layer once); total is T steps.

May import: engine.ir, engine.ops, engine.network (and networkx).
"""
from __future__ import annotations

import networkx as nx

from .ir import SCALAR, CellGraph
from .network import Network
from .ops import GRAD_OPS, OPS


def matmul_flops(rows: int, cols: int, batch: int) -> int:
    """A (rows x cols) weight applied to `batch` vectors (or a GEMM (batch, cols) x (cols, rows))."""
    return 2 * rows * cols * batch


def op_flops(op: str, num_args: int) -> int:
    """FLOPs per element of one elementwise op with `num_args` arguments; 0 for an op outside the tables."""
    if op == "sum":
        return num_args - 1
    definition = OPS.get(op) or GRAD_OPS.get(op)
    return definition.flops if definition is not None else 0


def statement_flops(op: str, num_args: int) -> int:
    """FLOPs per element of one statement of a fused kernel: at least one."""
    return max(op_flops(op, num_args), 1)


def batched_nodes(cell: CellGraph) -> frozenset[str]:
    """Nodes whose value has a batch dimension: those that read the input or a state."""
    roots = [n.name for n in cell.nodes if n.op in ("input", "state")]
    batched: set[str] = set(roots)
    for root in roots:
        batched |= nx.descendants(cell.nx, root)
    return frozenset(batched)


def cell_step_flops(cell: CellGraph, sizes: dict[str, int], batch: int) -> dict[str, int]:
    """FLOPs of one step of `cell` for sizes {"I", "H", "P"}: {"matmul", "elementwise", "total"}."""
    size = {**sizes, SCALAR: 1}
    batched = batched_nodes(cell)
    matmul = elementwise = 0
    for node in cell.nodes:
        if node.is_leaf:
            continue
        rows = batch if node.name in batched else 1
        if node.op == "matmul":
            weight = cell[node.args[0]]
            matmul += matmul_flops(size[weight.attr("rows")], size[weight.attr("cols")], rows)
        else:
            elementwise += op_flops(node.op, len(node.args)) * size[cell.dims[node.name]] * rows
    return {"matmul": matmul, "elementwise": elementwise, "total": matmul + elementwise}


def layer_step_flops(cell: CellGraph, input_size: int, hidden_size: int, batch: int,
                     proj_size: int | None = None) -> dict[str, int]:
    """FLOPs of one layer for one time step: {"matmul", "elementwise", "total"}."""
    sizes = {"I": input_size, "H": hidden_size, "P": hidden_size if proj_size is None else proj_size}
    return cell_step_flops(cell, sizes, batch)


def network_flops(network: Network, steps: int, batch: int) -> dict[str, int]:
    """{"per_step": every layer once, "total": per_step * steps, "matmul_per_step", "elementwise_per_step"}."""
    per_step = {"matmul": 0, "elementwise": 0, "total": 0}
    for layer in range(network.num_layers):
        counts = layer_step_flops(network.cell, network.layer_input_size(layer), network.hidden_size, batch)
        for key in per_step:
            per_step[key] += counts[key]
    return {"per_step": per_step["total"], "total": per_step["total"] * steps,
            "matmul_per_step": per_step["matmul"], "elementwise_per_step": per_step["elementwise"]}
