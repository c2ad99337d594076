"""Train: several cells side by side on a task (generated, or the JSB Chorales), their loss curves and held-out
scores (issues #13, #35).

"LSTM: A Search Space Odyssey" (Greff et al. 2017) compared variants by training each on the same data; this page
does it live: the same settings, seed and batches for every cell chosen (presets, the current design, saved
designs), trained by engine.compare on the CPU in float64 (backpropagation through time on the NumPy reference), or
on the GPU in float32 when there is one (the fused training step; the Device choice).
A finished comparison is written to designs/training/ at once (a temporary file, then a rename), so a reload or a
crash loses nothing, and it downloads as JSON (`python -m engine train ... --json` writes the same format).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

# Run alone (a first visit straight to this page's URL, see app/main.py), only app/ is on sys.path.
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

import engine  # noqa: E402
from app import engine_cache, figures, page, state, studies  # noqa: E402
from app.designer import files  # noqa: E402
from engine.training import TrainingError, TrainResult, get_task, load_results, save_results  # noqa: E402
from engine.training.results import results_to_json  # noqa: E402
from engine.training.tasks import tasks as task_names  # noqa: E402

# Training runs inside a page rerun, on the CPU: bounds that keep one comparison to minutes at most.
LIMITS = {"hidden_size": 256, "num_layers": 4, "steps": 5000, "batch": 256, "seq_len": 200}
DEFAULTS = {"hidden_size": 16, "num_layers": 1, "steps": 200, "batch": 16, "seq_len": 10}
RESULTS = "train.results"          # session state: the comparison on show, as TrainResult.to_dict() dicts
CURRENT = "current design"
PRESET, SAVED = "preset: ", "saved: "


def results_dir() -> Path:
    return state.designs_dir() / "training"


def cell_options() -> list[str]:
    """Labels of the cells one can train: the current design (when valid), saved designs, presets."""
    options = [CURRENT] if state.current_cell() is not None else []
    options += [SAVED + name for name in files.list_designs(state.designs_dir())]
    return options + [PRESET + name for name in engine_cache.presets()]


def resolve_cell(label: str) -> engine.CellGraph:
    """The CellGraph a label stands for; TrainingError naming it when a saved design cannot be read."""
    if label == CURRENT:
        return state.current_cell()
    if label.startswith(SAVED):
        name = label[len(SAVED):]
        design, problems = files.load_design(state.designs_dir(), name)
        if design is None:
            raise TrainingError(f"the saved design '{name}' cannot be trained: "
                                + "; ".join(str(p) for p in problems), hint="open it in the Designer to repair it")
        return engine.from_dict(design)
    return engine_cache.presets()[label[len(PRESET):]].cell


def cells_ui() -> list[str]:
    options = cell_options()
    default = [o for o in (PRESET + "lstm", PRESET + "gru") if o in options]
    return st.multiselect("Cells", options, default=default, key="train.cells",
                          help="each is stacked into a network of the chosen size, with a linear readout on top")


def task_ui() -> str:
    names = list(task_names())
    name = st.selectbox("Task", names, index=names.index("adding") if "adding" in names else 0, key="train.task")
    task = get_task(name)
    better = "higher" if task.higher_is_better else "lower"
    if not task.data_ready():
        with st.spinner(f"Building the data of task '{name}' (first use only: a minute or two)..."):
            try:
                task.baseline_of()             # builds the data (then cached)
            except TrainingError as e:
                st.error(str(e))
                st.stop()
    st.caption(f"{task.description.rstrip('.')}. Loss on {task.reads}; metric: {task.metric} ({better} is better; "
               f"{task.baseline:.3g} without looking at the input). {task.citation}")
    return name


def settings_ui(task: str) -> dict:
    cols = st.columns(5)
    minimum = {"seq_len": get_task(task).min_seq_len}
    settings = {}
    for col, field in zip(cols, ("hidden_size", "num_layers", "steps", "batch", "seq_len")):
        settings[field] = int(col.number_input(field, min_value=minimum.get(field, 1), max_value=LIMITS[field],
                                               value=max(DEFAULTS[field], minimum.get(field, 1)), step=1,
                                               key=f"train.{field}"))
    cols = st.columns(3)
    settings["lr"] = float(cols[0].number_input("learning rate (Adam)", min_value=1e-5, max_value=1.0, value=0.01,
                                                format="%.4f", key="train.lr"))
    settings["clip"] = float(cols[1].number_input("clip (global norm; 0: off)", min_value=0.0, max_value=100.0,
                                                  value=1.0, key="train.clip"))
    settings["seed"] = int(cols[2].number_input("seed", min_value=0, value=0, step=1, key="train.seed"))
    settings["device"] = device_ui()
    settings["precision"] = PRECISIONS[st.selectbox(
        "Matmul precision", list(PRECISIONS), key="train.precision",
        help="every matmul's operands rounded to this format, products summed in fp32, weights kept in fp32: tensor "
             "cores on the GPU, the same rounding emulated on the CPU")]
    return settings


DEVICES = {"CPU, float64": "cpu", "GPU, float32 (the fused training step)": "gpu"}
PRECISIONS = {"float32 (strict)": "float32", "bfloat16": "bfloat16", "float16": "float16", "tf32": "tf32"}


def device_ui() -> str:
    """Where to train: the CPU always; the GPU when CuPy sees one (else a caption says why not)."""
    ok, why = engine_cache.gpu_status()
    labels = list(DEVICES) if ok else list(DEVICES)[:1]
    label = st.radio("Device", labels, horizontal=True, key="train.device",
                     help="the same seed gives the same data on both; fp32 curves differ from float64 ones in the "
                          "last digits")
    if not ok:
        st.caption(f"Training runs on the CPU: no GPU here ({why}).")
    return DEVICES[label]


def run_ui(labels: list[str], task: str, settings: dict) -> None:
    """Train the chosen cells with a progress bar; keep, save and show the result."""
    try:
        cells = [resolve_cell(label) for label in labels]
    except engine.EngineError as e:
        st.error(str(e))
        return
    bar = st.progress(0.0, text="Starting...")

    def progress(step: int, total: int, loss: float) -> None:
        cell = labels[min(len(labels) - 1, (step - 1) * len(labels) // total)]
        bar.progress(step / total, text=f"{cell}: step {step} of {total}, training loss {loss:.4g}")
    try:
        results = engine.compare(cells, task, on_progress=progress, **settings)
    except engine.EngineError as e:
        bar.empty()
        st.error(f"Training failed: {e}")
        return
    bar.empty()
    st.session_state[RESULTS] = [r.to_dict() for r in results]
    path = results_dir() / f"{task}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_results(results, path)
        st.success(f"Trained {len(results)} cell(s); saved to {path}.")
    except OSError as e:
        st.warning(f"Trained, but saving to {path} failed ({e}): download the results below to keep them.")


def saved_ui() -> None:
    """Open an earlier comparison from designs/training/."""
    folder = results_dir()
    found = sorted(folder.glob("*.json"), reverse=True) if folder.is_dir() else []
    if not found:
        return
    with st.expander(f"Earlier comparisons ({len(found)} in {folder})"):
        path = st.selectbox("Results file", found, format_func=lambda p: p.name, key="train.saved")
        if st.button("Show it", key="train.show_saved"):
            try:
                st.session_state[RESULTS] = [r.to_dict() for r in load_results(path)]
            except engine.EngineError as e:
                st.error(str(e))


def results_ui(results: list[dict]) -> None:
    st.subheader(f"Task '{results[0]['task']}': {len(results)} cell(s), same data and seed")
    st.plotly_chart(figures.training_loss_figure(results), key="train.losses")
    st.plotly_chart(figures.training_metric_figure(results), key="train.metrics")
    st.dataframe(figures.training_table(results), hide_index=True, key="train.table")
    st.download_button("Download the results (JSON)", results_to_json(
        [TrainResult.from_dict(r) for r in results]),
        file_name=f"train-{results[0]['task']}.json", mime="application/json", key="train.download")


page.header("train")
st.caption("Train cells side by side on a task (generated, or the JSB Chorales): same data, same seed, same settings; "
           "backpropagation through time on the CPU in float64 (the NumPy reference), or on the GPU in float32 (the "
           "fused training step) where there is one.")
compare_tab, studies_tab = st.tabs(["Compare cells", "Studies"])
with compare_tab:
    labels = cells_ui()
    task = task_ui()
    settings = settings_ui(task)
    if st.button("Train", type="primary", key="train.run", disabled=not labels):
        run_ui(labels, task, settings)
    if not labels:
        st.info("Choose at least one cell to train.")
    saved_ui()
    if st.session_state.get(RESULTS):
        results_ui(st.session_state[RESULTS])
with studies_tab:
    st.caption("A study trains every cell with every learning rate and seed, each trial a Ray task (a GPU each where "
               "there are GPUs, else a CPU core), keeps every finished trial in its folder, and compares each cell "
               "at its best learning rate with the first cell, as \"LSTM: A Search Space Odyssey\" (Greff et al. "
               "2017) does. Larger studies: `python -m engine study`.")
    studies.start_ui(cell_options(), resolve_cell)
    studies.show_ui()
