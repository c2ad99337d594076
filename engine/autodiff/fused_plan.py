"""The plan of the fused training step (backend "fused" of engine.autodiff.record): which GEMMs and which generated
kernels run a layer's forward step that keeps what the backward reads, and its backward step.

Forward, one layer:
- once a layer, the hoisted GEMM: every matmul of the input x as one GEMM over the T x B rows;
- every step, stage by stage: the stage's GEMMs (the matmuls of one operand as one GEMM, their weights stacked),
  then the stage's kernel(s), one per value size (I, H, P): the elementwise math, which stores the next states,
  the values a later stage reads and the values the backward graph saves (BackwardGraph.saved).
Backward, one layer, t = T-1 .. 0 (the split's per-step part, engine/autodiff/hoist.py):
- every step, stage by stage: the kernel(s) of the elementwise backward math, then the stage's GEMMs: the
  operand adjoints W^T dy of one operand as one GEMM (dy of every matmul side by side, times the stacked weights).
  A sum of such terms and of elementwise ones is the GEMM's output: the kernel writes the elementwise part there
  first and the GEMM adds to it (beta = 1), so the LSTM's and the GRU's step is one kernel and one GEMM.
- after the sweep, the split's `after` part on T x B rows (weight gradients, bias sums, the input's adjoint).

Every value a kernel stores lives in a (rows, columns) buffer of the layer, at row (t + shift) * B + b: a state's
buffer has T + 1 row blocks (block t is the state entering step t; block T the final state), as has a state
adjoint's (block t: the adjoint of the state entering step t). Values computed from parameters alone ("static")
are computed once a call and read as vectors. The plan is pure data: engine/autodiff/fused_codegen.py writes the
CUDA from it, engine/autodiff/fused.py allocates and launches.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache

from ..ir import SCALAR, CellGraph
from ..ops import OPS
from ..plan import Lin
from .bptt import derived
from .errors import AutodiffError
from .graph import BackwardNode
from .hoist import BackwardSplit

DIMS = ("I", "H", "P")


@dataclass(frozen=True)
class Buffer:
    """One array of a layer: (blocks * B, cols), row (t + shift) * B + b; blocks "T" or "T+1"."""
    name: str
    cols: Lin
    blocks: str = "T"
    doc: str = ""


@dataclass(frozen=True)
class Place:
    """Where a value is: buffer[(t + shift) * B + b, offset + j] ("row"), buffer[j] ("vector": a parameter or a
    static value) or a number ("literal")."""
    kind: str
    buffer: str = ""
    offset: Lin = Lin()
    shift: int = 0
    literal: float | None = None


@dataclass(frozen=True)
class Statement:
    var: str
    op: str                   # an elementwise op of engine.ops (forward or backward), or "copy"
    args: tuple[str, ...]
    attrs: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class KernelPlan:
    name: str
    stage: int
    dim: str
    loads: tuple[tuple[str, Place], ...]        # value -> where it is read from
    statements: tuple[Statement, ...]
    stores: tuple[tuple[str, Place], ...]       # value -> where it is written (a value may go to several places)


@dataclass(frozen=True)
class GemmPlan:
    """out[rows] (+)= operand[rows] @ W^T (forward: W the members' weights stacked, (sum of rows, cols)), or
    dy[rows] @ W (backward: dy the members' adjoints side by side)."""
    name: str
    stage: int
    members: tuple[str, ...]                    # forward matmul nodes, or backward matmul_t nodes, in column order
    weights: tuple[str, ...]                    # the weight of each member
    operand: Place                              # forward: the operand's place; backward: the dy buffer (shift 0)
    out: Place
    k: Lin                                     # the inner size
    n: Lin                                     # the output's columns
    accumulate: bool = False                    # beta = 1: the output holds the elementwise part of a sum
    hoisted: bool = False                       # once a layer over T x B rows, before the step loop
    # The output's column blocks (what a fused stage puts side by side for a unit): forward, each member's rows
    # (a Stack's: each sum's); backward, the operand adjoint (a Stack's: each state's).
    out_blocks: tuple[Lin, ...] = ()
    grid: int = 1                               # a Stack's GEMM: weights is a grid of `grid` columns, row-major,
                                                # "" for a zero block (the stacked weight: sums x states)
    k_blocks: tuple[Lin, ...] = ()              # a Stack's GEMM: the inner size's blocks (forward: the states'
                                                # widths; backward: the sums')

    def k_ranges(self, forward: bool) -> tuple[tuple[Lin, Lin], ...]:
        """A Stack's GEMM: for each output block, the part of K that meets its nonzero grid blocks (first to last;
        zero blocks between are read); () for any other GEMM. forward: K runs over the states (an output block is a
        row of the grid); backward: over the sums (a column)."""
        if self.grid == 1:
            return ()
        rows = [self.weights[j:j + self.grid] for j in range(0, len(self.weights), self.grid)]
        lines = rows if forward else [tuple(row[k] for row in rows) for k in range(self.grid)]
        starts, start = [], Lin()
        for width in self.k_blocks:
            starts.append(start)
            start = start + width
        ranges = []
        for line in lines:
            nonzero = [i for i, w in enumerate(line) if w]
            ranges.append((starts[nonzero[0]], starts[nonzero[-1]] + self.k_blocks[nonzero[-1]]))
        return tuple(ranges)

    @property
    def stack(self) -> tuple[tuple[str, ...], int]:
        """The key of the stacked weight this GEMM reads (engine/autodiff/fused.py Layer.stacked)."""
        return self.weights, self.grid


@dataclass(frozen=True)
class GradGemm:
    """Parameter gradients of every step of a layer as one GEMM over its T x B rows, written into the members'
    gradients, which lie one after another in the gradient buffer: weights (operand set), (sum of rows, cols) +=
    dy^T operand; biases (operand None), (sum of rows) += ones^T dy. dy is the members' adjoints side by side, a
    block of columns of one buffer."""
    name: str
    params: tuple[str, ...]                     # in the dy block's column order = the stacked gradient's row order
    nodes: tuple[str, ...]                      # the after part's nodes (outer or batch_sum) it computes
    dy: Place                                   # the block's first column
    rows: Lin                                   # the block's width: the gradients' rows together
    operand: Place | None = None                # weights: the operand's rows; biases: None
    cols: Lin = Lin()                           # weights: the operand's width


@dataclass(frozen=True)
class ColumnDot:
    """A vector parameter's gradient over a layer's T x B rows, sum over the rows of a * b (a peephole's: the gate's
    dy times the cell state): the after part's mul and batch_sum, as one item of a table launch for every such
    parameter of the layer (kernels/column_dots.cu), instead of two CuPy calls each."""
    param: str
    nodes: tuple[str, ...]                      # the mul and the batch_sum it computes
    a: Place
    b: Place
    dim: str


@dataclass(frozen=True)
class Stack:
    """States that the step's matmuls multiply, side by side in one row buffer (and their adjoints in another), so
    that all those matmuls are one GEMM with K = the states' widths together. Its output column block j is sum j: the
    terms of one add chain (`roots[j]`, the add at its top), at most one matmul per state; the stacked weight is the
    grid weights[j][k] (sums x states), a zero block where sum j has no term of state k. The kernel reads sum j at the
    place of its first term and 0 for the others, so the chain adds to the same value. The backward's dy of the sums
    side by side, times the same grid, is the states' adjoints side by side: one GEMM there too. lstm_fgr: the
    matmuls of h, i, f and o, four GEMMs a step each way, become one each way."""
    dim: str
    states: tuple[str, ...]                     # in the K order
    roots: tuple[str, ...]                      # the sums, in the output's column order
    members: tuple[tuple[str, ...], ...]        # members[j][k]: the matmul of sum j and state k, "" for none
    weights: tuple[str, ...]                    # the grid, row-major, "" for a zero block
    widths: tuple[Lin, ...]                     # each sum's columns

    @property
    def k(self) -> Lin:
        return Lin.of(self.dim, len(self.states))

    @property
    def n(self) -> Lin:
        total = Lin()
        for w in self.widths:
            total = total + w
        return total


MAX_ZERO_SHARE = 0.25    # a Stack whose grid is more zeros than this is not made: at large batches the GEMM would
                         # multiply the zeros (a quarter more work than the separate GEMMs at worst); lstm_fgr: 3/16


@dataclass(frozen=True)
class StepPlan:
    """One direction of one layer's step: the GEMMs and kernels in launch order."""
    order: tuple[tuple[str, object], ...]       # ("gemm", GemmPlan) or ("kernel", KernelPlan)
    hoisted: tuple[GemmPlan, ...] = ()

    @property
    def kernels(self) -> tuple[KernelPlan, ...]:
        return tuple(item for kind, item in self.order if kind == "kernel")

    @property
    def gemms(self) -> tuple[GemmPlan, ...]:
        return self.hoisted + tuple(item for kind, item in self.order if kind == "gemm")


@dataclass(frozen=True)
class TrainingPlan:
    cell: CellGraph
    split: BackwardSplit
    buffers: tuple[Buffer, ...]
    forward: StepPlan
    backward: StepPlan
    places: dict = field(default_factory=dict)        # forward value -> Place (for the after part and the outputs)
    back_places: dict = field(default_factory=dict)   # backward value -> Place
    static: tuple[str, ...] = ()                      # forward values of parameters alone, computed once a call
    # The input's adjoint as one GEMM over a chunk of steps (dy of every matmul of x side by side, times the stacked
    # weights), written into the layer below's d_out: what lets the backward's layers run as a wavefront. None where
    # the input's adjoint is not such a sum (x met elementwise); `after_rest` is then the whole after part.
    input_gemm: GemmPlan | None = None
    after_rest: tuple = ()                            # after_layers without the input GEMM's nodes
    # The weight and bias gradients as one GEMM per operand (per dy buffer for the biases) and layer; after_layers
    # is the rest of the after part (the layer-by-layer backward runs it).
    grad_gemms: tuple[GradGemm, ...] = ()
    after_layers: tuple = ()
    column_dots: tuple[ColumnDot, ...] = ()          # vector parameters' gradients, a launch a layer
    stacks: tuple[Stack, ...] = ()
    state_places: dict = field(default_factory=dict)  # state -> Place of the state entering step t (block t)
    adjoint_places: dict = field(default_factory=dict)  # state -> Place of its adjoint entering step t
    output: Place = Place("row")                      # the layer's output of step t: the next layer's input rows

    @property
    def launches_per_step(self) -> tuple[int, int]:
        return len(self.forward.order), len(self.backward.order)

    @property
    def columns(self) -> dict:
        """Each buffer's columns: buffer name -> Lin."""
        return {b.name: b.cols for b in self.buffers}


def state_buffer(state: str) -> str:
    return f"state_{state}"


def adjoint_buffer(state: str) -> str:
    return f"dstate_{state}"


INPUT_BUFFER = "x"            # the layer's input sequence (T x B, I)
D_OUTPUT_BUFFER = "d_out"     # the adjoint of the layer's output sequence (T x B, output size)
D_INPUT_BUFFER = "d_in"       # the adjoint of the layer's input sequence: the layer below's d_out (bound, T x B, I)
OUTPUT_BUFFER = "out"         # the layer's output sequence where its state lies in a Stack's buffer (T x B, its size)


@lru_cache(maxsize=64)
def training_plan(cell: CellGraph) -> TrainingPlan:
    """The fused training plan of `cell` (cached: a pure function of the frozen cell). AutodiffError if the cell has
    a value the fused path cannot place (named)."""
    return _Planner(cell, derived(cell)).run()


class _Planner:
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
        consumers = {n: [c for c in live if n in cell[c].args] for n in live}
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
                    f"{self.cell.name}_grad_{operand or 'biases'}_{buffer}" + (f"_{part}" if part else ""),
                    tuple(n.param for n in chain), tuple(n.name for n in chain), Place("row", buffer, starts[0], shift),
                    rows, self.places[operand] if kind == "weights" else None,
                    Lin.of(self.cell.dims[operand]) if kind == "weights" else Lin()))
                members, part = later, part + 1
        return tuple(plans)

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
                f"{cell.name}_fwd_stack_{st.dim}_s0", 0, tuple(m for row in st.members for m in row if m), st.weights,
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
                f"{cell.name}_fwd_{operand}_s{s}", s, tuple(members), tuple(cell[m].args[0] for m in members),
                self.state_places[operand] if cell[operand].op == "state" else None, Place("row", out),
                Lin.of(self._dim(operand)), cols, hoisted=hoisted,
                out_blocks=tuple(Lin.of(cell[cell[m].args[0]].attr("rows")) for m in members))

        # Where every computed value must be written: next states, GEMM operands, later kernels, the backward.
        kernel_of = {n: key for key, names in elementwise.items() for n in names}
        needed: dict[str, list[Place]] = {}
        saved = set(self.graph.saved)
        consumers = {n: [c for c in live if n in cell[c].args] for n in live}
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
                order.append(("kernel", self._kernel(f"{cell.name}_fwd_s{s}_{dim}", s, dim, names, needed, extra,
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
        gemm = GemmPlan(f"{self.cell.name}_bwd_input", 0, tuple(terms), tuple(after[t].args[0] for t in terms),
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
        return GemmPlan(f"{self.cell.name}_bwd_stack_{st.dim}_s{stage}", stage,
                        tuple(by_weight[w] for row in rows for w in row if w), st.weights, Place("row", dy_buffer),
                        Place("row", self.adjoint_places[st.states[0]].buffer), st.n, st.k,
                        accumulate=accumulate.pop(), out_blocks=(Lin.of(st.dim),) * count, grid=count,
                        k_blocks=st.widths)

    def _place_of(self, value: str, forward: bool) -> Place:
        if not forward and value in self.back_places:
            return self.back_places[value]
        if value in self.places:
            return self.places[value]
        raise AutodiffError(f"value '{value}' is read by the fused training step but was never stored",
                            node=value, hint="this is a bug in engine/autodiff/fused_plan.py; "
                                             "backend='naive' trains the cell meanwhile")

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
                f"{cell.name}_bwd_{operand}_s{s}", s, tuple(members), tuple(nodes[m].args[0] for m in members),
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
                    order.append(("kernel", self._kernel(f"{cell.name}_bwd_s{s}_{dim}", s, dim, names, needed,
                                                         extra, forward=False, partials=tuple(parts))))
            order += [("gemm", gemm_plans[k]) for k in gemm_plans if k[0] == s]
        for s_name, adj in graph.state_adjoints:
            if adj is not None and adj not in self.back_places:
                raise AutodiffError(f"the adjoint of state '{s_name}' ({adj}) has no place in the fused step",
                                    node=s_name, hint="backend='naive' trains this cell")
        return StepPlan(tuple(order)), dict(self.back_places)


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
    from .stage_fusion import describe as describe_stages     # (it imports this module)
    return "\n".join([f"fused training step of cell '{plan.cell.name}': {f} launches forward, {b} backward a step",
                      *stacks, "  forward:", *items(plan.forward), "  backward:", *items(plan.backward), *inputs,
                      *grads,
                      *describe_stages(plan),
                      "  buffers: " + ", ".join(f"{b.name} ({b.blocks} x B, {b.cols.c_expr()})"
                                                for b in plan.buffers)])
