"""The Plan: what the compiler decided, as plain frozen data that any backend can consume.

The passes (engine/passes) turn a cell graph into a `Program`: the GEMMs with their operands and
output blocks ("terms"), the packed weight layout, the buffers, and the fused elementwise kernels
with their loads, statements, stores and CUDA source. A Program has no sizes in it: every extent
is a `Lin`, a linear form in the layer's input size I and hidden size H, so one Program serves
every layer and every size. A `Plan` is a Program bound to a network and a run shape (T, B):
concrete GEMM shapes, FLOPs, bytes, launches and the wavefront schedule.

This module is data and pure helpers on it: engine.passes and engine.codegen import it, it imports
neither; engine.compiler runs both and then `bind`.

    plan = make_plan(network, steps=T, batch=B)          # engine.compiler
    plan.program.gemms[0].terms          # which matmuls (and folded biases) each output block sums
    pack_weights(plan.program, network, params, layer=0)   # {gemm name: PackedGemm(weight, bias)}

Memory conventions, shared by every backend and the exported program:
- Activations are row-major (rows, features): a step buffer has B rows, a sequence buffer T*B rows
  (row t*B + b is batch row b at step t).
- A GEMM computes Y (M, N) = X (M, K) @ P^T, with P the packed weight of shape (N, K) (rows are
  output features, like every weight of the cell). Its operands sit side by side in the columns of
  X (K = the sum of their sizes); its terms are column blocks of Y, in the layout the Plan records.
- A double-buffered buffer has two versions; at step t, "cur" is version t % 2 and "next" is
  version (t + 1) % 2. States live in double buffers: a step reads "cur" and writes "next".
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .dense import dense, reduction_terms
from .errors import CompileError
from .flops import matmul_flops, statement_flops
from .ir import CellGraph
from .network import Network
from .params import Params
from .schedule import Wavefront, wavefront

# How many steps one input projection of a layer > 0 covers in the wavefront: layer l+1 runs this
# many steps behind layer l, and its projection GEMM has CHUNK*B rows instead of B.
DEFAULT_CHUNK_STEPS = 4
LAYOUTS = ("blocked", "interleaved")
FLOAT_BYTES = 4


# ---- sizes that scale with the layer ------------------------------------------------------------

@dataclass(frozen=True)
class Lin:
    """i*I + h*H + p*P + c: an extent that depends on the layer's input size I, hidden size H and projection
    size P (cells with projected states; engine/network.py)."""

    i: int = 0
    h: int = 0
    c: int = 0
    p: int = 0

    @staticmethod
    def of(dim: str, count: int = 1) -> "Lin":
        return {"I": Lin(i=count), "H": Lin(h=count), "P": Lin(p=count)}[dim]

    def __add__(self, other: "Lin") -> "Lin":
        return Lin(self.i + other.i, self.h + other.h, self.c + other.c, self.p + other.p)

    def __call__(self, sizes: dict[str, int]) -> int:
        return self.i * sizes["I"] + self.h * sizes["H"] + self.p * sizes.get("P", sizes["H"]) + self.c

    def _terms(self):
        return ((self.i, "I"), (self.h, "H"), (self.p, "P"))

    def __str__(self) -> str:
        parts = []
        for coef, name in self._terms():
            if coef:
                parts.append(name if coef == 1 else f"{coef}{name}")
        if self.c or not parts:
            parts.append(str(self.c))
        return " + ".join(parts)

    def c_expr(self) -> str:
        """The same extent as a C expression over the kernel arguments I, H (and P)."""
        parts = []
        for coef, name in self._terms():
            if coef:
                parts.append(name if coef == 1 else f"{coef} * {name}")
        if self.c or not parts:
            parts.append(str(self.c))
        return " + ".join(parts)


# ---- buffers and where values live in them ------------------------------------------------------

@dataclass(frozen=True)
class Buffer:
    """One array per layer. rows: "batch" (B rows, one step) or "sequence" (T*B rows)."""

    name: str
    rows: str
    cols: Lin
    role: str                 # input, output, gemm_operands, gemm_result, state, spill
    double: bool = False      # two versions, "cur" and "next", swapped every step
    doc: str = ""


@dataclass(frozen=True)
class Slot:
    """Where a value of size D lives: columns offset + stride*j (j < D) of a buffer, in one version."""

    buffer: str
    offset: Lin = Lin()
    stride: int = 1
    version: str | None = None    # "cur" or "next" for double buffers

    def describe(self) -> str:
        where = f"{self.buffer}[:, {self.offset}" + (f" + {self.stride}j" if self.stride != 1 else " + j") + "]"
        return where + (f" ({self.version})" if self.version else "")


# ---- GEMMs --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Term:
    """One output block of a GEMM: the sum of some matmuls (and, when folded, constant summands).

    `output` is the graph value the term feeds: the root of the sum the matmuls are added into, or
    the matmul itself when it is not part of a sum. `matmuls` and `biases` keep repeats (a summand
    added twice counts twice)."""

    name: str
    output: str
    matmuls: tuple[str, ...]
    dim: str                           # rows of the block: "H" or "I"
    stage: Any                         # "hoisted" or the step stage (1, 2, ...)
    biases: tuple[str, ...] = ()       # folded bias / vector / const leaves


@dataclass(frozen=True)
class Operand:
    name: str                          # the graph value multiplied
    dim: str


@dataclass(frozen=True)
class Gemm:
    """One cuBLAS call: Y = X @ P^T. Hoisted GEMMs run once per sequence (or per chunk of steps)."""

    name: str
    stage: Any                         # "hoisted" or 1, 2, ...
    operands: tuple[Operand, ...]
    terms: tuple[Term, ...]
    layout: str = "blocked"            # how the terms' rows are ordered in P and Y (see term_slot)

    @property
    def hoisted(self) -> bool:
        return self.stage == "hoisted"

    @property
    def k(self) -> Lin:
        total = Lin()
        for op in self.operands:
            total = total + Lin.of(op.dim)
        return total

    @property
    def n(self) -> Lin:
        total = Lin()
        for term in self.terms:
            total = total + Lin.of(term.dim)
        return total

    @property
    def in_buffer(self) -> str:
        return f"{self.name}_in"

    @property
    def out_buffer(self) -> str:
        return f"{self.name}_out"

    @property
    def partial_buffer(self) -> str:
        """A step GEMM of reductions only (Program.reductions): the blocks' partial sums on the wavefront schedules."""
        return f"{self.name}_part"

    def operand_offset(self, name: str) -> Lin:
        offset = Lin()
        for op in self.operands:
            if op.name == name:
                return offset
            offset = offset + Lin.of(op.dim)
        raise KeyError(name)

    def term_offset(self, index: int) -> Lin:
        return self._term_offsets[index]

    @cached_property
    def _term_offsets(self) -> tuple[Lin, ...]:
        """Each term's offset (the sizes of the terms before it), summed once: a GEMM may have thousands of terms."""
        offsets, offset = [], Lin()
        for term in self.terms:
            offsets.append(offset)
            offset = offset + Lin.of(term.dim)
        return tuple(offsets)

    def term_slot(self, index: int) -> Slot:
        """Blocked: term k is the column block [offset_k, offset_k + D). Interleaved: unit j of
        term k is column j * nterms + k, so one hidden unit's gates are adjacent (all terms then
        have the same size)."""
        if self.layout == "interleaved":
            return Slot(self.out_buffer, Lin(c=index), stride=len(self.terms))
        return Slot(self.out_buffer, self.term_offset(index))

    @property
    def has_bias(self) -> bool:
        return any(t.biases for t in self.terms)

    def layout_text(self) -> str:
        """The packed weight's row layout in words, e.g. 'blocked: [i_pre_x (H) | f_pre_x (H)]'."""
        blocks = " | ".join(f"{t.name} ({t.dim})" for t in self.terms)
        cols = " | ".join(f"{op.name} ({op.dim})" for op in self.operands)
        if self.layout == "interleaved":
            return f"interleaved: row j*{len(self.terms)}+k is unit j of [{blocks}][k]; columns [{cols}]"
        return f"blocked: rows [{blocks}]; columns [{cols}]"


# ---- kernels --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelParam:
    """A pointer argument of a generated kernel: a buffer (one version of it) or a parameter vector."""

    name: str                 # the C identifier
    source: str               # buffer name, or parameter node name when kind == "param"
    kind: str                 # "buffer" or "param"
    version: str | None = None
    writes: bool = False
    doc: str = ""


@dataclass(frozen=True)
class Access:
    """Element (b, j) of a value in a kernel argument: row index times ld, plus offset + stride*j."""

    param: str
    rows: str                 # "batch" (row b), "sequence" (row t*B + b) or "vector" (no row)
    ld: Lin = Lin()
    offset: Lin = Lin()
    stride: int = 1

    def fixed_term(self, terms: int) -> bool:
        """Whether this reads unit j of one term of an interleaved GEMM output of `terms` terms: stride `terms`, a
        constant offset below it."""
        return self.stride == terms and self.offset == Lin(c=self.offset.c) and 0 <= self.offset.c < terms


@dataclass(frozen=True)
class Load:
    var: str                  # the C variable
    value: str                # the value's name in the step graph
    access: Access | None = None
    literal: float | None = None   # consts are inlined as numbers


@dataclass(frozen=True)
class Statement:
    """var = op(args): one op of the graph, or "sum" for a flattened add-tree."""

    var: str
    op: str
    args: tuple[str, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    node: str = ""            # the graph node this computes


@dataclass(frozen=True)
class Store:
    var: str
    access: Access
    why: str = ""
    past_end: str | None = None   # lengths= (engine/passes/lengths.py): the variable stored instead past the row's end


@dataclass(frozen=True)
class Kernel:
    name: str
    stage: int
    dim: str                                # threads cover (b, j) for b < B, j < dim
    nodes: tuple[str, ...]                  # graph nodes computed here (absorbed adds included)
    inputs: tuple[str, ...]                 # values read from memory
    outputs: tuple[str, ...]                # values written to memory
    params: tuple[KernelParam, ...]
    loads: tuple[Load, ...]
    statements: tuple[Statement, ...]
    stores: tuple[Store, ...]
    source: str = ""                        # filled by engine.codegen

    @property
    def flops_per_element(self) -> int:
        return sum(statement_flops(s.op, len(s.args)) for s in self.statements)


@dataclass(frozen=True)
class StateHome:
    state: str
    slot: Slot                               # version "cur" holds the state at t-1


@dataclass(frozen=True)
class PassRecord:
    name: str
    enabled: bool
    why: str
    summary: str
    after: str                               # the program as text after this pass


@dataclass(frozen=True)
class Program:
    """Everything size-independent the compiler decided for one cell. Backends run it per layer."""

    cell: CellGraph                          # the graph after the IR passes (pruned, folded)
    source_cell: CellGraph                   # the graph as given
    passes: tuple[PassRecord, ...]
    gemms: tuple[Gemm, ...]
    kernels: tuple[Kernel, ...]
    buffers: tuple[Buffer, ...]
    homes: tuple[StateHome, ...]
    input_buffer: str                        # the layer input (T*B, I): x, or layer l-1's output
    output_buffer: str                       # the layer output (T*B, H)
    schedule: str                            # "wavefront" or "layers"
    layout: str
    precision: str
    node_groups: dict                        # graph node -> GEMM or kernel name (or a reason)
    num_stages: int                          # step stages: GEMM stage k reads kernel stage k-1
    key: str                                 # cache key: cell hash + passes + options + generator
    source: str = ""                         # the CUDA module: helpers + every kernel
    lengths: bool = False                    # the kernels take lengths (B,) and hold the rows past their end

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    @property
    def hoisted_gemms(self) -> tuple[Gemm, ...]:
        return tuple(g for g in self.gemms if g.hoisted)

    @cached_property
    def reductions(self) -> dict[str, tuple]:
        """{GEMM name: reduction_terms(...)} for the step GEMMs that are reductions only. The wavefront schedules sum
        rows for them instead of multiplying by the fixed matrix (engine/codegen/wavefront.py)."""
        found = {g.name: reduction_terms(self.cell, g) for g in self.gemms if not g.hoisted}
        return {name: terms for name, terms in found.items() if terms is not None}

    def step_gemms(self, stage: int) -> tuple[Gemm, ...]:
        return tuple(g for g in self.gemms if g.stage == stage)

    def stage_kernels(self, stage: int) -> tuple[Kernel, ...]:
        return tuple(k for k in self.kernels if k.stage == stage)

    @property
    def kernel_params(self) -> tuple[str, ...]:
        """Parameter vectors the kernels read (biases and vectors not folded into a GEMM), sorted."""
        names = {p.source for k in self.kernels for p in k.params if p.kind == "param"}
        return tuple(sorted(names))

    def step_order(self) -> list[tuple[str, Any]]:
        """One time step, in order: ("kernel", Kernel) and ("gemm", Gemm) items."""
        order: list[tuple[str, Any]] = [("kernel", k) for k in self.stage_kernels(0)]
        for stage in range(1, self.num_stages + 1):
            order += [("gemm", g) for g in self.step_gemms(stage)]
            order += [("kernel", k) for k in self.stage_kernels(stage)]
        return order


# ---- the plan: a program bound to sizes -----------------------------------------------------------

@dataclass(frozen=True)
class GemmShape:
    layer: int
    m: int
    n: int
    k: int
    per: str                  # "sequence", "chunk" or "step"
    calls: int                # cuBLAS calls of this GEMM in this layer over the whole run
    flops: int                # per call (a full chunk for "chunk")


@dataclass(frozen=True)
class LayerCost:
    layer: int
    sizes: dict
    launches_per_step: int
    flops_per_step: int
    bytes_per_step: int
    launches_total: int
    flops_total: int
    bytes_total: int


@dataclass(frozen=True)
class Plan:
    """A Program bound to a network and a run shape. The *_per_step figures are for one time step of
    the whole network (all layers) without the hoisted projections; `costs` has them per layer, and
    the totals of the whole run with the projections."""

    program: Program
    network: Network
    steps: int
    batch: int
    chunk_steps: int                          # steps per input projection of layers > 0
    shapes: dict                              # gemm name -> tuple[GemmShape] (one per layer)
    costs: tuple[LayerCost, ...]

    @cached_property
    def wavefront(self) -> Wavefront:
        """(layer, step) diagonals: layer l step t runs with every (l', t') where l' + t' = l + t."""
        return wavefront(self.network.num_layers, self.steps)

    @cached_property
    def chunk_wavefront(self) -> Wavefront:
        """(layer, chunk) diagonals: the order in which backends enqueue the work."""
        return wavefront(self.network.num_layers, self.num_chunks)

    def chunk_order(self):
        """The diagonals of chunk_wavefront, computed directly (no graph): for any T."""
        L = self.network.num_layers
        for k in range(L + self.num_chunks - 1):
            yield tuple((layer, k - layer) for layer in range(L) if 0 <= k - layer < self.num_chunks)

    @property
    def launches_per_step(self) -> int:
        return sum(c.launches_per_step for c in self.costs)

    @property
    def flops_per_step(self) -> int:
        return sum(c.flops_per_step for c in self.costs)

    @property
    def bytes_per_step(self) -> int:
        return sum(c.bytes_per_step for c in self.costs)

    @property
    def flops_total(self) -> int:
        return sum(c.flops_total for c in self.costs)

    @property
    def num_chunks(self) -> int:
        return -(-self.steps // self.chunk_steps)

    def chunk_range(self, chunk: int) -> range:
        return range(chunk * self.chunk_steps, min((chunk + 1) * self.chunk_steps, self.steps))

    def layer_sizes(self, layer: int) -> dict[str, int]:
        return self.network.layer_sizes(layer)


def bind(program: Program, network: Network, steps: int, batch: int, chunk_steps: int | None = None) -> Plan:
    """The Program bound to a network and T=steps, B=batch: GEMM shapes and costs per layer."""
    if program.schedule == "layers" or network.num_layers == 1:
        chunk = steps
    else:
        chunk = DEFAULT_CHUNK_STEPS if chunk_steps is None else chunk_steps
        if not isinstance(chunk, int) or chunk < 1:
            raise CompileError(f"chunk_steps must be a positive integer, got {chunk_steps!r}")
        chunk = min(chunk, steps)
    num_chunks = -(-steps // chunk)
    shapes = {g.name: tuple(_gemm_shape(g, network, layer, steps, batch, chunk, num_chunks)
                            for layer in range(network.num_layers)) for g in program.gemms}
    costs = tuple(_layer_cost(program, network, layer, steps, batch, shapes) for layer in range(network.num_layers))
    return Plan(program, network, steps, batch, chunk, shapes, costs)


def _gemm_shape(gemm: Gemm, network: Network, layer: int, T: int, B: int, chunk: int, num_chunks: int) -> GemmShape:
    sizes = network.layer_sizes(layer)
    n, k = gemm.n(sizes), gemm.k(sizes)
    if not gemm.hoisted:
        return GemmShape(layer, B, n, k, "step", T, matmul_flops(n, k, B))
    if layer == 0 or num_chunks == 1:
        return GemmShape(layer, T * B, n, k, "sequence", 1, matmul_flops(n, k, T * B))
    # Chunks may be uneven (the last one shorter); the FLOPs per call are those of a full chunk.
    return GemmShape(layer, chunk * B, n, k, "chunk", num_chunks, matmul_flops(n, k, chunk * B))


def _layer_cost(program: Program, network: Network, layer: int, T: int, B: int, shapes: dict) -> LayerCost:
    sizes = network.layer_sizes(layer)
    launches = flops = moved = 0
    for g in program.gemms:
        if g.hoisted:
            continue
        s = shapes[g.name][layer]
        launches += 1
        flops += s.flops
        moved += FLOAT_BYTES * (s.m * s.k + s.n * s.k + s.m * s.n)
    for kern in program.kernels:
        d = sizes[kern.dim]
        launches += 1
        flops += kern.flops_per_element * B * d
        for load in kern.loads:
            if load.access is not None:
                moved += FLOAT_BYTES * (d if load.access.rows == "vector" else B * d)
        moved += FLOAT_BYTES * B * d * len(kern.stores)
    hoisted_launches = hoisted_flops = hoisted_bytes = 0
    for g in program.hoisted_gemms:
        s = shapes[g.name][layer]
        rows = T * B
        hoisted_launches += s.calls * (2 if g.has_bias else 1)
        hoisted_flops += matmul_flops(s.n, s.k, rows)
        hoisted_bytes += FLOAT_BYTES * (rows * s.k + s.calls * s.n * s.k + rows * s.n)
        if g.has_bias:
            hoisted_bytes += FLOAT_BYTES * (rows * s.n + s.calls * s.n)
    return LayerCost(layer, dict(sizes), launches, flops, moved, launches * T + hoisted_launches,
                     flops * T + hoisted_flops, moved * T + hoisted_bytes)


# ---- weight packing: the layout is data in the Program, applied here and nowhere else ---------------

@dataclass(frozen=True)
class PackedGemm:
    weight: np.ndarray                        # (N, K): Y = X @ weight.T
    bias: np.ndarray | None                   # (N,) added to every row (folded biases), or None


def pack_weights(program: Program, network: Network, params: Params, layer: int,
                 dtype=np.float64) -> dict[str, PackedGemm]:
    """Pack one layer's parameters into the GEMM matrices, following each Gemm's recorded layout. A network whose
    cell has heads or reductions is packed in its dense form (the Program's; engine/dense.py)."""
    network, params = dense(network, params)
    sizes = network.layer_sizes(layer)
    values = params[layer]
    cell = program.cell
    packed: dict[str, PackedGemm] = {}
    for gemm in program.gemms:
        n, k = gemm.n(sizes), gemm.k(sizes)
        weight = np.zeros((n, k), dtype=np.float64)
        bias = np.zeros(n, dtype=np.float64) if gemm.has_bias else None
        for index, term in enumerate(gemm.terms):
            rows = _term_rows(gemm, index, sizes)
            for matmul in term.matmuls:
                w_name, operand = cell[matmul].args
                off = gemm.operand_offset(operand)(sizes)
                w = np.asarray(values[w_name], dtype=np.float64)
                weight[rows, off:off + w.shape[1]] += w
            for leaf in term.biases:
                node = cell[leaf]
                bias[rows] += float(node.attr("value")) if node.op == "const" else np.asarray(values[leaf],
                                                                                               dtype=np.float64)
        packed[gemm.name] = PackedGemm(weight.astype(dtype), None if bias is None else bias.astype(dtype))
    return packed


def _term_rows(gemm: Gemm, index: int, sizes: dict) -> slice:
    slot = gemm.term_slot(index)
    d = sizes[gemm.terms[index].dim]
    start = slot.offset(sizes)
    return slice(start, start + slot.stride * (d - 1) + 1, slot.stride)


def slot_columns(slot_or_access, sizes: dict, dim_size: int) -> slice:
    """The column slice of a value of size dim_size at a Slot or Access."""
    start = slot_or_access.offset(sizes)
    return slice(start, start + slot_or_access.stride * (dim_size - 1) + 1, slot_or_access.stride)


# ---- a readable, JSON-able view -------------------------------------------------------------------

def gemm_to_dict(gemm: Gemm, plan: Plan | None = None) -> dict:
    out: dict[str, Any] = {
        "name": gemm.name, "stage": gemm.stage, "operands": [op.name for op in gemm.operands],
        "blocks": [{"name": t.name, "output": t.output, "matmuls": list(t.matmuls), "biases": list(t.biases),
                    "dim": t.dim} for t in gemm.terms],
        "layout": gemm.layout, "layout_text": gemm.layout_text(), "n_expr": str(gemm.n), "k_expr": str(gemm.k),
        "input_buffer": gemm.in_buffer, "output_buffer": gemm.out_buffer,
    }
    if plan is not None:
        if gemm.hoisted:
            out["input_buffer"] = plan.program.input_buffer
        shapes = plan.shapes[gemm.name]
        first = shapes[0]
        out.update(m=first.m, n=first.n, k=first.k, flops=first.flops,
                   per="sequence" if gemm.hoisted else "step",
                   shapes=[{"layer": s.layer, "m": s.m, "n": s.n, "k": s.k, "per": s.per, "calls": s.calls,
                            "flops": s.flops} for s in shapes])
    return out


def human_count(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.3g}"

