"""explain(): what the compiler did to a cell, as JSON (for the app) and as text (for people).

It shows the graph after each pass, the GEMM groups with their packed layouts and shapes, the
generated kernels with their sources, the costs per step and the wavefront, and what each GPU
schedule (fused, graph, persistent) would do with it. Everything comes from the Plan
(engine/plan.py) and engine/schedules/report.py; nothing here recomputes a decision.

    engine.explain_json("lstm", input_size=64, hidden_size=256, num_layers=2, steps=50, batch=16)
    print(engine.explain(my_cell, passes={"fuse_elementwise": False}))     # text
    print(engine.explain_text("lstm", schedule="persistent"))              # + tiling, launches, its CUDA

The JSON always has a "schedules" section. The text shows it only when a schedule is asked for: it
depends on the device (tilings use this GPU's limits, else a nominal H100's) and on the autotuner's
cache, and the plain text stays the same on every machine.
"""
from __future__ import annotations

from typing import Any

from .arguments import SIZE_LIMIT, integer
from .autodiff import AutodiffError, backward_graph
from .autodiff.fused_describe import describe as describe_fused
from .autodiff.fused_planner import training_plan
from .autodiff.hoist import split_backward
from .codegen import text_equations
from .compiler import compile_cell, make_plan
from .dense import dense_form, wavefront_network
from .errors import CompileError
from .gallery import Preset
from .gallery import get as get_preset
from .ir import CellGraph
from .multigpu.plan import PipelinePlan, plan_pipeline
from .nets.data import Net
from .network import Network
from .passes.scan import analyse_scan
from .plan import Plan, gemm_to_dict, human_count
from .schedules.report import check_schedule, schedules_report
from .serialize import from_dict

DEFAULT_SIZES = {"input_size": 32, "hidden_size": 64, "num_layers": 1, "steps": 16, "batch": 8}


RUN_LIMIT = 1 << 40      # steps or batch of a plan: far past any run, small enough for every count to stay exact
GRID_LIMIT = 1 << 18     # layer-steps of the wavefront grid explain lays out, one by one (about 6 s at the limit)


def weights_phrase(names: list[str]) -> str:
    """"weight 'R'" or "weights 'R_i', 'R_f'": how the explain text and the Schedule page name a group of weights."""
    quoted = ", ".join(f"'{n}'" for n in names)
    return f"weight {quoted}" if len(names) == 1 else f"weights {quoted}"


def flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise CompileError(f"argument '{name}' must be True or False, got {type(value).__name__}; hint: "
                           f"{name}=True or {name}=False")
    return value


def check_grid(num_layers: int, steps: int) -> None:
    """Refuse a wavefront grid too large to lay out: explain describes every layer-step of it."""
    if num_layers * steps > GRID_LIMIT:
        raise CompileError(f"argument 'steps': explain lays out every layer-step of the wavefront, and "
                           f"{num_layers} layer(s) x {steps:,} steps is more than {GRID_LIMIT:,}; hint: explain "
                           f"at most {max(GRID_LIMIT // num_layers, 1):,} steps (the plan is the same for any T, "
                           "only the grid grows)")


def build_plan(cell_or_network, input_size: int | None = None, hidden_size: int | None = None,
               num_layers: int | None = None, steps: int | None = None, batch: int | None = None, passes=None,
               layout: str = "blocked", chunk_steps: int | None = None) -> Plan:
    """The Plan explain() describes. cell_or_network: a Network, CellGraph, Preset, preset name or JSON dict."""
    network, steps, batch, doc = resolve(cell_or_network, input_size, hidden_size, num_layers, steps, batch)
    return make_plan(network, steps, batch, passes, layout=layout, chunk_steps=chunk_steps, doc=doc)


def resolve(cell_or_network, input_size: int | None = None, hidden_size: int | None = None,
            num_layers: int | None = None, steps: int | None = None,
            batch: int | None = None) -> tuple[Network, int, int, str]:
    """(network, steps, batch, the preset's documentation) for the arguments of explain()."""
    doc = ""
    network = None
    if isinstance(cell_or_network, str):
        cell_or_network = get_preset(cell_or_network)
    if isinstance(cell_or_network, dict):
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
        raise CompileError(f"argument 'cell_or_network' must be a cell, network, preset or preset name, got "
                           f"{type(cell_or_network).__name__}; hint: e.g. 'lstm', engine.preset('lstm').cell or "
                           "engine.Network(cell, input_size, hidden_size)")
    sizes = dict(DEFAULT_SIZES)
    if network is not None:
        sizes.update(input_size=network.input_size, hidden_size=network.hidden_size,
                     num_layers=network.num_layers)
    for key, value in (("input_size", input_size), ("hidden_size", hidden_size), ("num_layers", num_layers),
                       ("steps", steps), ("batch", batch)):
        if value is not None:
            sizes[key] = integer(value, key, high=RUN_LIMIT if key in ("steps", "batch") else SIZE_LIMIT)
    proj_size = network.proj_size if network is not None else None      # a given Network keeps its P
    network = Network(cell, sizes["input_size"], sizes["hidden_size"], sizes["num_layers"], proj_size)
    return network, sizes["steps"], sizes["batch"], doc


def explain(cell_or_network, input_size: int | None = None, hidden_size: int | None = None,
            num_layers: int | None = None, steps: int | None = None, batch: int | None = None, passes=None,
            layout: str = "blocked", chunk_steps: int | None = None, as_json: bool = False,
            schedule: str | None = None, precision: str = "float32", gpus: int | None = None):
    """explain_text(...), or explain_json(...) with as_json=True. A network of blocks (engine.Net) or a pipeline
    plan (engine.multigpu.PipelinePlan) is explained as its plan over `gpus` GPUs (default 1): which layers on which
    GPU, the chunk size, the predicted bubble, and the measured one where the plan was measured (tune_pipeline)."""
    if isinstance(cell_or_network, (Net, PipelinePlan)):
        if isinstance(cell_or_network, PipelinePlan):
            plan = cell_or_network
        else:
            plan = plan_pipeline(cell_or_network, 1 if gpus is None else gpus,
                                 DEFAULT_SIZES["steps"] if steps is None else steps,
                                 DEFAULT_SIZES["batch"] if batch is None else batch)
        return plan.as_dict() if as_json else plan.describe()
    if gpus is not None:
        raise CompileError("explain(gpus=N) plans a network of blocks (engine.Net) over N GPUs; a single cell runs on "
                           "one; hint: engine.Net(input_size, (engine.Layers(cell, hidden_size, num_layers),))")
    args = (cell_or_network, input_size, hidden_size, num_layers, steps, batch, passes, layout, chunk_steps)
    if flag(as_json, "as_json"):
        return explain_json(*args, schedule=schedule, precision=precision)
    return explain_text(*args, schedule=schedule, precision=precision)


def explain_json(cell_or_network, input_size: int | None = None, hidden_size: int | None = None,
                 num_layers: int | None = None, steps: int | None = None, batch: int | None = None,
                 passes=None, layout: str = "blocked", chunk_steps: int | None = None,
                 schedule: str | None = None, precision: str = "float32",
                 allow_tensor_core_fp32: bool = False) -> dict[str, Any]:
    """Everything the compiler decided, as plain JSON-able data (see the module docstring).

    schedule: None, "fused", "graph", "persistent" or "auto". The "schedules" section describes every
    schedule either way; a wavefront schedule asked for (or picked by "auto") brings its generated
    CUDA, in data["schedules"][name]["source"]. precision: the mode the wavefront schedules are planned in
    (tf32/float16/bfloat16/float32x3 tile their GEMMs for tensor cores; the fused backend takes every mode, its
    GEMMs on cuBLAS: engine/schedules/fused_modes.py).
    allow_tensor_core_fp32: the autotuner's choices shown are those tuned with float32x3 allowed (engine.run's
    flag of that name), for precision="float32"."""
    check_schedule(schedule)
    network, steps, batch, doc = resolve(cell_or_network, input_size, hidden_size, num_layers, steps, batch)
    check_grid(network.num_layers, steps)
    plan = make_plan(network, steps, batch, passes, layout=layout, chunk_steps=chunk_steps, doc=doc)
    data = plan_to_json(plan)
    data["backward"] = backward_to_json(network.cell)
    data["scan"] = scan_to_json(network.cell)
    data["dense_form"] = dense_to_json(network, plan)
    data["schedules"] = explain_schedules(plan, passes, schedule, doc, precision, allow_tensor_core_fp32)
    return data


def dense_to_json(network: Network, plan: Plan) -> dict[str, Any]:
    """What the compiled paths run in place of the cell's reductions and heads (engine/dense.py), and what it costs
    per step and layer: a reduction is a GEMM by a fixed H x H matrix (2 B H^2 FLOPs) that reads a value of the step,
    so it starts a stage of its own (on the wavefront schedules, one more barrier); a weight of k heads is multiplied
    as its dense block-diagonal matrix (k times the FLOPs of its blocks), except where the persistent schedule's
    blocks each lie in one head (engine/schedules/heads.py gemm_heads)."""
    form = dense_form(network.cell)
    fixed = dict(form.fixed)
    matrix = {op: name for name, op in fixed.items()}
    stage_of = {m: g.stage for g in plan.program.gemms for t in g.terms for m in t.matmuls}   # the dense cell's matmuls
    reductions = [{"node": n.name, "op": n.op, "matrix": matrix[n.op], "stage": stage_of.get(n.name)}
                  for n in network.cell.nodes if n.op in matrix and n.name in stage_of]
    H, B = network.hidden_size, plan.batch
    stages = [g.stage for g in plan.program.gemms if g.stage != "hoisted"]
    in_step = sum(1 for r in reductions if r["stage"] != "hoisted")      # the input side's run once, over all steps
    wave = compile_cell(wavefront_network(network).cell, layout="interleaved")
    wave_stages = {g.stage for g in wave.gemms if not g.hoisted} | {k.stage for k in wave.kernels}
    return {"changed": form.changed, "reductions": reductions,
            "heads": [{"weights": [name for name, j in form.heads if j == k], "heads": k}     # grouped by count
                      for k in dict.fromkeys(k for _, k in form.heads)],
            "reduction_flops_per_step": 2 * B * H * H * in_step,
            "stages_per_step": max(stages, default=1),        # step stages are numbered from 1
            # The wavefront schedules sum instead (engine/codegen/reductions.py): each block's partial sums per row
            # and term (a variance: its sum and squares) through L2, one barrier per dependent reduction, a
            # LayerNorm's mean and variance in one (engine.dense.variance_form).
            "wavefront": {"reduction_terms": sum(len(g.terms) for g in wave.gemms if g.name in wave.reductions
                                                 and not g.hoisted),
                          "stages_per_step": len(wave_stages)}}


def scan_to_json(cell: CellGraph) -> dict[str, Any]:
    """Whether the cell runs as a parallel scan over time (engine/passes/scan.py): why, or the node that stops it;
    and each scanned state's coefficients a and b (s[t] = a[t] * s[t-1] + b[t])."""
    found = analyse_scan(cell)
    return {"qualifies": found.qualifies, "reason": found.reason, "node": found.node,
            "states": {state: {"a": None if f.a is None else f.a.text, "b": None if f.b is None else f.b.text}
                       for state, f in found.scanned.items()},
            "after": list(found.after)}


def backward_to_json(cell: CellGraph) -> dict[str, Any]:
    """The cell's backward step (engine.autodiff) and how bptt splits it: the nodes of the reverse sweep, and those
    that run once a layer on T x B rows. {"error": ...} where the cell cannot be differentiated."""
    try:
        graph = backward_graph(cell)
    except AutodiffError as e:
        return {"error": str(e)}
    split = split_backward(graph)
    try:
        fused = training_plan(cell)
        launches = {"forward": [item.name for _, item in fused.forward.order],
                    "backward": [item.name for _, item in fused.backward.order]}
        fused_text = "\n" + describe_fused(fused) + "\n"
    except AutodiffError as e:
        launches, fused_text = {"error": str(e)}, f"\nfused training step: {e}\n"
    return {"nodes": [{"name": n.name, "op": n.op, "args": list(n.args), "of": n.of, "role": n.role,
                       "flows_to": n.flows_to, "recurrent": n.recurrent, "param": n.param} for n in graph.nodes],
            "saved": list(graph.saved), "per_step": [n.name for n in split.per_step],
            "after": [n.name for n in split.after], "kept_per_step": list(split.recorded),
            "fused_step": launches,
            "text": graph.describe() + split.describe() + fused_text}


def explain_schedules(plan: Plan, passes=None, schedule: str | None = None, doc: str = "",
                      precision: str = "float32", allow_tensor_core_fp32: bool = False) -> dict[str, Any]:
    """engine/schedules/report.py for this plan; the wavefront schedules get the interleaved plan they run,
    in `precision` (the autotuner's choices: those with float32x3 allowed, when allow_tensor_core_fp32)."""
    network = wavefront_network(plan.network)           # the dense form, a LayerNorm's variance as one reduction
    same = plan.program.layout == "interleaved" and plan.program.precision == precision and network is plan.network
    wavefront_plan = plan if same else make_plan(network, plan.steps, plan.batch, passes, layout="interleaved",
                                                 precision=precision, doc=doc)
    return schedules_report(plan, wavefront_plan, schedule, doc=doc, tensor_core_fp32=allow_tensor_core_fp32)


def plan_to_json(plan: Plan) -> dict[str, Any]:
    program, network = plan.program, plan.network
    cell = network.cell                  # the cell as given (the program's is its dense form, engine/dense.py)
    return {
        "cell": cell.name,
        "hash": cell.structural_hash,
        "sizes": {"I": network.input_size, "H": network.hidden_size, "L": network.num_layers, "T": plan.steps,
                  "B": plan.batch, **({"P": network.projection_size} if network.cell.uses_projection else {})},
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
                 sources: bool = True, schedule: str | None = None, precision: str = "float32") -> str:
    """The same as explain_json, for reading in a terminal. With a schedule, the schedules section too, and
    (sources=True) the generated CUDA of the graph or persistent schedule at the end."""
    check_schedule(schedule)
    network, steps, batch, doc = resolve(cell_or_network, input_size, hidden_size, num_layers, steps, batch)
    check_grid(network.num_layers, steps)
    plan = make_plan(network, steps, batch, passes, layout=layout, chunk_steps=chunk_steps, doc=doc)
    report = None if schedule is None else explain_schedules(plan, passes, schedule, doc, precision)
    return plan_to_text(plan, sources=flag(sources, "sources"), schedules=report)


def plan_to_text(plan: Plan, sources: bool = True, schedules: dict | None = None) -> str:
    program, network = plan.program, plan.network
    cell = network.cell                  # the cell as given (the program's is its dense form, engine/dense.py)
    out = [f"cell '{cell.name}' (structure hash {cell.structural_hash})",
           f"sizes: I={network.input_size} H={network.hidden_size}"
           + (f" P={network.projection_size}" if network.cell.uses_projection else "")
           + f" L={network.num_layers} T={plan.steps} B={plan.batch}", "", "equations:"]
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
    dense = dense_to_json(network, plan)
    if dense["changed"]:
        out += ["", "dense form (engine/dense.py; what the GPU paths run; the equations above are of it):"]
        if dense["reductions"]:
            in_step = sum(1 for r in dense["reductions"] if r["stage"] != "hoisted")
            out.append(f"  {len(dense['reductions'])} reduction(s) over H as GEMMs by a fixed H x H matrix, {in_step} "
                       f"in the step: {human_count(dense['reduction_flops_per_step'])} FLOP more per step and layer, "
                       f"{dense['stages_per_step']} stage(s) a step (backend 'fused')")
            wave = dense["wavefront"]
            out.append(f"  wavefront schedules: no GEMM; {wave['reduction_terms']} row sum(s) a step from each block's "
                       f"partials (B floats a block and sum, two for a variance, through L2), "
                       f"{wave['stages_per_step']} stage(s) a step, each one barrier")
        for w in dense["heads"]:
            out.append(f"  {weights_phrase(w['weights'])}: {w['heads']} heads each, multiplied as block-diagonal "
                       f"matrices ({w['heads']}x the FLOPs of their blocks); the persistent schedule reads only a "
                       "block's own head where its units lie in one (warp GEMV, or fp16/bf16 tensor cores)")
    out += ["", "linear recurrence (schedule 'scan', engine/passes/scan.py):"]
    found_scan = analyse_scan(cell)
    out += ["  " + line for line in found_scan.describe().splitlines()]
    if found_scan.qualifies:
        out.append("  precision modes: the scan's matmuls take any (tf32, float16, bfloat16 on tensor cores, float32x3 "
                   "forward only; engine/schedules/scan_modes.py); the scan itself runs in fp32")
    backward = backward_to_json(cell)
    out += ["", "backward step (training: engine.autodiff; the gradients of bptt, CellRNN and engine.train):"]
    out += ["  " + line for line in (backward.get("text") or backward["error"]).rstrip("\n").splitlines()]
    wavefront_source = None
    if schedules is not None:
        out += [""] + schedules_to_text(schedules, plan)
        wavefront_source = next((schedules[name]["source"] for name in ("graph", "persistent")
                                 if schedules[name].get("source")), None)
    if sources:
        if wavefront_source is None:
            out += ["", "CUDA source:", program.source]
        else:
            out += ["", f"CUDA source of schedule '{schedules['selected']['schedule']}' "
                        "(engine.codegen.wavefront):", wavefront_source]
    return "\n".join(out)


def registers_text(tiling: dict) -> str:
    """What a thread keeps in registers, from a schedule's tiling in explain_json."""
    if tiling["path"] == "gemv":
        kept = f"; and {tiling['carried_text']}" if tiling.get("carried_text") else ""
        return f"partial dot products of the warp GEMV (a batch of at most 4 rows: no accumulator tile){kept}"
    rows, cols = tiling["accumulator"]
    kept = f"; and {tiling['carried_text']}" if tiling.get("carried_text") else ""
    return f"a {rows} x {cols} accumulator tile per thread ({rows * cols} floats){kept}"


def schedules_to_text(report: dict, plan: Plan) -> list[str]:
    """The "schedules" section of explain_json, as lines."""
    limits = report["limits"]
    where = ("nominal limits: " if limits["nominal"] else "this GPU's limits: ") + limits["why"]
    out = [f"schedules (tilings for {limits['name']}: {limits['multiprocessors']} SMs, "
           f"{limits['smem_per_block'] / 1024:.0f} KiB shared memory per block; {where}):"]
    fused = report["fused"]
    out.append(f"  fused: {fused['launches_per_step']} launches per step from the host, "
               f"{fused['kernel_launches_per_sequence']} per sequence; {fused['sync']}")
    if "; in " in fused["how"]:                      # a precision mode: how its products run
        out.append(f"    in {fused['how'].split('; in ', 1)[1]}")
    for name in ("graph", "persistent"):
        entry = report[name]
        if not entry["eligible"]:
            out.append(f"  {name}: cannot run this cell: {entry['why_not']}")
            continue
        tiling = entry["tiling"]
        out.append(f"  {name}: {entry['how']}")
        out.append(f"    per sequence: {entry['host_launches_per_sequence']} host launch ({entry['host_launch']}), "
                   f"{entry['kernel_launches_per_sequence']} kernel launch(es), {entry['barriers_per_sequence']} "
                   f"barriers ({entry['sync']})")
        out.append(f"    replay: {entry['replay']}")
        out.append(f"    tiling ({tiling['config']}): {tiling['describe']}")
        out.append(f"    registers: {registers_text(tiling)}")
        for g in tiling["gemms"]:
            out.append(f"    {g['name']} ({g['role']}, {g['columns_per_block']} columns x K={g['k']} per block, "
                       f"{g['weight_kib_per_block']:.1f} KiB): {g['where']}")
        out += [f"    note: {note}" for note in tiling["notes"]]
    tuned = report["autotune"]
    if not tuned["choices"]:
        out.append(f"  autotuner: nothing cached for this network at T={plan.steps}, B={plan.batch} "
                   f"({tuned['cache']})")
    for choice in tuned["choices"]:
        config = f" ({choice['config']})" if choice["config"] else ""
        out.append(f"  autotuner on {choice['device']}: {choice['schedule']}{config}: {choice['why']}")
        for t in choice["timings"]:
            result = f"{t['ms']:.3g} ms" if "ms" in t else f"error: {t.get('error')}"
            out.append(f"    {t.get('candidate')}: {result}")
    selected = report["selected"]
    label = "auto selects" if report["requested"] == "auto" else "selected"
    out.append(f"  {label}: {selected['schedule']}: {selected['why']}")
    return out
