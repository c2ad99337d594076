"""explain(): what the compiler did to a cell, as JSON (for the app) and as text (for people).

It shows the graph after each pass, the GEMM groups with their packed layouts and shapes, the
generated kernels with their sources, the costs per step and the wavefront. Everything comes from
the Plan (engine/plan.py); nothing here recomputes a decision.

    engine.explain_json("lstm", input_size=64, hidden_size=256, num_layers=2, steps=50, batch=16)
    print(engine.explain(my_cell, passes={"fuse_elementwise": False}))     # text
"""
from __future__ import annotations

from typing import Any

from .codegen import text_equations
from .errors import CompileError
from .gallery import Preset
from .gallery import get as get_preset
from .ir import CellGraph
from .network import Network
from .plan import Plan, gemm_to_dict, human_count, make_plan

DEFAULT_SIZES = {"input_size": 32, "hidden_size": 64, "num_layers": 1, "steps": 16, "batch": 8}


def build_plan(cell_or_network, input_size: int | None = None, hidden_size: int | None = None,
               num_layers: int | None = None, steps: int | None = None, batch: int | None = None, passes=None,
               layout: str = "blocked", chunk_steps: int | None = None) -> Plan:
    """The Plan explain() describes. cell_or_network: a Network, CellGraph, Preset, preset name or JSON dict."""
    doc = ""
    network = None
    if isinstance(cell_or_network, str):
        cell_or_network = get_preset(cell_or_network)
    if isinstance(cell_or_network, dict):
        from .serialize import from_dict
        cell_or_network = from_dict(cell_or_network)
    if isinstance(cell_or_network, Preset):
        doc = cell_or_network.equations_doc
        cell_or_network = cell_or_network.cell
    if isinstance(cell_or_network, Network):
        network = cell_or_network
        cell = network.cell
    elif isinstance(cell_or_network, CellGraph):
        cell = cell_or_network
    else:
        raise CompileError(f"explain needs a cell, network, preset or preset name, got "
                           f"{type(cell_or_network).__name__}")
    sizes = dict(DEFAULT_SIZES)
    if network is not None:
        sizes.update(input_size=network.input_size, hidden_size=network.hidden_size,
                     num_layers=network.num_layers)
    for key, value in (("input_size", input_size), ("hidden_size", hidden_size), ("num_layers", num_layers),
                       ("steps", steps), ("batch", batch)):
        if value is not None:
            sizes[key] = value
    network = Network(cell, sizes["input_size"], sizes["hidden_size"], sizes["num_layers"])
    return make_plan(network, sizes["steps"], sizes["batch"], passes, layout=layout, chunk_steps=chunk_steps,
                     doc=doc)


def explain(cell_or_network, input_size: int | None = None, hidden_size: int | None = None,
            num_layers: int | None = None, steps: int | None = None, batch: int | None = None, passes=None,
            layout: str = "blocked", chunk_steps: int | None = None, as_json: bool = False):
    """explain_text(...), or explain_json(...) with as_json=True."""
    args = (cell_or_network, input_size, hidden_size, num_layers, steps, batch, passes, layout, chunk_steps)
    return explain_json(*args) if as_json else explain_text(*args)


def explain_json(cell_or_network, input_size: int | None = None, hidden_size: int | None = None,
                 num_layers: int | None = None, steps: int | None = None, batch: int | None = None,
                 passes=None, layout: str = "blocked", chunk_steps: int | None = None) -> dict[str, Any]:
    """Everything the compiler decided, as plain JSON-able data (see the module docstring)."""
    plan = build_plan(cell_or_network, input_size, hidden_size, num_layers, steps, batch, passes, layout,
                      chunk_steps)
    return plan_to_json(plan)


def plan_to_json(plan: Plan) -> dict[str, Any]:
    program, network = plan.program, plan.network
    cell = program.source_cell
    return {
        "cell": cell.name,
        "hash": cell.structural_hash,
        "sizes": {"I": network.input_size, "H": network.hidden_size, "L": network.num_layers, "T": plan.steps,
                  "B": plan.batch},
        "equations": text_equations(program.cell),
        "passes": [{"name": p.name, "enabled": p.enabled, "why": p.why, "summary": p.summary, "after": p.after}
                   for p in program.passes],
        "gemms": [gemm_to_dict(g, plan) for g in program.gemms],
        "kernels": [{"name": k.name, "stage": k.stage, "dim": k.dim, "nodes": list(k.nodes),
                     "inputs": list(k.inputs), "outputs": list(k.outputs), "source": k.source,
                     "params": [p.name for p in k.params]} for k in program.kernels],
        "step_order": [{"kind": kind, "name": item.name, "stage": item.stage} for kind, item in program.step_order()],
        "buffers": [{"name": b.name, "rows": "T*B" if b.rows == "sequence" else "B", "cols": str(b.cols),
                     "double": b.double, "role": b.role, "doc": b.doc} for b in program.buffers],
        "states": {h.state: h.slot.describe() for h in program.homes},
        "launches_per_step": plan.launches_per_step,
        "flops_per_step": plan.flops_per_step,
        "bytes_per_step": plan.bytes_per_step,
        "flops_total": plan.flops_total,
        "per_layer": [{"layer": c.layer, "sizes": c.sizes, "launches_per_step": c.launches_per_step,
                       "flops_per_step": c.flops_per_step, "bytes_per_step": c.bytes_per_step,
                       "launches_total": c.launches_total, "flops_total": c.flops_total,
                       "bytes_total": c.bytes_total} for c in plan.costs],
        "node_groups": dict(program.node_groups),
        "schedule": program.schedule,
        "chunk_steps": plan.chunk_steps,
        "chunk_wavefront": plan.chunk_wavefront.to_dict(),
        "wavefront": plan.wavefront.to_dict(),
        "layout": program.layout,
        "precision": program.precision,
        "num_stages": program.num_stages,
        "program_key": program.key,
        "source": program.source,
    }


def explain_text(cell_or_network, input_size: int | None = None, hidden_size: int | None = None,
                 num_layers: int | None = None, steps: int | None = None, batch: int | None = None,
                 passes=None, layout: str = "blocked", chunk_steps: int | None = None,
                 sources: bool = True) -> str:
    """The same as explain_json, for reading in a terminal."""
    plan = build_plan(cell_or_network, input_size, hidden_size, num_layers, steps, batch, passes, layout,
                      chunk_steps)
    return plan_to_text(plan, sources=sources)


def plan_to_text(plan: Plan, sources: bool = True) -> str:
    program, network = plan.program, plan.network
    cell = program.source_cell
    out = [f"cell '{cell.name}' (structure hash {cell.structural_hash})",
           f"sizes: I={network.input_size} H={network.hidden_size} L={network.num_layers} T={plan.steps} "
           f"B={plan.batch}", "", "equations:"]
    out += [f"  {eq}" for eq in text_equations(program.cell)]
    out += ["", "passes (in order; each shows the program after it):"]
    previous = None
    for i, p in enumerate(program.passes, 1):
        out.append(f"{i:2d}. {p.name:<17} {'on ' if p.enabled else 'OFF'}  {p.why}")
        out.append(f"    -> {p.summary}")
        if p.after == previous:
            out.append("    (program unchanged)")
        else:
            out += ["    " + line for line in p.after.splitlines()]
        previous = p.after
    out += ["", "GEMMs:"]
    for g in program.gemms:
        shapes = plan.shapes[g.name]
        first = shapes[0]
        where = "hoisted, once per sequence" if g.hoisted else f"stage {g.stage}, every step"
        out.append(f"  {g.name} ({where}): M={first.m} N={first.n} K={first.k}, "
                   f"{human_count(first.flops)} FLOP per call")
        for s in shapes[1:]:
            if (s.m, s.n, s.k, s.per) != (first.m, first.n, first.k, first.per):
                out.append(f"    layer {s.layer}: M={s.m} N={s.n} K={s.k} per {s.per} x{s.calls}")
        out.append(f"    operands: {', '.join(o.name for o in g.operands)} (K = {g.k})")
        out.append(f"    weight layout: {g.layout_text()}")
        for t in g.terms:
            bias = f" + {' + '.join(t.biases)}" if t.biases else ""
            out.append(f"    {t.name} -> {t.output}: {' + '.join(t.matmuls)}{bias}")
    out += ["", "kernels:"]
    for k in program.kernels:
        out.append(f"  {k.name} (stage {k.stage}, threads over (B, {k.dim})): computes "
                   f"{', '.join(k.nodes) or '-'}")
        out.append(f"    reads {', '.join(k.inputs) or '-'}; writes {', '.join(k.outputs) or '-'}")
    out += ["", "one step of one layer: " + " -> ".join(item.name for _, item in program.step_order())]
    out.append("states: " + "; ".join(f"{h.state} in {h.slot.describe()}" for h in program.homes))
    out += ["", f"cost per time step (all {network.num_layers} layer(s)): {plan.launches_per_step} launches, "
                f"{human_count(plan.flops_per_step)} FLOP, {human_count(plan.bytes_per_step)}B moved; "
                f"whole run: {human_count(plan.flops_total)} FLOP"]
    wf = plan.wavefront
    out.append(f"schedule: {program.schedule}; {plan.num_chunks} chunk(s) of {plan.chunk_steps} step(s) per layer; "
               f"wavefront depth {wf.depth} for {wf.num_layers} x {wf.num_steps} (layer, step) cells, up to "
               f"{wf.max_parallel} at once")
    grid = wf.step_of()
    if len(grid) * len(grid[0]) <= 400:
        out.append("wavefront step of each (layer, t):")
        for layer, row in enumerate(grid):
            out.append(f"  layer {layer}: " + " ".join(f"{k:2d}" for k in row))
    if sources:
        out += ["", "CUDA source:", program.source]
    return "\n".join(out)
