"""Lowering to a Program: give every value a place in memory and spell each kernel's loads and stores.

This is not an optimization and cannot be switched off: it turns the decisions of the passes into
the Plan's data (buffers, slots, kernel arguments). Rules:
- the layer input (T*B, I) is the hoisted GEMMs' operand as it is; the layer output is (T*B, H);
- each per-step GEMM has an operand buffer (B, K) and a result buffer (B, N); a hoisted GEMM has a
  result buffer (T*B, N);
- a state that a stage-1 GEMM reads lives in that GEMM's operand buffer (double-buffered), so the
  next state is written straight where the next step's GEMM reads it; other states get a (B, H)
  double buffer of their own;
- a value that crosses kernels is written once, to the GEMM operand it feeds, the state it becomes,
  or else a (B, D) spill buffer, and read back from there.
"""
from __future__ import annotations

from ..c_names import c_identifier
from ..dense import reduction_terms
from ..ir import CellGraph
from ..ops import cuda_helpers
from ..plan import (
    Access,
    Buffer,
    Kernel,
    KernelParam,
    Lin,
    Load,
    PassRecord,
    Program,
    Slot,
    StateHome,
    Statement,
    Store,
)
from .analysis import Value, consumers, num_stages, state_next_values, step_graph
from .fusion import gemm_operands, native_homes
from .lowering import Lowering, Region


def lower(low: Lowering, records: tuple[PassRecord, ...], key: str) -> Program:
    cell = low.cell
    values = step_graph(low)
    layout = _Layout(low, values)
    kernels = tuple(_kernel(region, layout) for region in low.regions)
    return Program(cell=cell, source_cell=low.source_cell, passes=records, gemms=low.gemms, kernels=kernels,
                   buffers=tuple(layout.buffers.values()), homes=tuple(StateHome(s, layout.state_home[s])
                                                                       for s in cell.state_names),
                   input_buffer=layout.input_buffer, output_buffer=layout.output_buffer, schedule=low.schedule,
                   layout=low.layout, precision=low.precision, node_groups=_node_groups(low, kernels, values),
                   num_stages=num_stages(low), key=key)


class _Layout:
    """Buffers, the state homes, and where each value is stored and read."""

    def __init__(self, low: Lowering, values: dict[str, Value]):
        self.low, self.values = low, values
        cell = low.cell
        self.term_of = {}            # a GEMM term's name -> (its GEMM, its index): the first GEMM that has it
        for g in reversed(low.gemms):
            for index in reversed(range(len(g.terms))):
                self.term_of[g.terms[index].name] = (g, index)
        self.buffers: dict[str, Buffer] = {}
        self.input_buffer = self._add(f"{cell.input.name}_seq", "sequence", Lin(i=1), "input",
                                      doc=f"layer input: {cell.input.name} for layer 0, layer l-1's output for layer l")
        self.output_buffer = self._add(f"{cell.output}_seq", "sequence", Lin.of(cell.output_dim), "output",
                                       doc=f"layer output: state {cell.output} at every step")
        homes = native_homes(low)
        for g in low.gemms:
            if g.hoisted:
                self._add(g.out_buffer, "sequence", g.n, "gemm_result", doc=f"{g.name}: projection of every step")
                continue
            double = any(homes.get(op.name) == g.name for op in g.operands)
            self._add(g.in_buffer, "batch", g.k, "gemm_operands", double=double,
                      doc=f"{g.name} operands [{', '.join(op.name for op in g.operands)}]")
            self._add(g.out_buffer, "batch", g.n, "gemm_result", doc=f"{g.name} result")
            if reduction_terms(cell, g) is not None:
                self._add(g.partial_buffer, "batch", g.n + g.n, "partials",
                          doc=f"{g.name}: per term, each wavefront block's partials over its units")
        self.gemm_by_name = {g.name: g for g in low.gemms}
        self.state_home: dict[str, Slot] = {}
        for s in cell.state_names:
            if s in homes:
                g = self.gemm_by_name[homes[s]]
                self.state_home[s] = Slot(g.in_buffer, g.operand_offset(s), 1, "cur")
            else:
                buf = self._add(f"{s}_state", "batch", Lin.of(cell.state_dim(s)), "state", double=True,
                                doc=f"state {s}")
                self.state_home[s] = Slot(buf, Lin(), 1, "cur")
        self.region_of = {v: r for r in low.regions for v in r.values + r.passthrough}
        # Parameter vectors are kernel arguments named <parameter>_<op>, one C name each in the whole program.
        self.param_names: dict[str, str] = {}
        taken: set[str] = set()
        for name, value in values.items():
            if value.kind == "leaf" and value.op in ("bias", "vector", "weight"):
                self.param_names[name] = c_identifier(f"{name}_{value.op}", taken)
                taken.add(self.param_names[name])
        self.stores = self._stores(homes)

    def _add(self, base: str, rows: str, cols: Lin, role: str, double: bool = False, doc: str = "") -> str:
        base = c_identifier(base)          # a struct member and kernel argument: e.g. no '__' from a node '_x'
        name, k = base, 2
        while name in self.buffers or c_identifier(name) != name:
            name = f"{base}{k}"
            k += 1
        self.buffers[name] = Buffer(name, rows, cols, role, double, doc)
        return name

    def _stores(self, homes: dict[str, str]) -> dict[str, list[tuple[Slot, str]]]:
        low, values = self.low, self.values
        operand_of = gemm_operands(low)
        next_of = state_next_values(low)
        users = consumers(values)
        stores: dict[str, list[tuple[Slot, str]]] = {}
        for name in self.region_of:
            slots: list[tuple[Slot, str]] = []
            for g in operand_of.get(name, ()):
                if homes.get(name) != g.name:
                    version = "cur" if self.buffers[g.in_buffer].double else None
                    slots.append((Slot(g.in_buffer, g.operand_offset(name), 1, version), f"operand of {g.name}"))
            for state in next_of.get(name, ()):
                home = self.state_home[state]
                slots.append((Slot(home.buffer, home.offset, 1, "next"), f"state {state} at step t"))
            if low.cell.next_of(low.cell.output) == name:
                slots.append((Slot(self.output_buffer), "layer output at step t"))
            elsewhere = [u for u in users[name] if self.region_of.get(u) is not self.region_of[name]]
            if values[name].computed and elsewhere and not slots:
                buf = self._add(f"{name}_tmp", "batch", Lin.of(values[name].dim), "spill",
                                doc=f"{name}, read by a later kernel of the step")
                slots.append((Slot(buf), "read by " + ", ".join(elsewhere)))
            stores[name] = slots
        return stores

    def read_access(self, name: str) -> tuple[Slot | None, str]:
        """Where a kernel reads a value computed or copied elsewhere: (slot, rows), or (None, kind)."""
        value = self.values[name]
        if value.kind == "leaf":
            if value.op == "input":
                return Slot(self.input_buffer), "sequence"
            if value.op == "state":
                return self.state_home[name], "batch"
            return None, value.op
        if value.kind == "term" and name in self.term_of:
            g, index = self.term_of[name]
            return g.term_slot(index), "sequence" if g.hoisted else "batch"
        slot = self.stores[name][0][0]
        return slot, self.buffers[slot.buffer].rows


class _Namer:
    """C identifiers: graph names where possible, respelled only where C, the headers or the kernel's own names
    reserve them (engine/c_names.py)."""

    def __init__(self, taken: set[str]):
        self.taken = set(taken)
        self.names: dict[str, str] = {}

    def __call__(self, value: str) -> str:
        if value not in self.names:
            name = c_identifier(value, self.taken)
            self.taken.add(name)
            self.names[value] = name
        return self.names[value]


def _kernel(region: Region, layout: _Layout) -> Kernel:
    values = layout.values
    params: dict[str, KernelParam] = {}

    def buffer_param(slot: Slot, writes: bool) -> str:
        name = slot.buffer + (f"_{slot.version}" if slot.version else "")
        buf = layout.buffers[slot.buffer]
        old = params.get(name)
        doc = f"({'T*B' if buf.rows == 'sequence' else 'B'}, {buf.cols}) {buf.doc}" + (
            f", version {slot.version}" if slot.version else "")
        params[name] = KernelParam(name, slot.buffer, "buffer", slot.version, writes or bool(old and old.writes), doc)
        return name

    def access(slot: Slot, writes: bool) -> Access:
        buf = layout.buffers[slot.buffer]
        return Access(buffer_param(slot, writes), buf.rows, buf.cols, slot.offset, slot.stride)

    # Values this kernel reads: arguments of what it computes, through inlined uniform values.
    computed = list(region.values)
    here = set(computed)
    inline: list[str] = []
    reads: list[str] = []

    def visit(arg: str):
        v = values[arg]
        if arg in here or arg in inline or arg in reads:
            return
        if v.computed and v.uniform:
            for a in v.args:
                visit(a)
            inline.append(arg)
        else:
            reads.append(arg)

    for name in computed:
        for a in values[name].args:
            visit(a)
    for name in region.passthrough:
        if name not in reads:
            reads.append(name)

    # Parameter-vector arguments are named after the parameter; make sure no value takes those names.
    param_names = {a: layout.param_names[a] for a in reads if values[a].kind == "leaf" and values[a].op in
                   ("bias", "vector", "weight")}
    buffer_names = {b + s for b in layout.buffers for s in ("", "_cur", "_next")}
    namer = _Namer(cuda_helpers() | set(layout.param_names.values()) | buffer_names)

    loads: list[Load] = []
    for name in reads:
        v = values[name]
        var = namer(name)
        if v.kind == "leaf" and v.op == "const":
            loads.append(Load(var, name, literal=float(dict(v.attrs)["value"])))
            continue
        if v.kind == "leaf" and v.op in ("bias", "vector"):
            pname = param_names[name]
            params[pname] = KernelParam(pname, name, "param", doc=f"({v.dim},) parameter {name}")
            loads.append(Load(var, name, Access(pname, "vector")))
            continue
        slot, _ = layout.read_access(name)
        loads.append(Load(var, name, access(slot, writes=False)))

    statements: list[Statement] = []
    for name in [v for v in values if v in inline] + computed:
        v = values[name]
        statements.append(Statement(namer(name), v.op, tuple(namer(a) for a in v.args), v.attrs, name))

    stores: list[Store] = []
    for name in computed + list(region.passthrough):
        for slot, why in layout.stores.get(name, ()):
            stores.append(Store(namer(name), access(slot, writes=True), why))

    nodes: dict[str, None] = {}            # the graph nodes the kernel stands for, in order, each once
    for name in [v for v in values if v in inline] + computed:
        nodes.update(dict.fromkeys(values[name].covers))
    inputs = tuple(load.value for load in loads if load.literal is None)
    outputs = tuple(dict.fromkeys(s_name for s_name in computed + list(region.passthrough)
                                  if layout.stores.get(s_name)))
    ordered_params = sorted(params.values(), key=lambda p: (p.writes, p.kind != "buffer", p.name))
    return Kernel(region.name, region.stage, region.dim, tuple(nodes), inputs, outputs, tuple(ordered_params),
                  tuple(loads), tuple(statements), tuple(stores))


def _node_groups(low: Lowering, kernels: tuple[Kernel, ...], values: dict[str, Value]) -> dict[str, str]:
    source: CellGraph = low.source_cell
    groups: dict[str, str] = {}
    for g in low.gemms:
        for t in g.terms:
            for m in t.matmuls:
                groups[m] = g.name
    for k in kernels:
        for n in k.nodes:
            groups.setdefault(n, k.name)
    cell = low.cell
    for node in source.nodes:
        if node.is_leaf or node.name in groups:
            continue
        if node.name not in cell.by_name:
            groups[node.name] = "(pruned: no state depends on it)"
        elif cell[node.name].op == "const":
            groups[node.name] = "(folded to a constant)"
        else:
            groups[node.name] = "(not computed)"
    return {n.name: groups[n.name] for n in source.nodes if not n.is_leaf}
