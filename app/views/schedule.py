"""Schedule: the dependency diagonals of layers x time steps, what runs in each step, and how each GPU
schedule (fused, graph, persistent) runs it.

The wavefront comes from engine.schedule; the GEMM and kernel assignment, launches, FLOPs and bytes
from the compiled plan (engine.explain); the schedules' tilings, launches, barriers and the
autotuner's choice from explain_json()["schedules"]; on a GPU, a measured timeline from engine.bench.
"""
from __future__ import annotations

import sys
from pathlib import Path

# Run alone (a first visit straight to this page's URL, see app/main.py), only app/ is on sys.path.
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import json  # noqa: E402

import streamlit as st  # noqa: E402

import engine  # noqa: E402
from app import engine_cache, figures, page, state  # noqa: E402
from engine.explain import weights_phrase  # noqa: E402

HEATMAP_STEPS = 48   # the diagonals are the same for every window; a wider grid is unreadable


def wavefront_ui(sizes: dict[str, int]) -> None:
    num_layers, steps = sizes["num_layers"], sizes["steps"]
    shown = min(steps, HEATMAP_STEPS)
    wave = engine_cache.wavefront(num_layers, shown)
    st.subheader("Dependency diagonals")
    st.caption("Layer l at step t needs layer l-1 at step t and layer l at step t-1, so every (l, t) on one "
               "anti-diagonal runs together: one wavefront step.")
    if shown < steps:
        st.caption(f"Showing time steps 0 to {shown - 1} of {steps}.")
    left, right = st.columns(2)
    left.metric("wavefront steps (shown grid)", wave["depth"], help="instead of L x T sequential layer-steps")
    right.metric("most layer-steps in one wavefront step", wave["max_parallel"])
    last = wave["depth"] - 1
    if st.session_state.get("schedule.wave_step", 0) > last:      # fewer steps than before: stay in range
        st.session_state["schedule.wave_step"] = last
    step = st.slider("step through the wavefront", 0, last, key="schedule.wave_step",
                     help="rings the layer-steps that run together in this wavefront step") if last > 0 else 0
    running = [(layer, t) for layer, row in enumerate(wave["grid"]) for t, k in enumerate(row) if k == step]
    st.caption(f"Wavefront step {step} runs " + ", ".join(f"layer {layer} at t={t}" for layer, t in running)
               + " together: one launch per stage (graph schedule), or the work between two grid barriers "
                 "(persistent kernel; with small batches each layer waits on arrival counters instead, so a layer "
                 "may run a step ahead of the one above it).")
    st.plotly_chart(figures.wavefront_heatmap(wave["grid"], highlight=step), key="schedule.heatmap")


def plan_ui(cell: engine.CellGraph, sizes: dict[str, int]) -> dict | None:
    st.subheader("What runs in each step")
    too_big = engine_cache.plan_problems(sizes)
    for problem in too_big:
        st.error(problem)
    if too_big:
        return None
    try:
        plan = engine_cache.plan(engine.to_json(cell), **sizes)
    except engine.EngineError as e:
        st.error(f"The plan for cell '{cell.name}' could not be built: {e}")
        return None
    if plan is None:
        st.info("The compiled plan is not available: engine.explain is not part of this engine yet. "
                "The diagonals above come from engine.schedule alone.")
        return None
    cols = st.columns(5)
    cols[0].metric("launches per step", plan["launches_per_step"], help="every layer once")
    cols[1].metric("FLOPs per step", figures.si(plan["flops_per_step"], "FLOP"))
    cols[2].metric("bytes per step", figures.si(plan["bytes_per_step"], "B"))
    cols[3].metric("FLOPs in total", figures.si(plan["flops_total"], "FLOP"),
                   help="all layers and all time steps, hoisted GEMMs included")
    if "wavefront" in plan:
        cols[4].metric("wavefront steps", plan["wavefront"]["depth"], help=f"for all {sizes['steps']} time steps")
    if plan.get("chunk_steps"):
        st.caption(f"Layers after the first project their input {plan['chunk_steps']} steps at a time, as soon "
                   "as the layer below has produced them.")
    st.plotly_chart(figures.stage_launches_figure(plan), key="schedule.stages")
    st.dataframe(figures.plan_stage_table(plan), hide_index=True, key="schedule.table")
    if plan.get("per_layer"):
        st.dataframe([{"layer": c["layer"], "launches per step": c["launches_per_step"],
                       "FLOPs per step": c["flops_per_step"], "bytes per step": c["bytes_per_step"],
                       "launches in total": c["launches_total"], "FLOPs in total": c["flops_total"]}
                      for c in plan["per_layer"]], hide_index=True, key="schedule.per_layer")
    for kernel in plan.get("kernels", []):
        with st.expander(f"kernel {kernel['name']} (stage {kernel['stage']}): {', '.join(kernel.get('nodes', []))}"):
            st.code(kernel.get("source", ""), language="cpp")
    st.download_button("Plan JSON", json.dumps(plan, indent=2), file_name=f"{cell.name}.plan.json",
                       mime="application/json", key="schedule.plan_json", icon=":material/download:")
    return plan


def choose_schedule_ui(report: dict) -> str:
    """The schedule to draw. Starts at the autotuned choice when cached, else persistent when it can run,
    and starts there again whenever that default changes (another cell, other sizes)."""
    default = report["default"]["schedule"]
    tuned = {c["schedule"] for c in report["autotune"]["choices"]}
    if st.session_state.get("schedule.choice_seed") != default or "schedule.choice" not in st.session_state:
        st.session_state["schedule.choice_seed"] = default
        st.session_state["schedule.choice"] = default

    def label(name: str) -> str:
        notes = (["autotuned"] if name in tuned else []) + ([] if report[name]["eligible"] else ["cannot run"])
        return name + (f" ({', '.join(notes)})" if notes else "")

    return st.radio("GPU schedule", figures.SCHEDULE_NAMES, key="schedule.choice", horizontal=True,
                    format_func=label, help="fused: cuBLAS + fused kernels launched every step; graph: one "
                    "kernel per stage of every wavefront step, replayed from a CUDA graph; persistent: one "
                    "cooperative kernel for the whole sequence")


PRECISIONS = ("float32", "tf32", "float16", "bfloat16", "float32x3")


def precision_ui() -> tuple[str, bool]:
    """The precision the schedules are planned in, and (float32 only) whether backend='auto' may run fp32 on tensor
    cores (engine.run's allow_tensor_core_fp32: float32x3 candidates tuned beside the strict ones)."""
    precision = st.radio("Precision", PRECISIONS, key="schedule.precision", horizontal=True,
                         help="float32: strict IEEE fp32 on CUDA cores. tf32, float16, bfloat16: matmul operands "
                              "rounded to that format on tensor cores (mma.sync), fp32 accumulation, cell math and "
                              "states; float32x3: each operand split into two TF32 parts, three tensor-core products "
                              "(3xTF32), fp32-level error; the fused backend runs every mode, its step GEMMs on "
                              "cuBLAS")
    if precision != "float32":
        return precision, False
    allow = st.checkbox("allow tensor cores for fp32 (3xTF32)", key="schedule.tensor_core_fp32",
                        help="engine.run(..., allow_tensor_core_fp32=True): backend='auto' also times the schedules "
                             "in float32x3 and may pick one when it is faster and within the float32 tolerance; "
                             "off, float32 is strict FFMA. The autotuner's choices below are those tuned so")
    return precision, allow


def schedule_ui(cell: engine.CellGraph, sizes: dict[str, int]) -> None:
    st.subheader("How the GPU runs it")
    cell_json = engine.to_json(cell)
    precision, allow_tensor_core_fp32 = precision_ui()
    try:
        explained = engine_cache.plan(cell_json, **sizes, autotune_stamp=engine_cache.autotune_stamp(),
                                      precision=precision, allow_tensor_core_fp32=allow_tensor_core_fp32)
    except engine.EngineError as e:
        st.error(f"The schedules of cell '{cell.name}' could not be described: {e}")
        return
    if explained is None or "schedules" not in explained:
        st.info("The schedules are not available: engine.explain does not describe them in this engine.")
        return
    report = explained["schedules"]
    chosen = choose_schedule_ui(report)
    st.caption(f"Shown first: {report['default']['schedule']}, {report['default']['why']}.")
    entry = report[chosen]
    if not entry["eligible"]:
        st.warning(f"The {chosen} schedule cannot run cell '{cell.name}': {entry['why_not']}")
    else:
        schedule_metrics_ui(entry)
        if chosen != "fused":
            wavefront_schedule_ui(cell, cell_json, sizes, chosen, entry, report["limits"], precision)
        else:
            st.caption(f"{entry['how']}. Its GEMMs and kernels are the table above.")
    st.dataframe(figures.schedule_comparison_table(report), hide_index=True, key="schedule.compare")
    dense_ui(explained.get("dense_form"))
    scan_ui(explained.get("scan"))
    autotune_ui(report["autotune"])


def dense_ui(dense: dict | None) -> None:
    """What the compiled paths run for this cell's reductions over H and weights of heads (engine/dense.py), and what
    it costs per step and layer."""
    if not dense or not dense["changed"]:
        return
    lines = []
    if dense["reductions"]:
        lines.append(f"- {len(dense['reductions'])} reduction(s) over H ("
                     + ", ".join(sorted({r['op'] for r in dense["reductions"]})) + ") run as GEMMs by a fixed H x H "
                     f"matrix on backend 'fused': {engine.plan.human_count(dense['reduction_flops_per_step'])}FLOP "
                     f"more per step and layer, {dense['stages_per_step']} stage(s) a step.")
        wave = dense.get("wavefront")
        if wave:
            lines.append(f"- The wavefront schedules run no GEMM for them: each block sums its own units per row "
                         f"(a variance: its sum and its squares about its own mean), the blocks' partials cross "
                         f"through L2 and every block adds them after the stage's barrier: {wave['reduction_terms']} "
                         f"row sum(s) a step, {wave['stages_per_step']} stage(s) a step, each one barrier.")
    for w in dense["heads"]:
        lines.append(f"- {weights_phrase(w['weights'])}: {w['heads']} heads each, multiplied as "
                     f"block-diagonal matrices, {w['heads']}x the FLOPs of their blocks; the persistent schedule "
                     "reads only a block's own head where its hidden units lie in one (warp GEMV, or fp16/bf16 "
                     "tensor cores).")
    st.info("**Reductions and heads, as the GPU runs them**\n\n" + "\n".join(lines))


def scan_ui(scan: dict | None) -> None:
    """Whether the cell is a linear recurrence that schedule 'scan' runs as one parallel scan (engine/passes/scan.py),
    and why, or which node stops it."""
    if not scan:
        return
    if scan["qualifies"]:
        lines = [f"- {state}[t] = a[t] * {state}[t-1] + b[t], a = `{c['a'] or 0}`, b = `{c['b'] or 0}`"
                 for state, c in scan["states"].items()]
        st.success("Schedule 'scan' runs this cell as one parallel scan over time, not step by step: "
                   f"{scan['reason']}.\n\n" + "\n".join(lines))
    else:
        st.caption(f"Schedule 'scan' (linear recurrences such as minGRU) does not take this cell: {scan['reason']}.")


def schedule_metrics_ui(entry: dict) -> None:
    cols = st.columns(4)
    cols[0].metric("host launches per sequence", entry["host_launches_per_sequence"], help=entry["host_launch"])
    cols[1].metric("kernel launches per step", entry["launches_per_step"],
                   help="per wavefront step (every layer's step together) for graph and persistent")
    cols[2].metric("kernel launches per sequence", entry["kernel_launches_per_sequence"])
    barriers = entry["barriers_per_sequence"]
    cols[3].metric("barriers per sequence", "none" if barriers is None else barriers, help=entry["sync"])


def wavefront_schedule_ui(cell: engine.CellGraph, cell_json: str, sizes: dict[str, int], chosen: str, entry: dict,
                          limits: dict, precision: str = "float32") -> None:
    tiling = entry["tiling"]
    st.caption(f"{entry['how']}.")
    st.plotly_chart(figures.block_tiling_figure(tiling, schedule=chosen), key="schedule.blocks")
    where = "nominal limits" if limits["nominal"] else "this GPU's limits"
    source = entry.get("tiling_from", "the default tiling")
    st.caption(f"Tiling for {limits['name']} ({limits['multiprocessors']} SMs, {where}; {source}): "
               f"{tiling['describe']}.")
    cols = st.columns(3)
    cols[0].metric("thread blocks", tiling["blocks"], help=f"{tiling['blocks_per_layer']} per layer")
    cols[1].metric("shared memory per block", f"{tiling['smem_bytes'] / 1024:.1f} KiB",
                   help="resident weight slices and the staging area")
    rows, columns = tiling["accumulator"]
    if tiling.get("path") == "gemv":
        cols[2].metric("registers per thread", "warp GEMV", help="a batch of at most 4 rows: the lanes of a warp "
                       "split K and keep partial dot products; no accumulator tile")
    elif tiling.get("mma"):
        wm, wn = tiling["warp_tile"]
        cols[2].metric("accumulators per warp", f"{wm * 16} x {wn * 8}",
                       help=f"tensor-core MMA in {tiling['precision']}: {wm} x {wn} tiles of 16 batch rows x 8 GEMM "
                            "columns per warp, fp32 accumulators")
    else:
        cols[2].metric("registers per thread", f"{rows} x {columns} accumulators",
                       help="batch rows x GEMM columns of the accumulator tile a thread keeps")
    st.dataframe(figures.shared_memory_table(tiling), hide_index=True, key="schedule.smem")
    if tiling.get("staging"):
        st.caption(f"Staging: {tiling['staging']}.")
    if tiling.get("carried_text"):
        st.caption(f"Registers: {tiling['carried_text']}.")
    for note in tiling["notes"]:
        st.caption(note)
    if st.toggle("Show the generated CUDA", key="schedule.show_source"):
        try:
            source = engine_cache.plan(cell_json, **sizes, schedule=chosen,
                                       precision=precision)["schedules"][chosen]["source"]
        except engine.EngineError as e:
            st.error(f"The {chosen} kernel for cell '{cell.name}' could not be generated: {e}")
            return
        st.code(source, language="cpp")


def autotune_ui(tuned: dict) -> None:
    if not tuned["choices"]:
        st.caption(f"The autotuner has no choice cached for these sizes ({tuned['cache']}); backend='auto' times "
                   "the candidates on its first run on a GPU.")
        return
    for i, choice in enumerate(tuned["choices"]):
        config = f" ({choice['config']})" if choice["config"] else ""
        mode = f" in {choice['precision']}" if choice.get("precision") == "float32x3" else ""
        with st.expander(f"Autotuned on {choice['device']}: {choice['schedule']}{config}{mode}"):
            st.write(choice["why"])
            st.dataframe([{"candidate": t.get("candidate"), "ms": t.get("ms"), "error": t.get("error")}
                          for t in choice["timings"]], hide_index=True, key=f"schedule.autotune.{i}")


def timeline_ui(cell: engine.CellGraph, sizes: dict[str, int]) -> None:
    st.subheader("Measured timeline")
    ok, reason = engine_cache.gpu_status()
    timeline = engine_cache.optional("engine.bench", "timeline")
    if not ok:
        st.info(f"Live timelines need a GPU: {reason}.")
        return
    if timeline is None:
        st.info("Live timelines are not available: engine.bench.timeline is not part of this engine yet.")
        return
    if not st.button("Measure one run (CUDA events per stage)", key="schedule.measure"):
        return
    try:
        with st.spinner("Running on the GPU..."):
            events = timeline(cell, **sizes)
    except engine.EngineError as e:
        st.error(f"The timeline run failed: {e}")
        return
    st.plotly_chart(figures.timeline_figure(events), key="schedule.timeline")


page.header("schedule")
cell = state.current_cell()
if cell is not None:
    st.caption(f"The current design: cell **{cell.name}** ({len(cell.nodes)} nodes, states "
               f"{', '.join(cell.state_names)}); change it in the Designer or the Gallery.")
else:
    st.caption(f"The current design ('{state.current_design().get('name', '?')}') is not a valid cell yet.")
sizes = engine_cache.sizes_ui("schedule")
if sizes is not None:
    wavefront_ui(sizes)
    if cell is None:
        st.warning("The current design is not a valid cell; fix it in the Designer to see its plan.")
    else:
        if plan_ui(cell, sizes) is not None:          # else plan_ui has said why
            schedule_ui(cell, sizes)
        timeline_ui(cell, sizes)
