"""Napkin math for a benchmark: FLOPs counted from the cell graph, and the floors a time is read
against.

Counting rule: a matmul of a (rows x cols) weight with a batch of B vectors is 2*rows*cols*B FLOPs;
an elementwise op is 1 FLOP per element it produces (B x its size, or just its size when it reads
no input and no state). `identity` only names a value and counts 0. Per step means one time step
of the whole network (every layer once); total is T steps.
"""
from __future__ import annotations

import networkx as nx

from ..autodiff.fused_plan import training_plan
from ..ir import SCALAR, CellGraph
from ..network import Network


def batched_nodes(cell: CellGraph) -> frozenset[str]:
    """Nodes whose value has a batch dimension: those that read the input or a state."""
    roots = [n.name for n in cell.nodes if n.op in ("input", "state")]
    batched: set[str] = set(roots)
    for root in roots:
        batched |= nx.descendants(cell.nx, root)
    return frozenset(batched)


def layer_step_flops(cell: CellGraph, input_size: int, hidden_size: int, batch: int,
                     proj_size: int | None = None) -> dict[str, int]:
    """FLOPs of one layer for one time step: {"matmul", "elementwise", "total"}."""
    size = {"I": input_size, "H": hidden_size, "P": hidden_size if proj_size is None else proj_size, SCALAR: 1}
    batched = batched_nodes(cell)
    matmul = elementwise = 0
    for node in cell.nodes:
        if node.is_leaf or node.op == "identity":
            continue
        rows = 1 if node.name not in batched else batch
        if node.op == "matmul":
            weight = cell[node.args[0]]
            matmul += 2 * size[weight.attr("rows")] * size[weight.attr("cols")] * rows
        else:
            elementwise += size[cell.dims[node.name]] * rows
    return {"matmul": matmul, "elementwise": elementwise, "total": matmul + elementwise}


def network_flops(network: Network, steps: int, batch: int) -> dict[str, int]:
    """{"per_step": every layer once, "total": per_step * steps, "matmul_per_step", "elementwise_per_step"}."""
    per_step = {"matmul": 0, "elementwise": 0, "total": 0}
    for layer in range(network.num_layers):
        counts = layer_step_flops(network.cell, network.layer_input_size(layer), network.hidden_size, batch)
        for key in per_step:
            per_step[key] += counts[key]
    return {"per_step": per_step["total"], "total": per_step["total"] * steps,
            "matmul_per_step": per_step["matmul"], "elementwise_per_step": per_step["elementwise"]}


def floors(flops_total: int, wavefront_steps: int, sgemm_tflops: float | None,
           launch_us: float | None) -> dict[str, float | None]:
    """The two lower bounds printed beside each time, in ms:

    - compute: all FLOPs at the device's measured fp32 GEMM rate (TF32 off);
    - latency: one kernel launch per wavefront step (L + T - 1) at the measured empty-launch cost.
    The larger one is the floor for this configuration.
    """
    compute = flops_total / (sgemm_tflops * 1e12) * 1e3 if sgemm_tflops else None
    latency = wavefront_steps * launch_us * 1e-3 if launch_us else None
    known = [v for v in (compute, latency) if v is not None]
    return {"compute_ms": compute, "latency_ms": latency, "floor_ms": max(known) if known else None}


def training_products(network: Network, steps: int, batch: int) -> dict[str, list[list[tuple[int, int, int]]]]:
    """The matrix products of one training step (forward and backward) as the fused training plan issues them
    (engine/autodiff/fused_plan.py), (M, N, K) each, by phase and layer: "step_forward" and "step_backward", every
    step, in launch order (M = batch; several where a step has several stages); "hoisted", once a layer (the input
    projection and the input adjoint, M = steps x batch); "gradients", once a layer (plan.grad_gemms: M = the
    operand's width, N = the gradients' rows, K = steps x batch; a bias's N is 1). A Stack's GEMM counts its whole
    grid, zero blocks included, as the engine computes it; the weight gradients skip them, as the engine does.
    benchmarks/probe_gemm_floor.py times them through cuBLAS: the floor under which no fp32 schedule of these
    products on cuBLAS goes."""
    plan = training_plan(network.cell)
    rows = steps * batch
    hoisted = list(plan.forward.hoisted) + list(plan.backward.hoisted) + ([plan.input_gemm] if plan.input_gemm else [])
    out: dict[str, list] = {"step_forward": [], "step_backward": [], "hoisted": [], "gradients": []}
    for layer in range(network.num_layers):
        sizes = network.layer_sizes(layer)
        for phase, step in (("step_forward", plan.forward), ("step_backward", plan.backward)):
            out[phase].append([(batch, g.n(sizes), g.k(sizes)) for kind, g in step.order if kind == "gemm"])
        out["hoisted"].append([(rows, g.n(sizes), g.k(sizes)) for g in hoisted])
        out["gradients"].append([(g.cols(sizes), g.rows(sizes), rows) if g.operand is not None else
                                 (g.rows(sizes), 1, rows) for g in plan.grad_gemms])
    return out


def training_product_flops(products: dict, steps: int) -> int:
    """2 M N K summed over training_products' products: the step phases' steps times."""
    return sum(2 * M * N * K * (steps if phase.startswith("step") else 1)
               for phase, layers in products.items() for layer in layers for M, N, K in layer)
