"""Divergence: how far each implementation drifts from the float64 reference (and from cuDNN) over time.

Saved benchmark results carry per-step error arrays; without any, a live CPU demo compares float32 and
float64 runs of the NumPy reference on the current design, so the page always shows something real.
"""
from __future__ import annotations

import sys
from pathlib import Path

# Run alone (a first visit straight to this page's URL, see app/main.py), only app/ is on sys.path.
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

import engine  # noqa: E402
from app import engine_cache, figures, page, state  # noqa: E402

# The live demo runs the NumPy reference twice on the CPU, inside a page rerun: keep it small.
DEMO_LIMITS = {"input_size": 1024, "hidden_size": 1024, "num_layers": 8, "steps": 2000, "batch": 64, "proj_size": 1024}
DEMO_START = {"input_size": 64, "hidden_size": 128, "num_layers": 2, "steps": 200, "batch": 4, "proj_size": 64}
AGAINST = {"vs_reference": "against float64", "vs_cudnn_fp32": "against cuDNN fp32"}


def results_ui() -> bool:
    """Error curves from saved benchmark results. Returns whether any were shown."""
    list_results = engine_cache.optional("engine.bench", "list_results")
    load_results = engine_cache.optional("engine.bench", "load_results")
    if list_results is None or load_results is None:
        return False
    files = [info["path"] for info in list_results()]
    if not files:
        return False
    st.subheader("From saved benchmark results")
    cols = st.columns([2, 2, 1, 1])
    path = cols[0].selectbox("Results file", files, format_func=lambda p: Path(p).name, key="divergence.file")
    try:
        results = load_results(path)
    except engine.EngineError as e:
        st.error(f"results: {e}")
        return False
    cells = results.get("cells", [])
    with_curves = [i for i, cell in enumerate(cells)
                   if any(e.get("divergence") for e in cell.get("implementations") or [])]
    if not with_curves:
        st.info(f"{Path(path).name} holds no per-step errors.")
        return False
    index = cols[1].selectbox("Cell and configuration", with_curves, key="divergence.cell",
                              format_func=lambda i: figures.cell_label(cells[i]))
    against = cols[2].radio("Against", list(AGAINST), key="divergence.against", format_func=AGAINST.get)
    stat = cols[3].radio("Per step", ["max", "mean"], key="divergence.stat", format_func=lambda s: f"{s} |error|")
    series = figures.divergence_series(results, index, against=against, stat=stat)
    if not series:
        st.info(f"No implementation of {figures.cell_label(cells[index])} has errors {AGAINST[against]}.")
        return True
    st.plotly_chart(figures.divergence_figure(series, ylabel=f"{stat} |error| {AGAINST[against]}"),
                    key="divergence.results")
    return True


PRECISIONS = ("float32", "tf32", "float16", "bfloat16")


def demo_ui(cell: engine.CellGraph) -> None:
    st.subheader("Live on the CPU: each precision against the float64 reference")
    st.caption("All runs use the NumPy reference backend with the same parameters and the same random input. "
               "float32 is the reference computed in float32; tf32, float16 and bfloat16 are the reference "
               "emulating that precision mode of the GPU schedules (every matmul operand rounded to the format, "
               "the rest exact), which the GPU kernels match to about 1e-5: the gap is that mode's rounding carried "
               "through the recurrence.")
    design = state.design_sizes()
    start = {k: min(int(design[k]), DEMO_START[k]) if int(design.get(k, 0)) >= 1 else DEMO_START[k] for k in DEMO_START}
    fields = engine_cache.SIZE_FIELDS + (("proj_size",) if cell.uses_projection else ())     # LSTMP: P as well
    sizes = engine_cache.sizes_ui("divergence", fields=fields, defaults=start, limits=DEMO_LIMITS)
    seed = st.number_input("seed", value=0, step=1, min_value=0, key="divergence.seed")
    chosen = st.multiselect("precisions", PRECISIONS, default=list(PRECISIONS), key="divergence.precisions",
                            help="engine.run(..., precision=...): matmul operands rounded to tf32 / fp16 / bf16, "
                                 "fp32 accumulation and cell math")
    if sizes is None or not chosen:
        return
    try:
        problem = engine_cache.memory_problem(cell, "the divergence run", **sizes)
    except engine.EngineError as e:
        st.error(f"The reference run of cell '{cell.name}' cannot run at these sizes: {e}")
        return
    if problem:
        st.error(problem)
        return
    curves = {}
    for precision in chosen:
        try:
            curves[precision] = engine_cache.reference_divergence(engine.to_json(cell), seed=int(seed),
                                                                  precision=precision, **sizes)
        except engine.EngineError as e:
            st.error(f"The reference run of cell '{cell.name}' in {precision} failed: {e}")
            return
    cols = st.columns(len(curves))
    for col, (precision, errors) in zip(cols, curves.items()):
        exact = sum(1 for e in errors["max_abs"] if e == 0)
        col.metric(f"{precision}: max |error|, last step", f"{errors['max_abs'][-1]:.3e}",
                   help=f"largest over all steps {max(errors['max_abs']):.3e}; {exact} step(s) match exactly "
                        "(exact zeros are gaps on the log axis)")
    series = []
    for precision, errors in curves.items():
        series.append({"label": f"{precision} max |error|", "errors": errors["max_abs"]})
        series.append({"label": f"{precision} mean |error|", "errors": errors["mean_abs"], "dash": "dot"})
    st.plotly_chart(figures.divergence_figure(series, ylabel="|output - float64 reference|",
                                              title="Error per time step, by precision"), key="divergence.demo")


page.header("divergence")
shown = results_ui()
if not shown:
    st.info("No saved benchmark results with per-step errors were found; the curves below are a live CPU run.")
cell = state.current_cell()
if cell is None:
    st.warning("The current design is not a valid cell; fix it in the Designer for the live comparison.")
else:
    demo_ui(cell)
