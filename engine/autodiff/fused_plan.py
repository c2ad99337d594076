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
are computed once a call and read as vectors. The plan is pure data (this module: its types): fused_planner.py makes
it, fused_describe.py writes it as text, fused_codegen.py writes the CUDA from it, fused_runner.py and
fused_program.py allocate and launch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from ..ir import CellGraph
from ..plan import Lin
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
    # lengths= (engine/autodiff/fused_lengths.py): for each store, the loaded value written instead at a step past
    # the row's end (None: the value itself); () without lengths
    past_end: tuple[str | None, ...] = ()


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
        """The key of the stacked weight this GEMM reads (engine/autodiff/fused_layer.py Layer.stacked)."""
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
    lengths: bool = False                             # the kernels hold the rows past their end (fused_lengths.py)
    # the GEMMs' mode (engine/codegen/precision.py): every GEMM operand rounded to its format, fp32 sums (the runner
    # rounds before cuBLAS, engine/autodiff/cublas.py; fused_numpy rounds as it); the kernels are the same in every
    # mode (fp32 cell math)
    precision: str = "float32"

    @property
    def launches_per_step(self) -> tuple[int, int]:
        return len(self.forward.order), len(self.backward.order)

    @cached_property
    def fixed_weights(self) -> frozenset:
        """The weights the dense form added for reductions (engine/dense.py: sum_h, mean_h as a fixed matrix)."""
        return frozenset(n.name for n in self.cell.nodes if n.op == "weight" and n.attr("fixed"))

    @cached_property
    def exact_gemms(self) -> frozenset:
        """The GEMMs (by name) that multiply only by fixed reduction matrices: sums, which no precision mode rounds
        (the reference sums sum_h and mean_h in fp32), so they run strict fp32 in every mode."""
        gemms = self.forward.gemms + self.backward.gemms + ((self.input_gemm,) if self.input_gemm else ())
        return frozenset(g.name for g in gemms
                         if any(g.weights) and all(w in self.fixed_weights for w in g.weights if w))

    def exact(self, g: GemmPlan) -> bool:
        """Whether GEMM g is one of exact_gemms (looked up on every GEMM of every step: a set, worked out once)."""
        return g.name in self.exact_gemms

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
LENGTHS = "lengths"           # the (B,) int32 steps of each sequence, a kernel argument with lengths= (not a Buffer)
