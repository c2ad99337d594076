"""Napkin math for a benchmark: FLOPs counted from the cell graph, and the floors a time is read
against.

The counts are engine/flops.py's (layer_step_flops, network_flops: the rule the Plan's cost model uses
too); here are the floors a time is read against and the products of a training step.
"""
from __future__ import annotations

from ..autodiff.fused_planner import training_plan
from ..network import Network


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
