"""What each schedule would do for one network at (T, B), as plain data: no GPU needed.

    report = schedules_report(plan, wavefront_plan, schedule="persistent")
    report["persistent"]["tiling"]["blocks_owned"]      # [[layer, first unit, units], ...] per block
    report["selected"]                                  # {"schedule", "why"}

For each schedule: whether it can run this program (and why not), how the host launches it, kernel
launches and barriers per sequence; for the wavefront schedules also the tiling (which block owns
which hidden units of which layer, what sits in shared memory, the accumulator tile a thread keeps
in registers). Tilings use this GPU's limits when CuPy sees one, else the nominal H100's (the
report says which). The autotuner's cached choices for this network, T and B (on any device) come
from its cache file; nothing here times or compiles anything.

engine.explain puts this in explain_json()["schedules"]; the app's Schedule page draws it.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from .. import backends
from ..codegen.carried import carried
from ..codegen.cluster import exchange
from ..codegen.precision import precision as lookup_precision
from ..codegen.wavefront import render_wavefront, stages
from ..errors import CompileError
from ..plan import Plan
from .autotune import Choice, cache_key, cache_path, read_cache
from .split_products import X3_CHUNK, X3_PARTS_DEFAULT, chunking
from .tiling import H100, DeviceLimits, TileConfig, Tiling, eligibility, make_tiling

SCHEDULE_CHOICES = ("fused", "graph", "persistent", "auto")
WAVEFRONT_SCHEDULES = ("graph", "persistent")


def check_schedule(schedule: str | None) -> str | None:
    """The schedule argument of explain(), checked: None or one of SCHEDULE_CHOICES."""
    if schedule is None or schedule in SCHEDULE_CHOICES:
        return schedule
    raise CompileError(f"argument 'schedule': {schedule!r} is not a schedule; hint: choose one of "
                       f"{', '.join(SCHEDULE_CHOICES)} (or None to leave the choice to explain)")


def device_limits() -> tuple[DeviceLimits, dict]:
    """The limits tilings are computed with, and a description saying where they came from."""
    ok, why = backends.gpu_status()
    if ok:
        try:
            limits = DeviceLimits.current()
            return limits, _limits_dict(limits, nominal=False, why=why)
        except Exception as e:             # a device that CuPy lists but cannot query
            why = f"the GPU's limits could not be read ({type(e).__name__}: {e})"
    return H100, _limits_dict(H100, nominal=True, why=why)


def _limits_dict(limits: DeviceLimits, nominal: bool, why: str) -> dict:
    return {"name": limits.name, "multiprocessors": limits.multiprocessors, "smem_per_block": limits.smem_per_block,
            "nominal": nominal, "why": why}


# ---- the autotuner's cache ------------------------------------------------------------------------

def cached_choices(plan: Plan, tensor_core_fp32: bool = False) -> list[dict]:
    """The autotuner's cached choices for this network at (T, B), one per device that tuned it; tensor_core_fp32:
    those tuned with float32x3 allowed (a key of its own), whose "precision" says the mode each runs in."""
    network = plan.network
    prefix = cache_key(network, plan.steps, plan.batch, "", plan.program.precision,
                       tensor_core_fp32=tensor_core_fp32)
    found = []
    for key, entry in sorted(read_cache().items()):
        if not key.startswith(prefix):
            continue
        try:
            choice = Choice.from_dict(key, entry)
        except (KeyError, TypeError, ValueError):
            continue                       # a malformed entry: the autotuner tunes again; nothing to show
        found.append({"device": key[len(prefix):], "schedule": choice.schedule,
                      "config": None if choice.config is None else choice.config.label(),
                      "config_fields": None if choice.config is None else asdict(choice.config),
                      "why": choice.why, "timings": list(choice.timings),
                      "precision": choice.precision or plan.program.precision})
    return found


def _preferred(choices: list[dict], device: str | None) -> dict | None:
    """The cached choice for this GPU when there is one, else the first."""
    for choice in choices:
        if choice["device"] == device:
            return choice
    return choices[0] if choices else None


# ---- one schedule ---------------------------------------------------------------------------------

def fused_entry(plan: Plan, precision: str = "float32") -> dict:
    """The fused backend: launched from the host step by step (engine/backends/fused.py); in a precision mode its
    step products on cublasLt's tensor cores (engine/schedules/fused_modes.py), float32x3's as two GEMMs of the
    operands' and weights' TF32 parts and a fold a product (engine/schedules/split_products.py, its defaults)."""
    per_sequence = sum(c.launches_total for c in plan.costs)
    mode = lookup_precision(precision).name
    how = ("cuBLAS GEMMs and the generated fused kernels, launched from the host every step; layer l on its own "
           "CUDA stream, waiting on events of the layer below")
    extra = 0
    if mode != "float32":
        how += (f"; in {mode} each step's product on cublasLt's tensor cores, its operand written in the mode's "
                "format by the cell kernels, the run replayed from CUDA graphs")
    if mode == "float32x3":
        sizes = plan.layer_sizes(0)
        steps = {g.name: (g.k(sizes), chunking(g.k(sizes))) for g in plan.program.gemms if not g.hoisted}
        extra = sum(1 + (1 if c.rest else 0) for _, c in steps.values())        # W_lo's GEMM, and a rest
        chunks = ", ".join(f"{name} K={K} in {c.count}" for name, (K, c) in steps.items())
        how += (f": two GEMMs of the 11-bit parts a product, held as fp16 on fp16 tensor cores (x3_parts="
                f"{X3_PARTS_DEFAULT!r}; a value past 65504 runs it in TF32 parts), [h_hi; h_lo] by W_hi in K chunks "
                f"of an accumulator each (x3_chunk={X3_CHUNK!r}: {chunks}) and h_hi by W_lo, folded by the cell "
                "kernels as they read them")
    steps_total = plan.steps * plan.network.num_layers
    return {"name": "fused", "eligible": True, "why_not": None, "how": how, "host_launch": "per-step launches",
            "launches_per_step": plan.launches_per_step + extra,
            "kernel_launches_per_sequence": per_sequence + extra * steps_total,
            "host_launches_per_sequence": per_sequence + extra * steps_total, "barriers_per_sequence": None,
            "sync": "stream order within a layer, CUDA events between layers (no grid-wide barrier)"}


def tiling_dict(tiling: Tiling, plan: Plan) -> dict:
    """The tiling as the app draws it: blocks, the units each owns, shared memory and registers."""
    network, program = plan.network, plan.program
    gemms = {g.name: g for g in program.gemms}
    units, hidden, per_layer = tiling.units_per_block, network.hidden_size, tiling.blocks_per_layer
    owned = []
    for block in range(tiling.blocks):
        layer, first = divmod(block, per_layer)
        first *= units
        owned.append([layer, first, max(0, min(units, hidden - first))])
    weight_bytes = lookup_precision(tiling.precision).weight_bytes      # 4, or 2 for fp16/bf16 weights
    slices = []
    for tile in tiling.gemms:
        k_max = max(gemms[tile.name].k(network.layer_sizes(layer)) for layer in range(network.num_layers))
        slices.append({"name": tile.name, "terms": tile.terms,
                       "role": "input projection" if tile.hoisted else "recurrent",
                       "where": "shared memory (resident)" if tile.resident else
                                ("streamed by bulk copies, chunked per block" if tiling.bulk else
                                 "streamed from global memory"),
                       "columns_per_block": tile.terms * units, "k": k_max,
                       "weight_kib_per_block": tile.terms * units * k_max * weight_bytes / 1024})
    config = tiling.config
    carry = carried(program, tiling)
    return {"describe": tiling.describe(), "staging": staging_text(tiling), "blocks": tiling.blocks,
            "blocks_per_layer": per_layer,
            "num_layers": tiling.num_layers, "units_per_block": units, "threads": config.threads,
            "accumulator": [config.rows_per_thread, config.cols_per_thread],
            # "gemv" (a few batch rows: warps split the columns, no accumulator tile) or "tiled"
            "path": getattr(tiling, "path", "tiled"),
            # tensor-core MMA (tf32/float16/bfloat16): warp tiles of 16-row x 8-column MMA tiles
            "precision": tiling.precision, "mma": tiling.mma, "warp_tile": list(tiling.warp_tile),
            "resident": list(tiling.resident), "smem_bytes": tiling.smem_bytes, "gemms": slices,
            "notes": list(tiling.notes), "config": config.label(), "blocks_owned": owned,
            # values the persistent kernel keeps in registers between stages and steps (engine/codegen/carried.py)
            "carried": list(carry), "carried_text": carried_text(program, tiling, carry)}


def carried_text(program, tiling: Tiling, carry: dict) -> str:
    """What the persistent kernel keeps in registers between stages and steps (`carry`: carried()), in one sentence
    ("" where nothing)."""
    if not carry:
        return ""
    states = [n for n in carry if program.buffer(n).double]
    values = [n for n in carry if n not in states]
    parts = ([f"{', '.join(states)} (state{'s' if len(states) > 1 else ''}) from one step to the next"] if states
             else []) + \
        ([f"{', '.join(values)} from the stage that computes them to the later stages"] if values else [])
    return (f"each thread owns one (row, unit) element ({tiling.batch} rows x {tiling.units_per_block} units <= "
            f"{tiling.config.threads} threads), so it keeps " + " and ".join(parts) + " in registers instead of "
            "a round trip through L2")


def staging_text(tiling: Tiling) -> str:
    """How a block's GEMMs get X (and streamed weights) into shared memory, in one sentence."""
    if tiling.path == "gemv":
        return "no staging: the warps read X from L2 into registers (a batch of at most 4 rows)"
    if not tiling.gemms:
        return "no GEMM in the kernel"
    if tiling.cluster:
        others = tiling.cluster - 1
        how = {"share": (f"; the cell code writes its units there and the block copies them into the other {others} "
                         "blocks of its cluster (distributed shared memory) before the cluster barrier"),
               "pull": (" (in wgmma's swizzled layout) and its weight rows in registers; the cell code writes its "
                        f"units there, and after the cluster barrier the block reads the other {others} blocks' units "
                        "from their shared memory (distributed shared memory) before the GEMM"),
               "push": (" (in wgmma's swizzled layout) and its weight rows in registers; the cell code writes its "
                        f"units there and sends them into the other {others} blocks' copies with st.async, each "
                        "store completing on the receiver's transaction barrier, which the receiver waits on before "
                        "its GEMM")}[exchange(tiling)]
        return (f"no staging: every block keeps its cluster's 16-bit h in shared memory{how}; the GEMM outputs and the "
                "input projection's rows (copied a step ahead) stay in shared memory too")
    if tiling.stream_n:
        keep = "" if tiling.l2_keep >= 1 else f"; {tiling.l2_keep:.0%} of the streamed weights marked to stay in L2"
        return (f"the cell code writes a 16-bit copy of every GEMM input, chunk by chunk; two warps of their own move "
                f"each chunk of 64 columns, one its weight rows and one its input rows, with bulk copies into a "
                f"{tiling.stages}-slot ring, and two warpgroups multiply alternate chunks with wgmma "
                f"(m64n{tiling.stream_n}k16), their sums meeting in Y{keep}")
    if tiling.bulk:
        keep = "" if tiling.l2_keep >= 1 else (f"; {tiling.l2_keep:.0%} of the streamed weights marked to stay in "
                                               "L2")
        feeder = ("a warp of its own (the block's last, which does no MMA)" if tiling.producer_warps else
                  "thread 0")
        return (f"the cell code writes a 16-bit copy of every GEMM input, chunk by chunk; {feeder} moves each "
                f"chunk of {tiling.k_chunk} columns with one bulk copy (cp.async.bulk) into a {tiling.stages}-slot "
                f"ring, and the warps wait on the slot's mbarrier instead of a block barrier{keep}")
    what = ("16-bit copies of X" if tiling.mma and lookup_precision(tiling.precision).weight_bytes == 2 else
            "fp32 X")
    return (f"every thread copies 16-byte pieces of {what} (cp.async) in chunks of {tiling.k_chunk} columns "
            f"through {tiling.stages} slots; the block meets at a barrier per chunk")


def tuned_config(tuned: dict | None, name: str) -> TileConfig | None:
    """The TileConfig the autotuner chose for schedule `name`, when its cached choice is that schedule."""
    if tuned is None or tuned["schedule"] != name or not tuned.get("config_fields"):
        return None
    fields = dict(tuned["config_fields"])
    if fields.get("warp_tile") is not None:
        fields["warp_tile"] = tuple(fields["warp_tile"])
    return TileConfig(**fields)


def wavefront_entry(name: str, plan: Plan, limits: DeviceLimits, config: TileConfig | None = None) -> dict:
    """A wavefront schedule ('graph' or 'persistent') for the interleaved plan: tiling, launches, barriers.
    config: the tiling to describe (the autotuner's choice), else the default TileConfig()."""
    program, network = plan.program, plan.network
    persistent = name == "persistent"
    entry: dict[str, Any] = {"name": name, "eligible": False, "why_not": None, "tiling": None, "source": None,
                             "tiling_from": "the default tiling" if config is None else "the autotuner's choice"}
    why = eligibility(program)
    if why is None:
        try:
            tiling = make_tiling(program, network, plan.batch, config or TileConfig(), limits, persistent=persistent)
        except CompileError as e:
            why = str(e)
    if why is not None:
        entry["why_not"] = why
        return entry
    present = stages(program)
    launches = tiling.launches                 # one per group of layers
    wave_steps = plan.steps + tiling.num_layers - 1
    barriers = launches * wave_steps * len(present)
    in_kernel = {t.name for t in tiling.gemms}
    entry.update(
        eligible=True, stages=list(present), wavefront_steps=wave_steps, tiling=tiling_dict(tiling, plan),
        launches_per_step=0 if persistent else len(present),
        kernel_launches_per_sequence=launches if persistent else barriers,
        host_launches_per_sequence=launches, barriers_per_sequence=barriers,
        before_launch=[g.name for g in program.hoisted_gemms if g.name not in in_kernel])
    if persistent:
        entry["host_launch"] = "one persistent kernel"
        steps = f"{wave_steps} wavefront steps x {len(present)} stage(s)"
        if tiling.cluster:
            owner = "head" if tiling.blocks_per_layer > tiling.cluster else "layer"
            how = exchange(tiling)
            entry["how"] = (f"one kernel of thread-block clusters (one a {owner}) for the whole sequence: {steps}, "
                            + ("each block waiting only for its peers' units of h (no cluster barrier a step)"
                               if how == "push" else "a cluster barrier after each"))
            entry["sync"] = {
                "share": (f"cluster barrier after every stage: the {tiling.cluster} blocks of a {owner} keep h in "
                          "their shared memory, and each block copies its units into the others before it "
                          "(distributed shared memory; engine/schedules/cluster.py)"),
                "pull": (f"cluster barrier after every stage: the {tiling.cluster} blocks of a {owner} keep h in "
                         "their shared memory, and each block reads the others' units after it (distributed shared "
                         "memory; engine/schedules/cluster.py)"),
                "push": (f"transaction barriers, no cluster barrier a step: the {tiling.cluster} blocks of a {owner} "
                         "keep h in their shared memory, each sends its units of the next version into the others' "
                         "with st.async, completing on the receiver's mbarrier, and waits on its own before the GEMM "
                         "(distributed shared memory; engine/schedules/cluster.py, kernels/wgmma_gemm.cuh)")}[how]
        elif tiling.config.sync in ("layer", "head"):
            group = tiling.config.sync
            entry["how"] = f"one cooperative kernel for the whole sequence: {steps}, each {group} waiting on " \
                           "arrival counters after each"
            entry["sync"] = (f"per-{group} arrival counters (kernels/layer_sync.cuh): after every stage a {group} "
                             "waits for its own blocks"
                             + (f" ({tiling.blocks_per_head} a head: every GEMM of a step reads one head)"
                                if group == "head" else "")
                             + ", and for the layer below to have finished the step it needs")
        else:
            entry["how"] = f"one cooperative kernel for the whole sequence: {steps}, a grid-wide barrier after each"
            entry["sync"] = "grid-wide barrier (grid.sync) after every stage of every wavefront step"
    else:
        entry["host_launch"] = "graph replay"
        entry["how"] = (f"one kernel per stage of every wavefront step ({wave_steps} x {len(present)} = {barriers} "
                        "launches), captured once into a CUDA graph and replayed")
        entry["sync"] = "kernel boundaries between the launches of the graph"
    if entry["before_launch"]:
        entry["how"] += f"; before it, {', '.join(entry['before_launch'])} as one cuBLAS GEMM over the sequence"
        entry["replay"] = ("none: the cuBLAS projection cannot be captured, so every run is issued call by call "
                           "(the first run at a shape always is)")
    else:
        entry["replay"] = ("from a shape's second run in a row, the whole run (state set-up, launch, copies out) "
                           "replayed from a CUDA graph: a few host calls a run")
    return entry


def wavefront_source(name: str, plan: Plan, limits: DeviceLimits, doc: str = "",
                     config: TileConfig | None = None) -> str:
    """The generated CUDA of a wavefront schedule with `config` (default: TileConfig()); raises CompileError when
    it cannot run."""
    program = plan.program
    why = eligibility(program)
    if why is not None:
        raise CompileError(f"cell '{program.source_cell.name}' cannot use schedule '{name}': {why}")
    tiling = make_tiling(program, plan.network, plan.batch, config or TileConfig(), limits,
                         persistent=name == "persistent")
    return render_wavefront(program, plan.network, tiling, doc=doc)


# ---- every schedule -------------------------------------------------------------------------------

def schedules_report(plan: Plan, wavefront_plan: Plan, schedule: str | None = None, *, doc: str = "",
                     tensor_core_fp32: bool = False) -> dict:
    """Every schedule for this network at (T, B). plan: the plan as asked for (the fused backend runs it);
    wavefront_plan: the same network with layout='interleaved' (the wavefront schedules need it).
    schedule: the one asked for (None, fused, graph, persistent or auto); the generated source of the
    selected wavefront schedule (graph, persistent, or what auto picks) goes in its entry's "source"."""
    schedule = check_schedule(schedule)
    limits, limits_info = device_limits()
    report: dict[str, Any] = {"requested": schedule, "limits": limits_info,
                              "fused": fused_entry(plan, wavefront_plan.program.precision)}
    choices = cached_choices(wavefront_plan, tensor_core_fp32)
    tuned = _preferred(choices, None if limits_info["nominal"] else limits.name)
    configs = {name: tuned_config(tuned, name) for name in WAVEFRONT_SCHEDULES}
    for name in WAVEFRONT_SCHEDULES:
        report[name] = wavefront_entry(name, wavefront_plan, limits, configs[name])
    report["autotune"] = {"cache": _cache_path(), "choices": choices}
    report["default"] = default_choice(report, tuned)
    if schedule in (None, "auto"):
        selected = dict(report["default"])
        if schedule == "auto" and not choices:
            selected["why"] += (" (backend='auto' times the candidates on its first run on a GPU and caches the "
                                "choice)")
    elif schedule == "fused" or report[schedule]["eligible"]:
        selected = {"schedule": schedule, "why": "asked for"}
    else:
        selected = {"schedule": schedule, "why": f"asked for, but it cannot run this cell: "
                                                 f"{report[schedule]['why_not']}"}
    report["selected"] = selected
    chosen = selected["schedule"]
    if schedule is not None and chosen in WAVEFRONT_SCHEDULES and report[chosen]["eligible"]:
        report[chosen]["source"] = wavefront_source(chosen, wavefront_plan, limits, doc, configs[chosen])
    return report


def default_choice(report: dict, tuned: dict | None) -> dict:
    """The schedule to show first: the autotuned one when cached, else the first wavefront schedule that can
    run (persistent, then graph), else fused."""
    if tuned is not None:
        return {"schedule": tuned["schedule"], "why": f"the autotuner's choice on {tuned['device']}: {tuned['why']}"}
    if report["persistent"]["eligible"]:
        return {"schedule": "persistent", "why": "not autotuned for these sizes; the persistent kernel can run "
                                                 "this cell"}
    why = f"the persistent kernel cannot run this cell: {report['persistent']['why_not']}"
    if report["graph"]["eligible"]:
        return {"schedule": "graph", "why": f"not autotuned for these sizes; {why}; the graph schedule can"}
    return {"schedule": "fused", "why": f"the wavefront schedules cannot run this cell: {report['graph']['why_not']}"}


def _cache_path() -> str:
    return str(cache_path())
