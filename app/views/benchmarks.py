"""Benchmarks: run the harness live on the GPU, and browse saved results (benchmarks/results/*.json), and the
training-step results of `python -m engine bench --train` (train-*.json: the engine's forward + backward against
cuDNN's, each row's gradients checked first).

The engine's backends and schedules (naive, fused, graph, persistent, auto) are rows of their own, in
the live run's choice, the speedup chart, the engine's side-by-side chart and the table. Everything
but the live run works without a GPU. The numbers are the harness's (engine.bench); the
page only picks which to draw.
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

BENCH_REQUEST = "benchmarks.request_presets"     # set by the Gallery's "Benchmark" button
LIVE_RUN = "benchmarks.live_run"                # the results of the live run started in this browser tab
CURRENT_DESIGN = "(current design)"
DEFAULT_BASELINES = ("naive", "torch-eager", "cudnn-fp32")


def bench_api() -> dict | None:
    found = {name: engine_cache.optional("engine.bench", name) for name in ("run_bench", "list_results",
                                                                              "load_results")}
    found["anchors"] = engine_cache.optional("engine.bench.configs", "ANCHORS")
    nets = engine_cache.optional("engine.bench.configs", "NET_ANCHORS") or {}
    if found["anchors"] is not None:
        found["anchors"] = {**found["anchors"], **nets}       # whole networks (deepspeech) beside the cell sizes
    found["implementations"] = engine_cache.optional("engine.bench.implementations", "implementation_choices")
    return None if any(f is None for f in found.values()) else found


def choices_ui(anchors: dict, implementations: list[str]) -> tuple[list, list, bool, list[str]] | None:
    """Which cells, configurations and implementations to run. Returns (cells, configs, quick,
    implementations) or None when invalid."""
    if BENCH_REQUEST in st.session_state:
        st.session_state["benchmarks.presets"] = st.session_state.pop(BENCH_REQUEST)
    elif "benchmarks.presets" not in st.session_state:
        st.session_state["benchmarks.presets"] = ["lstm"]
    options = [CURRENT_DESIGN, *engine_cache.presets()]
    chosen = st.multiselect("Cells", options, key="benchmarks.presets")
    configs = st.multiselect("Configurations", list(anchors), default=["lat"], key="benchmarks.configs",
                             format_func=lambda name: anchors[name].label)
    custom = st.toggle("Also these sizes", key="benchmarks.custom")
    if custom:
        sizes = engine_cache.sizes_ui("benchmarks")
        if sizes is None:
            return None
        configs = [*configs, ",".join(str(sizes[k]) for k in engine_cache.SIZE_FIELDS)]
    # The schedules in reduced precision (persistent-bf16, ...) are opt-in: they double a run's length.
    reduced = [i for i in implementations if i.split("-")[0] in ("graph", "persistent", "auto") and "-" in i]
    chosen_implementations = st.multiselect(
        "Implementations", implementations, default=[i for i in implementations if i not in reduced],
        key="benchmarks.implementations",
        help="the engine's backends and schedules (naive, fused, graph, persistent, auto: the autotuner's "
             "choice) each get their own row, beside cuDNN and PyTorch; persistent-bf16 and the like run a "
             "schedule in tf32/fp16/bf16, read against cuDNN in the same mode")
    quick = st.toggle("Quick (fewer repetitions)", value=True, key="benchmarks.quick")
    cells = []
    for name in chosen:
        if name == CURRENT_DESIGN:
            cell = state.current_cell()
            if cell is None:
                st.error("cells: the current design is not a valid cell. hint: fix it in the Designer or "
                         "deselect it")
                return None
            cells.append(cell)
        else:
            cells.append(name)
    if not cells:
        st.error("cells: choose at least one cell to benchmark")
        return None
    if not configs:
        st.error("configurations: choose at least one configuration")
        return None
    if not chosen_implementations:
        st.error("implementations: choose at least one implementation to time")
        return None
    return cells, configs, quick, chosen_implementations


def live_ui(api: dict) -> None:
    st.subheader("Run live")
    ok, reason = engine_cache.gpu_status()
    picked = choices_ui(api["anchors"], picker_names(api["implementations"]()))
    if not ok:
        st.info(f"Live runs need a GPU: {reason}. The saved results below work without one.")
    if not st.button("Run the benchmark", key="benchmarks.run", type="primary", disabled=not ok or picked is None,
                     icon=":material/play_arrow:"):
        return
    cells, configs, quick, implementations = picked
    bar = st.progress(0.0, text="starting")

    def progress(done: int, total: int, label: str) -> None:
        bar.progress(min(done / total, 1.0) if total else 0.0, text=label)

    try:
        results = api["run_bench"](cells, configs, implementations=implementations, quick=quick, out_dir=None,
                                   progress=progress)
    except engine.EngineError as e:
        st.error(f"The benchmark did not run: {e}")
        return
    st.session_state[LIVE_RUN] = results
    bar.progress(1.0, text="done")
    st.success("Done: the results are shown below as 'the live run'.")


def pick_results_ui(api: dict) -> tuple[str, dict] | None:
    """(file stem, results document) chosen among the live run (this browser tab's) and the saved files."""
    available: dict[str, dict | str] = {}
    stems = {}
    if LIVE_RUN in st.session_state:
        available["the live run"] = st.session_state[LIVE_RUN]
        stems["the live run"] = "live-run"
    folder = engine_cache.bench_results_dir()
    for info in api["list_results"](folder):
        label = f"{Path(info['path']).name} ({info.get('device') or 'unknown device'}, {info.get('status')})"
        available[label] = info["path"]
        stems[label] = Path(info["path"]).stem
    unreadable = engine_cache.optional("engine.bench", "unreadable_results")
    for path, why in (unreadable(folder) if unreadable else []):
        st.warning(f"Skipped {path}, left as it is: {why}")
    if not available:
        st.info("No saved results yet: benchmarks/results/ holds no results file. Run "
                "`python -m engine bench` on a GPU machine to make one.")
        return None
    name = st.selectbox("Results", list(available), key="benchmarks.file")
    chosen = available[name]
    if isinstance(chosen, str):
        try:
            chosen = api["load_results"](chosen)
        except engine.EngineError as e:
            st.error(f"results: {e}")
            return None
    return stems[name], chosen


def speedup_ui(results: dict) -> None:
    ran = figures.implementations_in(results)
    if not ran:
        st.info("No implementation ran successfully in these results.")
        return
    left, right = st.columns([1, 2])
    mine = left.selectbox("Speedup of", ran, key="benchmarks.mine",
                          index=ran.index("fused") if "fused" in ran else 0)
    baselines = right.multiselect("against", [n for n in ran if n != mine], key="benchmarks.baselines",
                                  default=[b for b in DEFAULT_BASELINES if b in ran and b != mine])
    rows = figures.speedup_rows(results, mine, baselines)
    if not rows:
        st.info(f"'{mine}' and the chosen baselines never ran side by side in these results.")
        return
    st.plotly_chart(figures.speedup_bars(rows, title=f"{mine}: baseline time / {mine} time"),
                    key="benchmarks.speedup")


def not_run_ui(results: dict) -> None:
    """The cases that did not run, after the charts: one folded line per reason ("12 cases skipped: the run's
    time budget was spent"), the cases inside."""
    by_reason: dict[tuple[str, str], list[str]] = {}
    for cell in results.get("cells", []):
        if cell.get("status") != "ok":
            by_reason.setdefault((str(cell.get("status")), str(cell.get("reason"))), []).append(figures.cell_label(cell))
    for (status, reason), cases in by_reason.items():
        with st.expander(f"{len(cases)} case{'s' if len(cases) != 1 else ''} {status}: {reason}",
                         icon=":material/info:"):
            st.write(", ".join(cases))


def picker_names(implementations: list[str]) -> list[str]:
    """The harness's implementation names, each spelled once: engine.bench lists the torch.compile candidate as
    'torch.compile' and its group (the faster of torch.compile and TorchScript) as 'torch-compile'; the picker
    offers the group."""
    seen = set()
    out = []
    for name in implementations:
        spelled = name.replace(".", "-")
        if spelled in seen or (spelled != name and spelled in implementations):
            continue
        seen.add(spelled)
        out.append(name)
    return out


def results_ui(api: dict) -> None:
    st.subheader("Results")
    picked = pick_results_ui(api)
    if picked is None:
        return
    stem, results = picked
    environment = results.get("environment", {})
    st.caption(f"{environment.get('device', 'unknown device')} · created {results.get('created', '?')} · "
               f"status {results.get('status', '?')} · {results.get('settings', {}).get('reps', '?')} repetitions")
    left, right = st.columns(2)
    if results.get("cells"):
        speedup_ui(results)
        engine_bars = figures.engine_time_bars(results)
        if len(engine_bars.data) > 1:               # one engine implementation alone compares with nothing
            st.plotly_chart(engine_bars, key="benchmarks.engine")
        not_run_ui(results)
        rows = figures.results_table(results)
        st.dataframe(rows, hide_index=True, key="benchmarks.table")
        left.download_button("Download CSV", figures.results_csv(rows), file_name=f"{stem}.csv", mime="text/csv",
                             key="benchmarks.csv", icon=":material/download:")
    nets_ui(results)
    right.download_button("Download JSON", json.dumps(results, indent=1), file_name=f"{stem}.json",
                          mime="application/json", key="benchmarks.json", icon=":material/download:")


def nets_ui(results: dict) -> None:
    """Whole networks (the harness's net configurations): each row's time and its speedup over cuDNN fp32."""
    rows = figures.net_results_table(results)
    if not rows:
        return
    st.markdown("**Networks** (cuDNN's modules with the same weights against the engine's `run_net`; "
                "fp32, TF32 off; every row checked against the float64 reference of the whole net first)")
    bars = figures.vs_cudnn_bars(rows, ("preset", "net", "implementation"), "speedup_vs_cudnn_fp32")
    if bars:
        st.plotly_chart(figures.speedup_bars(bars, title="Networks: cuDNN fp32 time / each implementation's time"),
                        key="benchmarks.nets_speedup")
    st.dataframe(rows, hide_index=True, key="benchmarks.nets_table")


def training_ui() -> None:
    """Saved training-step results (`python -m engine bench --train`): each row's time and speedup over cuDNN."""
    listing = engine_cache.optional("engine.bench.training", "list_training_results")
    load = engine_cache.optional("engine.bench.training", "load_training_results")
    table = engine_cache.optional("engine.bench.training", "training_rows")
    if listing is None or load is None or table is None:
        return
    files = listing()
    st.subheader("Training step")
    if not files:
        st.info("No training-step results yet: run `python -m engine bench --train` on a GPU machine.")
        return
    labels = {f"{Path(f['path']).name} ({f.get('device') or 'unknown device'})": f["path"] for f in files}
    name = st.selectbox("Training results", list(labels), key="benchmarks.train_file")
    try:
        results = load(labels[name])
    except engine.EngineError as e:
        st.error(f"training results: {e}")
        return
    settings = results.get("settings", {})
    st.caption(f"{results.get('environment', {}).get('device', 'unknown device')} · created "
               f"{results.get('created', '?')} · forward + backward of {settings.get('loss', '?')} · "
               f"{settings.get('precision', '?')} · median of {settings.get('reps', '?')} · every row's gradients "
               f"checked against float64 first (tolerance {settings.get('tolerance', '?')})")
    rows = table(results)
    bars = figures.vs_cudnn_bars(rows, ("cell", "config", "implementation"), "speedup vs cuDNN fp32")
    if bars:
        st.plotly_chart(figures.speedup_bars(bars, title="Training step: cuDNN fp32 time / the engine's time"),
                        key="benchmarks.train_speedup")
    st.dataframe(rows, hide_index=True, key="benchmarks.train_table")


page.header("benchmarks")
api = bench_api()
if api is None:
    st.info("The benchmark harness (engine.bench) is not part of this engine yet.")
else:
    live_ui(api)
    results_ui(api)
    training_ui()
