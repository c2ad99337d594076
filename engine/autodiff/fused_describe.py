"""describe(plan): the fused training step's plan as text (explain() shows it): the launches of a forward and of a
backward step, the input adjoint's and the gradients' GEMMs, the stacks, the fused stages and the buffers."""
from __future__ import annotations

from .fused_plan import StepPlan, TrainingPlan
from .stage_fusion import describe as describe_stages


def describe(plan: TrainingPlan) -> str:
    """Readable text: the launches of a forward and of a backward step, and the buffers."""
    def items(step: StepPlan) -> list[str]:
        lines = [f"    (once a layer) GEMM {g.name}: {', '.join(g.members)}" for g in step.hoisted]
        for kind, item in step.order:
            if kind == "gemm":
                lines.append(f"    GEMM {item.name}: {', '.join(item.members)}{' (+=)' if item.accumulate else ''}")
            else:
                lines.append(f"    kernel {item.name}: {', '.join(s.var for s in item.statements) or 'copies'}")
        return lines
    f, b = plan.launches_per_step
    inputs = ([f"  input adjoint: GEMM {plan.input_gemm.name}: {', '.join(plan.input_gemm.members)} (a chunk of steps "
               "at a time in the layers' wavefront; else with the weight gradients)"] if plan.input_gemm else
              ["  input adjoint: with the weight gradients (not one GEMM: the backward runs layer by layer)"])
    grads = [f"  gradients: GEMM {g.name} over every step: {', '.join(g.params)}" for g in plan.grad_gemms]
    if plan.column_dots:
        grads.append(f"  gradients: one column_dots launch over every step: {', '.join(c.param for c in plan.column_dots)}")
    stacks = []
    for st in plan.stacks:
        zeros = sum(1 for w in st.weights if not w)
        stacks.append(f"  stack: states {', '.join(st.states)} side by side (K = {st.k}); sums {', '.join(st.roots)} "
                      f"one GEMM each way, a grid of {len(st.roots)} x {len(st.states)} weight blocks, {zeros} zero")
    return "\n".join([f"fused training step of cell '{plan.cell.name}': {f} launches forward, {b} backward a step",
                      *stacks, "  forward:", *items(plan.forward), "  backward:", *items(plan.backward), *inputs,
                      *grads,
                      *describe_stages(plan),
                      "  buffers: " + ", ".join(f"{b.name} ({b.blocks} x B, {b.cols.c_expr()})"
                                                for b in plan.buffers)])
