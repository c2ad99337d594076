"""Pass fuse_elementwise: each region of elementwise ops between two GEMM stages becomes one kernel.

Kernel stage k runs after the GEMMs of stage k (stage 0: before any GEMM of the step). Each computed
value is placed as late as possible: in the kernel stage just before the first GEMM that reads it,
else in the stage of its first consumer, else (a next state) in the last stage. A value's earliest
stage never exceeds that, so every value lands between its inputs and its users, and a kernel stage
exists only where a GEMM needs an elementwise operand or the step must end. Within a stage, values
of the same size (B, H) or (B, I) share one kernel; intermediates stay in registers, and only what a
GEMM, a later kernel or the next step needs is written out.

Values that are not computed but must be copied into place (x_t into a per-step GEMM's operands
when hoisting is off, a GEMM block that is itself a next state) are copied by the kernel of the
stage that needs them.
"""
from __future__ import annotations

import dataclasses

from ..c_names import c_identifier, kernel_prefix
from .analysis import Value, consumers, num_stages, state_next_values, step_graph, value_stages
from .lowering import Lowering, Region


def fuse_elementwise(low: Lowering) -> tuple[Lowering, str]:
    """Each region of elementwise ops between GEMMs is one kernel; intermediates stay in registers."""
    placement, passthrough, values = place_values(low)
    groups: dict[tuple[int, str], list[str]] = {}
    copies: dict[tuple[int, str], list[str]] = {}
    for name, stage in placement.items():
        groups.setdefault((stage, values[name].dim), []).append(name)
    for name, stage in passthrough:
        copies.setdefault((stage, values[name].dim), []).append(name)
    keys = sorted(set(groups) | set(copies))
    stages_with_dims: dict[int, int] = {}
    for stage, _ in keys:
        stages_with_dims[stage] = stages_with_dims.get(stage, 0) + 1
    prefix = kernel_prefix(low.cell.name)
    regions = []
    for stage, dim in keys:
        suffix = f"_{dim}" if stages_with_dims[stage] > 1 else ""
        regions.append(Region(f"{prefix}_stage{stage}{suffix}", stage, dim, tuple(groups.get((stage, dim), ())),
                              tuple(dict.fromkeys(copies.get((stage, dim), ())))))
    summary = "; ".join(f"{r.name}: {len(r.values)} value(s)" + (f" + {len(r.passthrough)} copy" if r.passthrough
                                                                  else "") for r in regions)
    return dataclasses.replace(low, regions=tuple(regions)), summary or "no elementwise work"


def one_kernel_per_op(low: Lowering) -> tuple[Lowering, str]:
    placement, passthrough, values = place_values(low)
    prefix = kernel_prefix(low.cell.name)
    regions = []
    copies: dict[tuple[int, str], list[str]] = {}
    for name, stage in passthrough:
        copies.setdefault((stage, values[name].dim), []).append(name)
    for (stage, dim), names in sorted(copies.items()):
        regions.append(Region(f"{prefix}_copy{stage}_{dim}", stage, dim, (), tuple(dict.fromkeys(names))))
    for name, stage in placement.items():            # placement is in evaluation order
        taken = {r.name for r in regions}
        regions.append(Region(c_identifier(f"{prefix}_{name}", taken), stage, values[name].dim, (name,)))
    regions.sort(key=lambda r: r.stage)             # stable: evaluation order within a stage
    return dataclasses.replace(low, regions=tuple(regions)), f"{len(regions)} kernel(s), one per op"


def place_values(low: Lowering) -> tuple[dict[str, int], list[tuple[str, int]], dict[str, Value]]:
    """(stage of every computed value, [(value, stage)] copies, the step graph)."""
    values = step_graph(low)
    earliest = value_stages(low, values)
    last = num_stages(low)
    users = consumers(values)
    operand_of = gemm_operands(low)
    next_of = state_next_values(low)
    computed = [v.name for v in values.values() if v.computed and not v.uniform]
    placement: dict[str, int] = {}
    for name in reversed(computed):
        deadlines = [placement[c] for c in users[name] if c in placement]
        deadlines += [g.stage - 1 for g in operand_of.get(name, ())]
        if name in next_of or not deadlines:
            deadlines.append(last)
        stage = min(deadlines)
        if stage < earliest[name]:
            raise AssertionError(f"value '{name}' placed at stage {stage} before it is known ({earliest[name]})")
        placement[name] = stage
    placement = {name: placement[name] for name in computed}
    passthrough: list[tuple[str, int]] = []
    homes = native_homes(low)
    for name, gemms in operand_of.items():
        if values[name].computed:
            continue
        for g in gemms:
            if homes.get(name) != g.name:
                passthrough.append((name, g.stage - 1))
    for name in next_of:
        if not values[name].computed:
            passthrough.append((name, last))
    return placement, passthrough, values


def gemm_operands(low: Lowering) -> dict[str, list]:
    """value -> the per-step GEMMs that read it (hoisted GEMMs read the layer input directly)."""
    out: dict[str, list] = {}
    for g in low.gemms:
        if g.hoisted:
            continue
        for op in g.operands:
            out.setdefault(op.name, []).append(g)
    return out


def native_homes(low: Lowering) -> dict[str, str]:
    """state -> the stage-1 GEMM whose operand buffer holds it (no copy needed before that GEMM)."""
    homes: dict[str, str] = {}
    states = set(low.cell.state_names)
    for g in low.gemms:
        if g.stage != 1:
            continue
        for op in g.operands:
            if op.name in states and op.name not in homes:
                homes[op.name] = g.name
    return homes
