"""Export: the generated CUDA for the current design, and downloads of it, its plan, its JSON and its DSL."""
from __future__ import annotations

import sys
from pathlib import Path

# Run alone (a first visit straight to this page's URL, see app/main.py), only app/ is on sys.path.
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import json  # noqa: E402
import re  # noqa: E402

import streamlit as st  # noqa: E402

import engine  # noqa: E402
from app import engine_cache, page, state  # noqa: E402

EXPORT_SIZES = ("input_size", "hidden_size", "num_layers")


BUILD_LINE = re.compile(r"nvcc\b[^\n]*?-o\s+(\S+)\s+(\S+\.cu)\b")


def cuda_file_name(source: str, cell: engine.CellGraph) -> str:
    """The name the .cu's own build line compiles (`nvcc ... -o lstm_rnn lstm_rnn.cu`), so the downloaded file
    builds with the command written inside it; the cell's name when the source has no build line."""
    found = BUILD_LINE.search(source)
    return found.group(2) if found else f"{cell.name}.cu"


def cuda_ui(cell: engine.CellGraph, cell_json: str, sizes: dict[str, int]) -> None:
    st.subheader("Generated CUDA")
    try:
        source = engine_cache.cuda_source(cell_json, sizes["input_size"], sizes["hidden_size"], sizes["num_layers"])
    except engine.EngineError as e:
        st.error(f"CUDA for cell '{cell.name}' could not be generated: {e}")
        return
    if source is None:
        st.info("CUDA export is not available: engine.export is not part of this engine yet.")
        return
    st.download_button("Download .cu", source, file_name=cuda_file_name(source, cell), mime="text/x-cuda",
                       key="export.cu", icon=":material/download:", type="primary")
    st.code(source, language="cpp", line_numbers=True, height=600)


def downloads_ui(cell: engine.CellGraph, cell_json: str, plan_sizes: dict[str, int] | None) -> None:
    st.subheader("The design")
    cols = st.columns(3)
    cols[0].download_button("Cell JSON", cell_json, file_name=f"{cell.name}.json", mime="application/json",
                            key="export.cell_json", icon=":material/download:")
    try:
        dsl = engine_cache.dsl_source(cell_json)
    except engine.EngineError as e:
        st.error(f"The DSL for cell '{cell.name}' could not be written: {e}")
        dsl = None
    if dsl is None:
        cols[1].caption("DSL export is not available (engine.dsl_emit is missing).")
    else:
        cols[1].download_button("DSL (.py)", dsl, file_name=f"{cell.name}.py", mime="text/x-python",
                                key="export.dsl", icon=":material/download:")
    if plan_sizes is not None:
        plan_download_ui(cols[2], cell, cell_json, plan_sizes)
    with st.expander("Cell JSON"):
        st.code(cell_json, language="json")
    if dsl is not None:
        with st.expander("DSL"):
            st.code(dsl, language="python")


def plan_download_ui(column, cell: engine.CellGraph, cell_json: str, sizes: dict[str, int]) -> None:
    if engine_cache.size_problems(sizes) or engine_cache.plan_problems(sizes):
        column.caption(f"No plan download: the design's steps ({sizes['steps']}) or batch ({sizes['batch']}) "
                       "are out of range; set them in the Designer.")
        return
    try:
        plan = engine_cache.plan(cell_json, **sizes)
    except engine.EngineError as e:
        st.error(f"The plan for cell '{cell.name}' could not be built: {e}")
        return
    if plan is None:
        column.caption("Plan export is not available (engine.explain is missing).")
        return
    column.download_button("Plan JSON", json.dumps(plan, indent=2), file_name=f"{cell.name}.plan.json",
                           mime="application/json", key="export.plan_json", icon=":material/download:")


page.header("export")
cell = state.current_cell()
if cell is None:
    st.warning("The current design is not a valid cell; fix it in the Designer to export it.")
else:
    st.caption(f"Cell '{cell.name}'. The kernels are specialised to these sizes.")
    sizes = engine_cache.sizes_ui("export", EXPORT_SIZES)
    cell_json = engine.to_json(cell)
    plan_sizes = None
    if sizes is not None:
        cuda_ui(cell, cell_json, sizes)
        design = state.design_sizes()
        plan_sizes = {**sizes, "steps": int(design["steps"]), "batch": int(design["batch"])}
    downloads_ui(cell, cell_json, plan_sizes)
