"""lengths= on the fused training step (issue #35): the TrainingPlan whose kernels hold the rows past their end.

A batch padded at the end runs sequence b for its own lengths[b] steps (engine/backends/lengths.py): a step past the
end is the identity on the states, its output is 0, and the loss's gradient there is ignored. The training step runs
every row of every step (the GEMMs take every row, the fused and persistent launches every thread), so at a step
t >= lengths[b] each store of row b writes, instead of what it computed (KernelPlan.past_end, a select on `within`
in the generated code, engine/autodiff/fused_codegen.py):
- forward, into a state's block t + 1: the state's block t (the state entering the step), so the final state is the
  sequence's own last one; anything else as computed (values the backward then ignores: see below);
- backward, into a state adjoint's block t: its block t + 1 (the adjoint passes through the identity);
- backward, anything else: 0. Every dy, every value the after part reads and every operand of the step's GEMMs is 0
  on that row, so the step adds nothing to any parameter's gradient nor to the input's adjoint, and the GEMMs add
  nothing to the state adjoints they write.
A backward GEMM that writes a state adjoint alone (the LSTM's d_h = W^T dy) would overwrite the passed adjoint with
0: here it adds to its output instead (beta = 1), and a kernel before it writes 0 there first, held on the rows past
their end (no launch more: the step's last kernel of that size takes the store). The outputs past the end and the loss's gradient there are masked on the host
(engine/autodiff/fused_tape.py).

A cell whose after part reads a state adjoint's rows (a gradient taken from the adjoint itself, where this plan
holds the passed value instead of the 0 the step contributes) is refused by name: backend='naive' trains it.
"""
from __future__ import annotations

import dataclasses

from ..c_names import kernel_prefix
from ..errors import BackendError
from ..plan import Lin
from .fused_plan import DIMS, KernelPlan, Place, StepPlan, TrainingPlan

ZERO = Place("literal", literal=0.0)


def with_lengths(plan: TrainingPlan) -> TrainingPlan:
    """The plan whose kernels hold the rows past their sequence's end (the module's docstring)."""
    states = {p.buffer for p in plan.state_places.values()}
    adjoints = {p.buffer for p in plan.adjoint_places.values()}
    _check_after_part(plan, adjoints)
    forward = StepPlan(tuple((kind, _held(item, states, 1, None) if kind == "kernel" else item)
                             for kind, item in plan.forward.order), plan.forward.hoisted)
    backward = _accumulating(plan, adjoints)
    backward = StepPlan(tuple((kind, _held(item, adjoints, 0, ZERO) if kind == "kernel" else item)
                              for kind, item in backward.order), backward.hoisted)
    return dataclasses.replace(plan, forward=forward, backward=backward, lengths=True)


def _check_after_part(plan: TrainingPlan, adjoints: set) -> None:
    read = [(name, plan.back_places.get(name)) for name in plan.split.recorded]
    read += [(g.name, g.dy) for g in plan.grad_gemms] + [(d.param, d.a) for d in plan.column_dots]
    read += [(d.param, d.b) for d in plan.column_dots]
    read += [(plan.input_gemm.name, plan.input_gemm.operand)] if plan.input_gemm else []
    for name, place in read:
        if place is not None and place.kind == "row" and place.buffer in adjoints:
            raise BackendError(f"cell '{plan.cell.name}': the fused training step's gradients read {name} from a "
                               "state's adjoint, which lengths= holds past a sequence's end; hint: "
                               "bptt(backend='naive') or 'reference' trains it with lengths")


def _held(kernel: KernelPlan, buffers: set, shift: int, otherwise: Place | None) -> KernelPlan:
    """The kernel with past_end set: a store into `buffers` at `shift` writes the same place's block t + 1 - 2 * shift
    (the state entering the step, forward; the adjoint entering it, backward) past the row's end; any other store
    writes `otherwise` (None: the value itself)."""
    loads = list(kernel.loads)
    taken = {v for v, _ in loads} | {st.var for st in kernel.statements} | {v for v, _ in kernel.stores}

    def loaded(place: Place, name: str) -> str:
        found = next((value for value, at in loads if at == place), None)
        if found is None:
            found = name
            while found in taken:
                found += "_v"
            taken.add(found)
            loads.append((found, place))
        return found

    past_end = []
    for value, place in kernel.stores:
        if place.kind == "row" and place.buffer in buffers and place.shift == shift:
            held = dataclasses.replace(place, shift=1 - shift)
            past_end.append(loaded(held, f"{value}_held"))
        else:
            past_end.append(None if otherwise is None else loaded(otherwise, "held_zero"))
    return dataclasses.replace(kernel, loads=tuple(loads), past_end=tuple(past_end))


def _accumulating(plan: TrainingPlan, adjoints: set) -> StepPlan:
    """The backward where every state adjoint's block t is written by a kernel (so that it can hold past the row's
    end): a step GEMM that writes one alone adds to it instead, after a kernel writes 0 there; an adjoint no step
    writes (a state the step does not read: its adjoint is 0 within the sequence) gets a 0 from a kernel of the step
    too. The last kernel of the block's size before the GEMM (or in the step) takes the store, else a new kernel
    before the GEMM's stage's GEMMs (or at the step's end): no launch more where the step has a kernel of that size."""
    order = list(plan.backward.order)
    written = {(place.buffer, place.offset) for _, kernel in order if isinstance(kernel, KernelPlan)
               for _, place in kernel.stores if place.kind == "row" and place.shift == 0}
    zeros: list[tuple[object, Place, str]] = []       # (the GEMM it goes before or None, place, dim) of each 0
    for g in [item for kind, item in order if kind == "gemm"]:
        if g.hoisted or g.out.kind != "row" or g.out.buffer not in adjoints:
            continue
        accumulating = dataclasses.replace(g, accumulate=True)
        offset = g.out.offset
        for block in g.out_blocks:
            dim = next(d for d in DIMS if Lin.of(d) == block)
            if not g.accumulate:
                zeros.append((accumulating, dataclasses.replace(g.out, offset=offset), dim))
            written.add((g.out.buffer, offset))
            offset = offset + block
        order[order.index(("gemm", g))] = ("gemm", accumulating)
    for state, place in plan.adjoint_places.items():
        if (place.buffer, place.offset) not in written:
            zeros.append((None, place, plan.cell.state_dim(state)))
    for gemm, place, dim in zeros:
        before = order.index(("gemm", gemm)) if gemm is not None else len(order)
        where = next((i for i in range(before - 1, -1, -1) if order[i][0] == "kernel" and order[i][1].dim == dim),
                     None)
        if where is None:             # a kernel of its own
            stage = gemm.stage if gemm is not None else max([item.stage for _, item in order] + [0])
            if gemm is not None:
                before = next(i for i, (kind, item) in enumerate(order) if kind == "gemm" and item.stage == stage)
            where = before
            order.insert(where, ("kernel", KernelPlan(f"{kernel_prefix(plan.cell.name)}_bwd_s{stage}_{dim}_held",
                                                      stage, dim, (), (), ())))
        kernel = order[where][1]
        zero = next((value for value, at in kernel.loads if at == ZERO), None)
        loads = kernel.loads
        if zero is None:
            zero = "held_zero"
            while zero in {v for v, _ in loads} | {st.var for st in kernel.statements}:
                zero += "_v"
            loads = loads + ((zero, ZERO),)
        order[where] = ("kernel", dataclasses.replace(kernel, loads=loads, stores=kernel.stores + ((zero, place),)))
    return StepPlan(tuple(order), plan.backward.hoisted)
