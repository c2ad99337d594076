"""Networks: a net of blocks (cell layers, pooling over time), what each block reads, and its plan over N GPUs.

The net comes from a preset (engine.nets.presets.NET_PRESETS, any gallery cell, your sizes) or from pasted JSON
(engine.net_from_json); the plan from engine.multigpu.plan_pipeline: which layers on which GPU, the chunk size, the
predicted time and bubble, and the predicted schedule of each GPU's chunks (PipelinePlan.timeline). Measuring the
plan needs the GPUs: `python -m engine net <net> --gpus N --tune` (the page says so).
"""
from __future__ import annotations

import sys
from pathlib import Path

# Run alone (a first visit straight to this page's URL, see app/main.py), only app/ is on sys.path.
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import inspect  # noqa: E402
import json  # noqa: E402

import streamlit as st  # noqa: E402

import engine  # noqa: E402
from app import engine_cache, figures, page  # noqa: E402
from engine.bench.pipelines import measured_pipelines  # noqa: E402
from engine.multigpu import plan_pipeline  # noqa: E402
from engine.nets.data import Layers  # noqa: E402
from engine.nets.io import net_from_json, net_to_json  # noqa: E402
from engine.nets.presets import NET_PRESETS, net_preset  # noqa: E402

MAX_GPUS = 64
MAX_TIMELINE_EVENTS = 2000      # bars in the schedule figure; past this the figure shows the first chunks only
PRESET_SIZE_FIELDS = (("input_size", "input size (I)"), ("hidden_size", "hidden size (H)"),
                      ("layers", "layers a block"))


def preset_defaults(name: str) -> dict:
    return {k: p.default for k, p in inspect.signature(NET_PRESETS[name]).parameters.items()
            if p.default is not inspect.Parameter.empty}


def net_ui() -> engine.Net | None:
    source = st.radio("Network", ("preset", "JSON"), horizontal=True, key="networks.source",
                      help="a preset network with your cell and sizes, or a network's JSON (`python -m engine net "
                           "deepspeech --json` writes one to edit)")
    if source == "JSON":
        text = st.text_area("Network JSON", key="networks.json", height=200,
                            placeholder='{"schema": "rnn-network", "version": 1, "input_size": 32, "blocks": [...]}')
        if not text.strip():
            st.info("Paste a network's JSON above, or pick a preset.")
            return None
        try:
            return net_from_json(text)
        except engine.EngineError as e:
            st.error(f"Network JSON: {e}")
            return None
    cols = st.columns(5)
    name = cols[0].selectbox("Preset", list(NET_PRESETS), key="networks.preset")
    defaults = preset_defaults(name)
    cells = list(engine.presets())
    cell = cols[1].selectbox("Cell", cells, index=cells.index(defaults.get("cell", "lstm")), key="networks.cell",
                             help="any cell of the gallery; every cell layer of the preset uses it")
    sizes, problems = {"cell": cell}, []
    for column, (field, label) in zip(cols[2:], PRESET_SIZE_FIELDS):
        key = f"networks.{name}.{field}"
        if key not in st.session_state:
            st.session_state[key] = int(defaults[field])
        sizes[field] = column.number_input(label, step=1, key=key, help=f"{field}, from 1 to 65536")
        problems += engine_cache.size_problems({field: sizes[field]}, {field: 65536})
    for problem in problems:
        st.error(problem)
    if problems:
        return None
    try:
        return net_preset(name, **{k: (int(v) if k != "cell" else v) for k, v in sizes.items()})
    except engine.EngineError as e:
        st.error(f"Preset '{name}': {e}")
        return None


def blocks_ui(net: engine.Net, steps: int) -> bool:
    st.subheader("Blocks")
    if net.doc:
        st.caption(net.doc)
    try:
        lengths = net.steps(steps)
    except engine.EngineError as e:
        st.error(f"steps: {e}")
        return False
    rows = []
    for k, block in enumerate(net.blocks):
        if isinstance(block, Layers):
            what = (f"{block.num_layers} x {block.cell.name}, hidden {block.hidden_size}, {block.direction}"
                    + (f" ({block.merge})" if block.bidirectional else ""))
        else:
            what = f"{block.op}-pool over {block.window} step(s), stride {block.stride}"
        rows.append({"block": k, "name": block.label, "what": what, "reads steps": lengths[k],
                     "reads features": net.sizes[k]})
    st.dataframe(rows, hide_index=True, key="networks.blocks")
    st.download_button("Network JSON", net_to_json(net), file_name=f"{net.name}.json", mime="application/json",
                       key="networks.net_json", icon=":material/download:")
    return True


def parse_split(text: str) -> list[int] | None:
    """'4, 4' -> [4, 4]; '' -> None (the planner chooses). Raises ValueError with what is wrong."""
    if not text.strip():
        return None
    try:
        return [int(part) for part in text.replace(" ", "").split(",")]
    except ValueError:
        raise ValueError(f"split: {text!r} is not layer counts separated by commas. hint: e.g. 4,4 for two "
                         "GPUs, or leave it empty for the planner's split") from None


def pipeline_ui(net: engine.Net, steps: int, batch: int) -> None:
    st.subheader("Over several GPUs")
    st.caption("Each GPU owns a contiguous run of layers; the sequence flows through them in chunks of time steps, "
               "so GPU g works on chunk k while GPU g + 1 works on chunk k - 1 (engine/multigpu/plan.py).")
    cols = st.columns(3)
    gpus = cols[0].number_input("GPUs", step=1, value=2, key="networks.gpus", help=f"from 1 to {MAX_GPUS}")
    split_text = cols[1].text_input("Layers per GPU", key="networks.split", placeholder="chosen, e.g. 4,4",
                                    help="layer counts in order, one per GPU; empty: the planner's split")
    chunk = cols[2].number_input("Steps per chunk", step=1, value=0, key="networks.chunk",
                                 help="0: the planner's chunk (the least predicted time)")
    problems = engine_cache.size_problems({"gpus": gpus}, {"gpus": MAX_GPUS})
    if chunk < 0:
        problems.append(f"chunk: must be 0 (chosen) or a positive number of steps, got {chunk}")
    try:
        split = parse_split(split_text)
    except ValueError as e:
        problems.append(str(e))
    for problem in problems:
        st.error(problem)
    if problems:
        return
    try:
        plan = plan_pipeline(net, int(gpus), steps, batch, split=split, chunk=int(chunk) or None)
    except engine.EngineError as e:
        st.error(f"Plan: {e}")
        return
    metrics = st.columns(4)
    metrics[0].metric("predicted (ms)", f"{plan.predicted_ms:.3g}")
    metrics[1].metric("on one GPU (ms)", f"{plan.one_gpu_ms:.3g}")
    metrics[2].metric("predicted speedup", f"{plan.predicted_speedup:.2f}x")
    metrics[3].metric("predicted bubble", f"{100 * plan.bubble:.0f}%",
                      help="the share of GPU time idle: the fill and drain of the pipeline and the imbalance")
    rows = []
    for g, units in enumerate(plan.split):
        rows.append({"GPU": g, "layers": ", ".join(plan.units[u].label for u in units),
                     "us a step": round(plan.per_gpu_step_us[g], 1),
                     "us a chunk": round(plan.chunk_work_us[g], 1),
                     "hands over a chunk (us)": (round(plan.transfer_us_per_chunk[g], 1)
                                                 if g < len(plan.transfer_us_per_chunk) else None)})
    st.dataframe(rows, hide_index=True, key="networks.split_table")
    events = plan.timeline()
    if len(events) > MAX_TIMELINE_EVENTS:
        shown = MAX_TIMELINE_EVENTS // plan.gpus
        events = [e for e in events if e["chunk"] < shown]
        st.caption(f"Showing the first {shown} of {-(-plan.steps // plan.chunk)} chunks.")
    st.plotly_chart(figures.pipeline_figure(events), key="networks.pipeline")
    for note in plan.notes:
        st.info(note)
    st.caption(f"Chunks of {plan.chunk} step(s). A prediction from the planner's cost model (the FLOPs of each "
               "layer at its fp32 rate, a cost per layer and chunk, the host's time to issue each run); the best "
               "chunk also depends on how a chunk's GEMMs fall on the GPU, so on a machine with the GPUs run "
               f"`python -m engine net {net.name} --gpus {plan.gpus} -T {steps} -B {batch} --tune` to measure "
               "the candidates and keep the fastest (benchmarks/results/pipeline-*.md has two H200s' figures).")
    st.download_button("Plan JSON", json.dumps(plan.as_dict(), indent=1), file_name=f"{net.name}-plan.json",
                       mime="application/json", key="networks.plan_json", icon=":material/download:")


def measured_ui() -> None:
    """The pipelined runs measured on GPU machines (benchmarks/probe_pipeline.py writes them): shown here on any
    machine, so the predictions above can be read against real figures."""
    st.subheader("Measured on GPUs")
    rows, skipped = measured_pipelines()
    if not rows:
        st.info("No measured pipelines yet: `python benchmarks/probe_pipeline.py --gpus 2 --json "
                "benchmarks/results/pipeline-<date>-<device>.json` on a machine with the GPUs writes one.")
        return
    files = sorted({r["file"] for r in rows}, reverse=True)
    chosen = st.selectbox("Measurement", files, key="networks.measured_file",
                          help="benchmarks/results/pipeline-*.json, newest name first")
    table = [{"net": r["net"], "plan": r["choice"], "GPUs": r["gpus"], "layers per GPU": str(r["split"]),
              "chunk": r["chunk"], "chunks run": ("replayed" if r["replay"] else "run by run")
              + (", pools fused" if r["fuse_pools"] else ""),
              "one GPU (ms)": r["one_gpu_ms"], "pipelined (ms)": r["ms"],
              "speedup": r["speedup"], "bubble measured": r["measured_bubble"],
              "bubble predicted": r["predicted_bubble"], "max rel. diff": r["max_rel_diff"],
              "backend": r["backend"], "device": r["device"]} for r in rows if r["file"] == chosen]
    st.dataframe(table, hide_index=True, key="networks.measured",
                 column_config={"speedup": st.column_config.NumberColumn(format="%.2fx"),
                                "bubble measured": st.column_config.NumberColumn(format="percent"),
                                "bubble predicted": st.column_config.NumberColumn(format="percent"),
                                "one GPU (ms)": st.column_config.NumberColumn(format="%.2f"),
                                "pipelined (ms)": st.column_config.NumberColumn(format="%.2f")})
    st.caption("'planner': the plan as the planner made it; 'tuned': the fastest of the candidates tune_pipeline "
               "measured. The one-GPU time is the engine's best backend on one of the same GPUs. 'replayed': each "
               "GPU's chunk replayed from CUDA graphs (the default since 2026-11-23); 'run by run': the host issued "
               "every schedule run of every chunk.")
    for name, why in skipped:
        st.caption(f"Skipped {name}, left as it is: {why}")


page.header("networks")
st.caption("Networks of blocks: cell layers and pooling over time, run block by block or as one wavefront, and "
           "pipelined over several GPUs.")
net = net_ui()
if net is not None:
    sizes = engine_cache.sizes_ui("networks", fields=("steps", "batch"), defaults={"steps": 100, "batch": 64})
    if sizes is not None and blocks_ui(net, sizes["steps"]):
        pipeline_ui(net, sizes["steps"], sizes["batch"])
measured_ui()
