"""The planner of the fused training step: training_plan(cell) -> TrainingPlan (engine/autodiff/fused_plan.py, whose
docstring says what the plan holds). Planner makes the forward step here (its stacks, stages, GEMMs and kernels, and
where every value lives); fused_planner_backward.py the backward step and the after part, from the forward's places.
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache

from ..backends.common import check_training_precision
from ..c_names import c_identifier, kernel_prefix
from ..dense import dense_form
from ..ir import SCALAR, CellGraph
from ..ops import OPS
from ..plan import Lin
from .errors import AutodiffError
from .fused_lengths import with_lengths
from .fused_plan import (
    DIMS,
    INPUT_BUFFER,
    OUTPUT_BUFFER,
    Buffer,
    GemmPlan,
    KernelPlan,
    Place,
    Stack,
    Statement,
    StepPlan,
    TrainingPlan,
    adjoint_buffer,
    state_buffer,
)
from .fused_planner_backward import BackwardPlanner
from .hoist import BackwardSplit, derived

MAX_ZERO_SHARE = 0.25    # a Stack whose grid is more zeros than this is not made: at large batches the GEMM would
                         # multiply the zeros (a quarter more work than the separate GEMMs at worst); lstm_fgr: 3/16


def training_plan(cell: CellGraph, lengths: bool = False, precision: str = "float32") -> TrainingPlan:
    """The fused training plan of `cell` (cached: a pure function of the frozen cell, lengths and the mode).
    AutodiffError if the cell has a value the fused path cannot place (named). A cell of heads or reductions is
    planned in its dense form (engine/dense.py): the parameters it runs on are dense_params'. lengths=True: its
    kernels hold the rows past their sequence's end (engine/autodiff/fused_lengths.py). precision: the GEMMs' mode
    (engine/codegen/precision.py; a short name too), TrainingPlan.precision: the same kernels and GEMMs; a cell of
    reductions (sum_h, mean_h: a matmul by a fixed matrix in the dense form) sums them in strict fp32 in every mode,
    as the reference does."""
    return _training_plan(cell, lengths, check_training_precision("the training plan", precision))


@lru_cache(maxsize=64)
def _training_plan(cell: CellGraph, lengths: bool, precision: str) -> TrainingPlan:
    if precision != "float32":      # the same plan; its reductions' GEMMs (TrainingPlan.exact) stay strict fp32
        return dataclasses.replace(_training_plan(cell, lengths, "float32"), precision=precision)
    if lengths:
        return with_lengths(_training_plan(cell, False, "float32"))
    cell = dense_form(cell).cell
    return Planner(cell, derived(cell)).run()


class Planner(BackwardPlanner):
    """Plans a cell's fused training step: the forward here, the backward and the after part in BackwardPlanner."""

    def __init__(self, cell: CellGraph, split: BackwardSplit):
        self.cell, self.split, self.graph = cell, split, split.graph
        self.buffers: dict[str, Buffer] = {}
        self.places: dict[str, Place] = {}

    # ---- shared -----------------------------------------------------------------------------------------------
    def _buffer(self, name: str, cols: Lin, blocks: str = "T", doc: str = "") -> str:
        if name not in self.buffers:
            self.buffers[name] = Buffer(name, cols, blocks, doc)
        return name

    def _dim(self, forward_name: str) -> str:
        d = self.cell.dims[forward_name]
        if d not in DIMS and d != SCALAR:
            raise AutodiffError(f"value '{forward_name}' has an unknown size ({d})", node=forward_name,
                                hint="fix the cell's size errors first (engine.check)")
        return d

    def run(self) -> TrainingPlan:
        forward = self._forward()
        backward, back_places = self._backward()
        grad_gemms = self._grad_gemms()
        column_dots = self._column_dots()
        grouped = {n for g in grad_gemms for n in g.nodes} | {n for c in column_dots for n in c.nodes}
        after_layers = tuple(n for n in self.split.after if n.name not in grouped)
        skip = set(self.input_terms) | ({self.graph.input_adjoint} if self.input_gemm else set())
        after_rest = tuple(n for n in after_layers if n.name not in skip)
        return TrainingPlan(self.cell, self.split, tuple(self.buffers.values()), forward, backward,
                            dict(self.places), back_places, tuple(self.static), self.input_gemm, after_rest,
                            grad_gemms, after_layers, column_dots, self.stacks, dict(self.state_places),
                            dict(self.adjoint_places), self.output)

    # ---- stacks -----------------------------------------------------------------------------------------------
    def _stacks(self, live: list, batched: set) -> tuple[Stack, ...]:
        """A Stack per state size whose states' matmuls qualify: two states or more; every matmul's add chain has at
        most one matmul of each state; no weight used twice; at most MAX_ZERO_SHARE of the grid zeros."""
        cell = self.cell
        consumers = readers(cell, live)
        by_dim: dict[str, list[str]] = {}
        for name in live:
            node = cell[name]
            if node.op == "matmul" and name in batched and cell[node.args[1]].op == "state":
                by_dim.setdefault(self._dim(node.args[1]), []).append(name)
        stacks = []
        for dim, matmuls in by_dim.items():
            states = tuple(s for s in cell.state_names if any(cell[m].args[1] == s for m in matmuls))
            weights = [cell[m].args[0] for m in matmuls]
            if len(states) < 2 or len(set(weights)) != len(weights):
                continue
            sums: dict[str, dict[str, str]] = {}
            for m in matmuls:
                terms = sums.setdefault(self._sum_root(m, consumers), {})
                if cell[m].args[1] in terms:
                    break
                terms[cell[m].args[1]] = m
            else:
                zeros = sum(1 for terms in sums.values() for s in states if s not in terms)
                if zeros > MAX_ZERO_SHARE * len(sums) * len(states):
                    continue
                members = tuple(tuple(terms.get(s, "") for s in states) for terms in sums.values())
                stacks.append(Stack(dim, states, tuple(sums), members,
                                    tuple(cell[m].args[0] if m else "" for row in members for m in row),
                                    tuple(Lin.of(cell[cell[next(m for m in row if m)].args[0]].attr("rows"))
                                          for row in members)))
        return tuple(stacks)

    def _sum_root(self, matmul: str, consumers: dict) -> str:
        """The top of the chain of adds that `matmul` is a term of: up from it while a value is read by one add alone
        (once) and is neither saved for the backward nor a next state; `matmul` itself when its reader is no add."""
        cell = self.cell
        stop = set(self.graph.saved) | {s.next for s in cell.states}
        value = matmul
        while value not in stop and len(consumers[value]) == 1:
            reader = cell[consumers[value][0]]
            if reader.op != "add" or reader.args.count(value) != 1:
                break
            value = reader.name
        return value

    # ---- forward ----------------------------------------------------------------------------------------------
    def _forward(self) -> StepPlan:
        cell = self.cell
        live = [n for n in cell.topo_order if n in cell.live_nodes or cell[n].op in ("input", "state")]
        batched = set()
        for name in cell.topo_order:
            node = cell[name]
            if node.op in ("input", "state") or any(a in batched for a in node.args):
                batched.add(name)
        self.static = [n for n in live if n not in batched and not cell[n].is_leaf]
        for name in live:
            node = cell[name]
            if node.op == "const":
                self.places[name] = Place("literal", literal=float(node.attr("value")))
            elif node.is_param and node.op != "weight" or name in self.static:
                self.places[name] = Place("vector", buffer=f"param_{name}" if node.is_param else f"static_{name}")
        x = cell.input.name
        self.places[x] = Place("row", self._buffer(INPUT_BUFFER, Lin.of(self._dim(x)), doc="the layer's input"))
        self.stacks = self._stacks(live, batched)
        self.state_places, self.adjoint_places = {}, {}
        for st in self.stacks:        # its states side by side, and their adjoints
            names = ", ".join(st.states)
            state = self._buffer(f"state_stack_{st.dim}", st.k, "T+1", f"states {names} side by side")
            adjoint = self._buffer(f"dstate_stack_{st.dim}", st.k, "T+1", f"the adjoints of {names} side by side")
            for k, name in enumerate(st.states):
                self.state_places[name] = Place("row", state, Lin.of(st.dim, k))
                self.adjoint_places[name] = Place("row", adjoint, Lin.of(st.dim, k))
        for s in cell.states:
            if s.name not in self.state_places:
                dim = cell.state_dim(s.name)
                self.state_places[s.name] = Place("row", self._buffer(
                    state_buffer(s.name), Lin.of(dim), "T+1", f"state {s.name}: block t enters step t"))
                self.adjoint_places[s.name] = Place("row", adjoint_buffer(s.name))
            self.places[s.name] = self.state_places[s.name]
        out = self.state_places[cell.output]
        self.output = dataclasses.replace(out, shift=1)
        if self.buffers[out.buffer].cols != Lin.of(cell.output_dim):    # in a Stack's buffer: stored again, whole
            self.output = Place("row", self._buffer(OUTPUT_BUFFER, Lin.of(cell.output_dim),
                                                    doc="the layer's output (its state lies in a stack)"))

        # Stages: a matmul of x is hoisted (stage 0); of a state, stage 0; of a value of stage s, stage s + 1.
        stage: dict[str, int] = {x: 0, **{s: 0 for s in cell.state_names}}
        groups: dict[tuple[int, str], list[str]] = {}
        elementwise: dict[tuple[int, str], list[str]] = {}
        for name in live:
            node = cell[name]
            if name not in batched or node.is_leaf:
                continue
            if node.op == "matmul":
                operand = node.args[1]
                stage[name] = 0 if cell[operand].is_leaf else stage[operand] + 1
                groups.setdefault((stage[name], operand), []).append(name)
            else:
                stage[name] = max(stage[a] for a in node.args if a in batched)
                elementwise.setdefault((stage[name], self._dim(name)), []).append(name)
        self.fwd_stage = stage

        gemm_plans: dict[tuple[int, str], GemmPlan] = {}
        for st in self.stacks:        # one GEMM for all the matmuls of its states (stage 0, as every state's)
            for name in st.states:
                del groups[(0, name)]
            out = self._buffer(f"gemm_stack_{st.dim}", st.n, doc=f"the sums of the matmuls of {', '.join(st.states)}")
            offset = Lin()
            for row, width in zip(st.members, st.widths):
                terms = [m for m in row if m]
                self.places[terms[0]] = Place("row", out, offset)
                for m in terms[1:]:
                    self.places[m] = Place("literal", literal=0.0)
                offset = offset + width
            gemm_plans[(0, f"stack_{st.dim}")] = GemmPlan(
                f"{kernel_prefix(cell.name)}_fwd_stack_{st.dim}_s0", 0, tuple(m for row in st.members for m in row if m), st.weights,
                Place("row", self.state_places[st.states[0]].buffer), Place("row", out), st.k, st.n,
                out_blocks=st.widths, grid=len(st.states), k_blocks=(Lin.of(st.dim),) * len(st.states))
        for (s, operand), members in groups.items():
            hoisted = operand == x
            cols, offsets = Lin(), {}
            for m in members:
                offsets[m] = cols
                cols = cols + Lin.of(cell[cell[m].args[0]].attr("rows"))
            out = self._buffer(f"gemm_{operand}_{s}", cols, doc=f"the matmuls of {operand}: " + ", ".join(members))
            for m in members:
                self.places[m] = Place("row", out, offsets[m])
            gemm_plans[(s, operand)] = GemmPlan(
                c_identifier(f"{kernel_prefix(cell.name)}_fwd_{operand}_s{s}"), s, tuple(members), tuple(cell[m].args[0] for m in members),
                self.state_places[operand] if cell[operand].op == "state" else None, Place("row", out),
                Lin.of(self._dim(operand)), cols, hoisted=hoisted,
                out_blocks=tuple(Lin.of(cell[cell[m].args[0]].attr("rows")) for m in members))

        # Where every computed value must be written: next states, GEMM operands, later kernels, the backward.
        kernel_of = {n: key for key, names in elementwise.items() for n in names}
        needed: dict[str, list[Place]] = {}
        saved = set(self.graph.saved)
        consumers = readers(cell, live)
        next_of = {s.next: s.name for s in cell.states}
        for name in kernel_of:
            places = []
            if name in next_of:
                places.append(dataclasses.replace(self.state_places[next_of[name]], shift=1))
                if next_of[name] == cell.output and self.output.buffer == OUTPUT_BUFFER:
                    places.append(self.output)
            elsewhere = any(kernel_of.get(c) != kernel_of[name] for c in consumers[name])
            if (elsewhere or name in saved) and not places:
                places.append(Place("row", self._buffer(f"value_{name}", Lin.of(self._dim(name)),
                                                        doc=f"forward value {name}")))
            needed[name] = places
            if places:
                self.places[name] = places[0]
        for (s, operand), plan in list(gemm_plans.items()):
            if plan.operand is None:
                gemm_plans[(s, operand)] = dataclasses.replace(plan, operand=self.places[operand])
        copies: dict[tuple[int, str], list[tuple[str, Place]]] = {}
        last = max([k[0] for k in elementwise] + [k[0] for k in groups] + [0])
        for s in cell.states:        # a next state that is no kernel's value (a matmul's, x, a state): copied
            if s.next not in kernel_of:
                copies.setdefault((last, cell.state_dim(s.name)), []).append(
                    (s.next, dataclasses.replace(self.state_places[s.name], shift=1)))
                if s.name == cell.output and self.output.buffer == OUTPUT_BUFFER:
                    copies[(last, cell.state_dim(s.name))].append((s.next, self.output))

        order: list[tuple[str, object]] = []
        for s in range(last + 1):
            order += [("gemm", gemm_plans[k]) for k in gemm_plans if k[0] == s and not gemm_plans[k].hoisted]
            for dim in DIMS:
                names = elementwise.get((s, dim), [])
                extra = copies.get((s, dim), [])
                if not names and not extra:
                    continue
                order.append(("kernel", self._kernel(f"{kernel_prefix(cell.name)}_fwd_s{s}_{dim}", s, dim, names, needed, extra,
                                                     forward=True)))
        hoisted = tuple(p for p in gemm_plans.values() if p.hoisted)
        return StepPlan(tuple(order), hoisted)

    def _kernel(self, name, stage, dim, names, needed, extra, forward: bool,
                partials: tuple = ()) -> KernelPlan:
        """A kernel computing `names` (forward nodes or backward nodes) in order; stores what `needed` says; extra:
        (value, place) copies of values it does not compute; partials: (var, args, place) sums to store."""
        computed = set(names)
        loads: dict[str, Place] = {}
        statements = []

        def read(value):
            if value not in computed and value not in loads:
                loads[value] = self._place_of(value, forward)

        for n in names:
            node = self.cell[n] if forward else self.back_nodes[n]
            for a in node.args:
                read(a)
            statements.append(Statement(n, node.op, tuple(node.args), tuple(node.attrs) if not forward
                                        else tuple((k, node.attr(k)) for k in OPS[node.op].attrs)))
        stores = [(n, p) for n in names for p in needed.get(n, [])]
        for value, place in extra:
            read(value)
            stores.append((value, place))
        for var, args, place in partials:
            for a in args:
                read(a)
            statements.append(Statement(var, "sum", tuple(args)) if len(args) > 1 else Statement(var, "copy", args))
            stores.append((var, place))
        return KernelPlan(name, stage, dim, tuple(loads.items()), tuple(statements), tuple(stores))

    def _place_of(self, value: str, forward: bool) -> Place:
        if not forward and value in self.back_places:
            return self.back_places[value]
        if value in self.places:
            return self.places[value]
        raise AutodiffError(f"value '{value}' is read by the fused training step but was never stored",
                            node=value, hint="this is a bug in engine/autodiff/fused_planner.py; "
                                             "backend='naive' trains the cell meanwhile")


def readers(cell, live: list[str]) -> dict[str, list[str]]:
    """For each value of `live`, the values of `live` that read it, in the order of `live` (one pass: linear)."""
    consumers: dict[str, list[str]] = {n: [] for n in live}
    for c in live:
        for a in dict.fromkeys(cell[c].args):
            if a in consumers:
                consumers[a].append(c)
    return consumers
