"""Schedule: the dependency diagonals of layers x time steps, and what runs in each step.

The wavefront comes from engine.schedule; the GEMM and kernel assignment, launches, FLOPs and bytes
from the compiled plan (engine.explain); on a GPU, a measured timeline from engine.bench.
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
from app import engine_cache, figures, state  # noqa: E402

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
    st.plotly_chart(figures.wavefront_heatmap(wave["grid"]), key="schedule.heatmap")


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


st.title("Schedule")
cell = state.current_cell()
sizes = engine_cache.sizes_ui("schedule")
if sizes is not None:
    wavefront_ui(sizes)
    if cell is None:
        st.warning("The current design is not a valid cell; fix it in the Designer to see its plan.")
    else:
        plan_ui(cell, sizes)
        timeline_ui(cell, sizes)
