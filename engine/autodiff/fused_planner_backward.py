"""The backward half of the fused training step's planner (engine/autodiff/fused_planner.py): the backward step's
stages, GEMMs and kernels, t = T-1 .. 0 (the split's per-step part), the input's adjoint as one GEMM, a Stack's
backward GEMM, and the after part's weight and bias gradients (GradGemm) and vector parameters' (ColumnDot). A mixin of
Planner: it reads the forward's places (places, state_places, adjoint_places, stacks) and writes back_places.
"""
from __future__ import annotations

import dataclasses

from ..c_names import c_identifier, kernel_prefix
from ..plan import Lin
from .errors import AutodiffError
from .fused_plan import (
    D_INPUT_BUFFER,
    D_OUTPUT_BUFFER,
    DIMS,
    ColumnDot,
    GemmPlan,
    GradGemm,
    Place,
    Stack,
    StepPlan,
    adjoint_buffer,
)
from .graph import BackwardNode


class BackwardPlanner:
    """Planner's methods for the backward step and the after part (see the module's docstring)."""

    # ---- backward ---------------------------------------------------------------------------------------------
    def _backward(self) -> tuple[StepPlan, dict]:
        cell, graph, split = self.cell, self.graph, self.split
        nodes = {n.name: n for n in split.per_step}
        self.back_nodes = nodes
        self.back_places: dict[str, Place] = {}
        dim_of = {n.name: self._dim(n.of) for n in graph.nodes}
        for i in graph.inputs:
            dim_of[i.name] = self._dim(i.of)
            if i.source == "output":
                buffer = self._buffer(D_OUTPUT_BUFFER, Lin.of(cell.output_dim), doc="the adjoint of the outputs")
                self.back_places[i.name] = Place("row", buffer)
            else:
                place = self.adjoint_places[i.state]
                if place.buffer == adjoint_buffer(i.state):
                    self._buffer(place.buffer, Lin.of(cell.state_dim(i.state)), "T+1",
                                 f"the adjoint of state {i.state}: block t of the state entering step t")
                self.back_places[i.name] = dataclasses.replace(place, shift=1)
        states_of: dict[str, list[str]] = {}          # backward value -> the states it is the adjoint of
        for s_name, name in graph.state_adjoints:
            if name:
                states_of.setdefault(name, []).append(s_name)

        # Stages: inputs and saved values at 0; an elementwise node at its arguments' latest; a matmul_t one later.
        stage: dict[str, int] = {}

        def stage_of(v):
            return stage.get(v, 0)

        groups: dict[tuple[int, str], list[str]] = {}
        for n in split.per_step:
            if n.op == "matmul_t":
                stage[n.name] = stage_of(n.args[1]) + 1
                groups.setdefault((stage[n.name] - 1, n.of), []).append(n.name)
            else:
                stage[n.name] = max([stage_of(a) for a in n.args] + [0])

        consumers: dict[str, list[str]] = {}
        for n in split.per_step:
            for a in n.args:
                consumers.setdefault(a, []).append(n.name)
        recorded = set(split.recorded)
        if graph.input_adjoint in nodes:
            recorded.add(graph.input_adjoint)

        def only_summed(terms, total) -> bool:
            """The GEMM terms are read by the sum `total` alone: neither another node, the after part nor the step
            before (a term that is a state's adjoint unchanged) needs them on their own, so the GEMM may write the
            sum instead, and run later."""
            return all(t not in recorded and t not in states_of and set(consumers.get(t, [])) == {total}
                       for t in terms)

        # The terms W^T dy of one operand from GEMMs of several stages (GRU-Cho: U_z^T dz at stage 0, U_r^T dr at
        # stage 1) are all summed into its adjoint, which nothing reads before the last of them: one GEMM at the
        # last stage computes them all (each dy is ready by then), and one launch a step goes.
        for n in split.per_step:
            if n.op != "sum":
                continue
            keys = sorted({(stage[a] - 1, nodes[a].of) for a in n.args if a in nodes and nodes[a].op == "matmul_t"})
            if len(keys) > 1 and len({of for _, of in keys}) == 1 and only_summed(
                    [m for key in keys for m in groups[key]], n.name):
                last = keys[-1]
                for key in keys[:-1]:
                    for member in groups.pop(key):
                        stage[member] = last[0] + 1
                        groups[last].insert(0, member)

        # A sum of one GEMM's terms (and elementwise ones computed before it) is that GEMM's output: absorbed. Where
        # an elementwise term comes at a later stage and nothing reads the sum within the step (a state's adjoint),
        # the GEMM moves to that stage, after the kernel that writes the term.
        absorbed: dict[tuple[int, str], BackwardNode] = {}
        for n in split.per_step:
            if n.op != "sum":
                continue
            terms = [a for a in n.args if a in nodes and nodes[a].op == "matmul_t"]
            keys = {(stage[a] - 1, nodes[a].of) for a in terms}
            if len(keys) != 1:
                continue
            key = keys.pop()
            if sorted(terms) != sorted(groups[key]) or key in absorbed or not only_summed(terms, n.name):
                continue
            later = max([stage_of(a) for a in n.args if a not in terms] + [key[0]])
            if later > key[0]:
                if (later, key[1]) in groups or consumers.get(n.name):
                    continue
                groups[(later, key[1])] = groups.pop(key)
                for member in terms:
                    stage[member] = later + 1
                stage[n.name] = later + 1
                key = (later, key[1])
            absorbed[key] = n

        def home(value: str) -> Place:
            """The place of a backward value that leaves its kernel or GEMM."""
            if value in states_of:
                return self.adjoint_places[states_of[value][0]]
            return Place("row", self._buffer(f"back_{value}", Lin.of(dim_of[value]), doc=f"backward value {value}"))

        gemm_plans: dict[tuple[int, str], GemmPlan] = {}
        dy_places: dict[str, list[Place]] = {}
        members_of = dict(groups)
        for st in self.stacks:        # its states' groups as one GEMM, where they are exactly its matmuls' terms
            stacked = self._backward_stack(st, groups, absorbed, nodes, states_of, dy_places)
            if stacked is not None:
                for name in st.states:
                    del groups[(stacked.stage, name)]
                gemm_plans[(stacked.stage, f"stack_{st.dim}")] = stacked
        for key, members in groups.items():
            s, operand = key
            cols, offsets = Lin(), {}
            for m in members:
                offsets[m] = cols
                cols = cols + Lin.of(dim_of[nodes[m].args[1]])
            dy_buffer = self._buffer(f"dy_{operand}_{s}", cols, doc=f"the dy of the matmul_t of {operand}")
            for m in members:
                dy_places.setdefault(nodes[m].args[1], []).append(Place("row", dy_buffer, offsets[m]))
            total = absorbed.get(key)
            out_value = total.name if total else (members[0] if len(members) == 1 else None)
            if out_value is None:          # several terms, no sum to absorb them: each term separately (rare)
                raise AutodiffError(f"the operand adjoints of '{operand}' are not summed in one node",
                                    node=operand, hint="backend='naive' trains this cell")
            out = home(out_value)
            self.back_places[out_value] = out
            gemm_plans[key] = GemmPlan(
                c_identifier(f"{kernel_prefix(cell.name)}_bwd_{operand}_s{s}"), s, tuple(members), tuple(nodes[m].args[0] for m in members),
                Place("row", dy_buffer), out, cols, Lin.of(dim_of[members[0]]),
                accumulate=bool(total) and any(a not in members for a in total.args),
                out_blocks=(Lin.of(dim_of[members[0]]),))

        absorbed_names = {n.name for n in absorbed.values()}
        elementwise: dict[tuple[int, str], list[str]] = {}
        for n in split.per_step:
            if n.op != "matmul_t" and n.name not in absorbed_names:
                elementwise.setdefault((stage[n.name], dim_of[n.name]), []).append(n.name)
        kernel_of = {v: key for key, names in elementwise.items() for v in names}
        partial_kernel = {total.name: (key[0], dim_of[total.name]) for key, total in absorbed.items()}
        self.input_gemm, self.input_terms = self._input_gemm(nodes, dim_of, dy_places)
        needed: dict[str, list[Place]] = {}
        for v in kernel_of:
            places = list(dy_places.get(v, []))
            places += [self.adjoint_places[s] for s in states_of.get(v, [])]
            leaves = any(kernel_of.get(c) != kernel_of[v] for c in consumers.get(v, [])
                         if nodes[c].op != "matmul_t" and c not in absorbed_names)
            absorbed_reader = any(c in absorbed_names and partial_kernel[c] != kernel_of[v]
                                  for c in consumers.get(v, []))
            if (leaves or v in recorded or absorbed_reader) and not places:
                places.append(home(v))
            needed[v] = places
            if places:
                self.back_places[v] = places[0]
        for v in recorded:      # a recorded dy read by the after part: its first column block
            if v not in self.back_places and v in dy_places:
                self.back_places[v] = dy_places[v][0]

        # Values to copy: a GEMM's dy that no kernel computes (an input, another GEMM's output) into its column
        # block, an input that is a state's adjoint unchanged; and the absorbed sums' partials.
        copies: dict[tuple[int, str], list[tuple[str, Place]]] = {}
        for v, places in dy_places.items():
            if v not in kernel_of:
                copies.setdefault((stage_of(v), dim_of[v]), []).extend((v, place) for place in places)
        for v, states in states_of.items():     # an input, or a GEMM's output, that is the adjoint of states
            if v not in kernel_of:
                first = 0 if v in self.back_places and self.back_places[v] == home(v) else None
                copies.setdefault((stage_of(v), dim_of[v]), []).extend(
                    (v, self.adjoint_places[s]) for k, s in enumerate(states) if k != first)
        partials: dict[tuple[int, str], list] = {}
        for key, total in absorbed.items():
            rest = [a for a in total.args if a not in members_of[key]]
            if rest:
                partials.setdefault((key[0], dim_of[total.name]), []).append(
                    (f"{total.name}__part", tuple(rest), self.back_places[total.name]))
        last = max([k[0] for k in elementwise] + [k[0] + 1 for k in gemm_plans] + [0])
        order: list[tuple[str, object]] = []
        for s in range(last + 1):
            for dim in DIMS:
                names = elementwise.get((s, dim), [])
                extra, parts = copies.get((s, dim), []), partials.get((s, dim), [])
                if names or extra or parts:
                    order.append(("kernel", self._kernel(f"{kernel_prefix(cell.name)}_bwd_s{s}_{dim}", s, dim, names, needed,
                                                         extra, forward=False, partials=tuple(parts))))
            order += [("gemm", gemm_plans[k]) for k in gemm_plans if k[0] == s]
        for s_name, adj in graph.state_adjoints:
            if adj is not None and adj not in self.back_places:
                raise AutodiffError(f"the adjoint of state '{s_name}' ({adj}) has no place in the fused step",
                                    node=s_name, hint="backend='naive' trains this cell")
        return StepPlan(tuple(order)), dict(self.back_places)


    def _input_gemm(self, per_step: dict, dim_of: dict, dy_places: dict) -> tuple[GemmPlan | None, tuple]:
        """The input's adjoint as one GEMM, when it is W^T dy terms of x alone whose dy every step computes (or
        receives): their dy side by side in a buffer of their own (added to dy_places), the weights stacked."""
        graph, split = self.graph, self.split
        after = {n.name: n for n in split.after}
        total = after.get(graph.input_adjoint)
        if total is None:
            return None, ()
        terms = list(total.args) if total.op == "sum" else [total.name]
        inputs = {i.name for i in graph.inputs}
        if not all(t in after and after[t].op == "matmul_t" and after[t].flows_to == "input"
                   and (after[t].args[1] in per_step or after[t].args[1] in inputs) for t in terms):
            return None, ()
        if len(set(terms)) != len(terms):
            return None, ()
        cols, offsets = Lin(), {}
        for t in terms:
            offsets[t] = cols
            cols = cols + Lin.of(dim_of[after[t].args[1]])
        buffer = self._buffer("dy_input", cols, doc="the dy of the matmuls of x, side by side")
        for t in terms:
            dy_places.setdefault(after[t].args[1], []).append(Place("row", buffer, offsets[t]))
        gemm = GemmPlan(f"{kernel_prefix(self.cell.name)}_bwd_input", 0, tuple(terms), tuple(after[t].args[0] for t in terms),
                        Place("row", buffer), Place("row", D_INPUT_BUFFER), cols, Lin.of(dim_of[total.name]),
                        hoisted=True, out_blocks=(Lin.of(dim_of[total.name]),))
        return gemm, tuple(terms)

    def _backward_stack(self, st: Stack, groups: dict, absorbed: dict, nodes: dict, states_of: dict,
                        dy_places: dict) -> GemmPlan | None:
        """The Stack's backward as one GEMM: the dy of its sums side by side (a buffer of their own, their places added
        to dy_places) times its grid, into its states' adjoints side by side. None where its states' operand adjoints
        are not exactly its matmuls' terms: each state's group of one stage, one dy a sum, each state's total its
        adjoint alone, and all totals with elementwise parts (the GEMM adds to them) or none."""
        keys = {key[1]: key for key in groups if key[1] in st.states}
        if len(keys) != len(st.states) or len({key[0] for key in keys.values()}) != 1:
            return None
        stage = next(iter(keys.values()))[0]
        by_weight = {nodes[m].args[0]: m for key in keys.values() for m in groups[key]}
        count = len(st.states)
        rows = [st.weights[j * count:(j + 1) * count] for j in range(len(st.roots))]
        if any(w and w not in by_weight for row in rows for w in row):
            return None
        for k, name in enumerate(st.states):
            if set(groups[keys[name]]) != {by_weight[row[k]] for row in rows if row[k]}:
                return None
        dys = []
        for row in rows:
            dy = {nodes[by_weight[w]].args[1] for w in row if w}
            if len(dy) != 1:
                return None
            dys.append(dy.pop())
        if len(set(dys)) != len(dys):
            return None
        totals, accumulate = {}, set()
        for name in st.states:
            members, total = groups[keys[name]], absorbed.get(keys[name])
            value = total.name if total else (members[0] if len(members) == 1 else None)
            if value is None or states_of.get(value) != [name]:
                return None
            totals[name] = value
            accumulate.add(bool(total) and any(a not in members for a in total.args))
        if len(accumulate) != 1:
            return None
        dy_buffer = self._buffer(f"dy_stack_{st.dim}_{stage}", st.n, doc=f"the dy of the sums of {', '.join(st.roots)}")
        offset = Lin()
        for dy, width in zip(dys, st.widths):
            dy_places.setdefault(dy, []).append(Place("row", dy_buffer, offset))
            offset = offset + width
        for name, value in totals.items():
            self.back_places[value] = self.adjoint_places[name]
        return GemmPlan(f"{kernel_prefix(self.cell.name)}_bwd_stack_{st.dim}_s{stage}", stage,
                        tuple(by_weight[w] for row in rows for w in row if w), st.weights, Place("row", dy_buffer),
                        Place("row", self.adjoint_places[st.states[0]].buffer), st.n, st.k,
                        accumulate=accumulate.pop(), out_blocks=(Lin.of(st.dim),) * count, grid=count,
                        k_blocks=st.widths)

    # ---- the after part ---------------------------------------------------------------------------------------
    def _column_dots(self) -> tuple[ColumnDot, ...]:
        """The after part's batch_sum(mul(a, b)) into a parameter no other node adds to, where a and b are values
        of every step in row buffers of one size and the product is read by nothing else (peepholes)."""
        graph, after = self.graph, self.split.after
        by_name = {n.name: n for n in after}
        readers: dict[str, int] = {}
        users: dict[str, int] = {}
        for n in after:
            for a in n.args:
                readers[a] = readers.get(a, 0) + 1
            if n.accumulates:
                users[n.param] = users.get(n.param, 0) + 1
        dim_of = {n.name: self.cell.dims[n.of] for n in graph.nodes} | {i.name: self.cell.dims[i.of]
                                                                            for i in graph.inputs}

        def row_place(value):
            place = self.back_places.get(value) if value in dim_of else self.places.get(value)
            dim = dim_of.get(value, self.cell.dims.get(value))
            return (place, dim) if place is not None and place.kind == "row" and dim in DIMS else (None, None)

        dots = []
        for n in after:
            product = by_name.get(n.args[0]) if n.op == "batch_sum" and n.accumulates else None
            if product is None or product.op != "mul" or users[n.param] != 1 or readers.get(product.name) != 1 \
                    or product.name == graph.input_adjoint or product.name in self.split.recorded:
                continue
            (a, dim_a), (b, dim_b) = row_place(product.args[0]), row_place(product.args[1])
            if a is None or b is None or dim_a != dim_b or dim_a != dim_of.get(product.name):
                continue
            dots.append(ColumnDot(n.param, (product.name, n.name), a, b, dim_a))
        return tuple(dots)

    def _grad_gemms(self) -> tuple[GradGemm, ...]:
        """The after part's weight gradients (outer: dy^T operand) of one operand, and its bias sums (batch_sum) of
        one dy buffer, as one GEMM each, where their dy lie side by side in one buffer as a contiguous block of
        columns (the members of the step's GEMM: LSTM, 8 GEMMs a layer become 2 and 8 sums 1). A parameter that
        several nodes accumulate into stays with the interpreter, as does anything else."""
        graph = self.graph
        dim_of = {n.name: self.cell.dims[n.of] for n in graph.nodes} | {i.name: self.cell.dims[i.of]
                                                                            for i in graph.inputs}
        users: dict[str, int] = {}
        for n in self.split.after:
            if n.accumulates:
                users[n.param] = users.get(n.param, 0) + 1
        candidates: dict[tuple, list] = {}
        for n in self.split.after:
            if not n.accumulates or users[n.param] != 1 or n.op not in ("outer", "batch_sum"):
                continue
            dy = self.back_places.get(n.args[0])
            if dy is None or dy.kind != "row" or dim_of.get(n.args[0]) not in DIMS:
                continue
            if n.op == "outer":
                operand = self.places.get(n.args[1])
                if operand is None or operand.kind != "row" or self.cell.dims[n.args[1]] not in DIMS:
                    continue
                key = ("weights", n.args[1], dy.buffer, dy.shift)
            else:
                key = ("biases", "", dy.buffer, dy.shift)
            candidates.setdefault(key, []).append((n, dy.offset, Lin.of(dim_of[n.args[0]])))
        plans = []
        for (kind, operand, buffer, shift), members in candidates.items():
            part = 0
            while members:                            # a chain of side-by-side blocks at a time (LSTM: b_h*, b_i*)
                by_offset: dict = {}
                later = []
                for n, offset, width in members:
                    if offset in by_offset:
                        later.append((n, offset, width))
                    else:
                        by_offset[offset] = (n, width)
                ends = {offset + width for offset, (_, width) in by_offset.items()}
                starts = [offset for offset in by_offset if offset not in ends]
                if len(starts) != 1:
                    break                             # not one contiguous block of columns: the interpreter's
                chain, offset = [], starts[0]
                while offset in by_offset:
                    chain.append(by_offset.pop(offset)[0])
                    offset = offset + Lin.of(dim_of[chain[-1].args[0]])
                if by_offset:
                    break
                rows = Lin()
                for n in chain:
                    rows = rows + Lin.of(dim_of[n.args[0]])
                plans.append(GradGemm(
                    c_identifier(f"{kernel_prefix(self.cell.name)}_grad_{operand or 'biases'}_{buffer}" + (f"_{part}" if part else "")),
                    tuple(n.param for n in chain), tuple(n.name for n in chain), Place("row", buffer, starts[0], shift),
                    rows, self.places[operand] if kind == "weights" else None,
                    Lin.of(self.cell.dims[operand]) if kind == "weights" else Lin()))
                members, part = later, part + 1
        return tuple(plans)
