"""The Train page's Studies view (issue #35): start a study (cells x seeds x learning rates on a task, each trial a
Ray task), follow its progress, and read what it found: each variant's scores over its seeds as box plots, and each
cell at its best learning rate against the baseline cell with Welch's t-test, its p-value shown.

Studies live in designs/studies/<name>/ (engine.study's folder: study.json and trials.jsonl), so a study started
here can be resumed here or with `python -m engine study --resume`, and one started from the CLI can be opened here.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import streamlit as st

import engine
from app import state
from app.figures import LEGEND_ON_TOP, PALETTE, titled
from engine.study import Study, StudyProgress, load_study, resume_study
from engine.training.tasks import get_task

MAX_TRIALS = 400               # a study run inside a page rerun: beyond this, the CLI (or Ray across machines)
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def studies_dir() -> Path:
    return state.designs_dir() / "studies"


def parse_values(text: str, field: str) -> list[float]:
    """"0.01, 0.003" -> [0.01, 0.003]; a ValueError naming the field otherwise."""
    try:
        values = [float(v) for v in text.replace(";", ",").split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{field}: write numbers separated by commas, such as 0.01, 0.003") from None
    if not values or any(not v > 0 for v in values):
        raise ValueError(f"{field}: give one or more positive numbers, such as 0.01, 0.003")
    return values


def study_box_figure(variants: Sequence, metric: str, higher_is_better: bool, scores: bool) -> go.Figure:
    """A box a variant: its seeds' test metric (scores=True) or final held-out metric, the points shown."""
    fig = go.Figure()
    cells = list(dict.fromkeys(v.cell for v in variants))
    for v in variants:
        values = list(v.scores if scores else v.held_out)
        fig.add_trace(go.Box(y=values, name=v.name, boxpoints="all", jitter=0.3, pointpos=0,
                             marker=dict(color=PALETTE[cells.index(v.cell) % len(PALETTE)]),
                             hovertemplate="%{y:.4g}<extra>" + v.name + "</extra>"))
    better = "higher" if higher_is_better else "lower"
    fig.update_layout(yaxis=dict(title=f"{'test' if scores else 'held-out'} {metric} ({better} is better)"),
                      showlegend=False, legend=LEGEND_ON_TOP, margin=dict(l=40, r=20, t=40, b=40))
    titled(fig, "Each variant over its seeds")
    return fig


def comparison_rows(study: Study) -> list[dict]:
    return [{"cell": c.cell, "best variant": c.variant, "mean": c.mean, f"baseline ({study.plan.baseline})":
             c.baseline_mean, "difference": c.difference, "p (Welch)": c.p_value,
             "verdict": c.verdict + (f" ({c.note})" if c.note else "")} for c in study.comparison()]


def progress_bar(bar) -> Callable[[StudyProgress], None]:
    """engine.study's on_progress drawn on a Streamlit progress bar: trials done and failed, those running."""
    def show(p: StudyProgress) -> None:
        running = ", ".join(p.running[:3]) + (" ..." if len(p.running) > 3 else "")
        bar.progress(p.done / p.total, text=f"{p.done} of {p.total} trials done, {p.failed} failed"
                                            + (f"; running {running}" if running else ""))
    return show


def start_ui(cell_options: list[str], resolve: Callable[[str], engine.CellGraph]) -> None:
    """The form that starts a study, run in this rerun with a progress bar."""
    with st.form("study.form"):
        default = [o for o in ("preset: vanilla_lstm", "preset: lstm_cifg") if o in cell_options]
        labels = st.multiselect("Cells (the first is the baseline)", cell_options, default=default,
                                key="study.cells")
        cols = st.columns(4)
        task = cols[0].selectbox("Task", engine.tasks(), key="study.task")
        seeds = int(cols[1].number_input("seeds", min_value=2, max_value=50, value=3, key="study.seeds"))
        lrs = cols[2].text_input("learning rates", value="0.01, 0.003", key="study.lrs",
                                 help="each is tried with every cell and seed; a cell is compared at its best")
        name = cols[3].text_input("study name", value="", key="study.name", placeholder="e.g. odyssey-jsb")
        cols = st.columns(4)
        sizes = {field: int(col.number_input(field, min_value=1, max_value=limit, value=value, key=f"study.{field}"))
                 for col, (field, value, limit) in zip(cols, (("hidden_size", 16, 256), ("steps", 100, 5000),
                                                              ("batch", 16, 256), ("seq_len", 20, 200)))}
        started = st.form_submit_button("Run the study", type="primary", key="study.run")
    if not started:
        return
    try:
        values = parse_values(lrs, "learning rates")
        if not NAME.match(name):
            raise ValueError("study name: letters, digits, '_', '.' and '-', up to 64, starting with a letter or "
                             "digit (the study's folder in designs/studies/)")
        if not labels:
            raise ValueError("choose at least one cell")
        trials = len(labels) * seeds * len(values)
        if trials > MAX_TRIALS:
            raise ValueError(f"{trials} trials is more than a page runs ({MAX_TRIALS}); run it with "
                             "`python -m engine study` instead")
        cells = [resolve(label) for label in labels]
    except (ValueError, engine.EngineError) as e:
        st.error(str(e))
        return
    bar = st.progress(0.0, text="Starting Ray...")
    progress = progress_bar(bar)
    space = {"lr": values} if len(values) > 1 else {}
    settings = {**sizes, **({} if space else {"lr": values[0]})}
    try:
        engine.study(cells, task, seeds=seeds, space=space, settings=settings, folder=studies_dir() / name,
                     on_progress=progress)
    except engine.EngineError as e:
        bar.empty()
        st.error(f"The study stopped: {e}")
        return
    bar.empty()
    st.session_state["study.shown"] = name             # show_ui's selectbox opens the study just run
    st.success(f"Study '{name}' finished; it is in {studies_dir() / name}.")


PUBLISHED = Path(__file__).resolve().parents[1] / "benchmarks" / "results"    # the project's own studies


def saved_studies() -> dict[str, Path]:
    """Label -> folder: the studies in designs/studies/, then the project's published ones (benchmarks/results/)."""
    found = {}
    for root, tag in ((studies_dir(), ""), (PUBLISHED, " (published)")):
        if root.is_dir():
            for path in sorted(root.iterdir()):
                if (path / "study.json").is_file():
                    found[path.name + tag] = path
    return found


def show_ui() -> None:
    """A saved study: its progress, its box plots, its variants and the comparison with the baseline."""
    found = saved_studies()
    if not found:
        st.caption(f"No study yet in {studies_dir()}.")
        return
    names = list(found)
    name = st.selectbox("Study", names, index=None, placeholder="Choose a study to show", key="study.shown")
    if name is None:
        return
    folder = found[name].parent
    name = found[name].name
    try:
        study = load_study(folder / name)
    except engine.EngineError as e:
        st.error(str(e))
        return
    task = get_task(study.plan.task)
    done, total = study.finished, len(study.trials)
    st.progress(done / total, text=f"{done} of {total} trials finished, {len(study.failures)} failed "
                                   f"(task {task.name}, seeds {list(study.plan.seeds)})")
    if done < total:
        st.caption(f"Unfinished: {total - done} trial(s) to run. Resume it here, or with `python -m engine study "
                   f"--resume {folder / name}` (on a cluster: `--address`).")
        if st.button("Resume this study", key="study.resume"):
            bar = st.progress(done / total, text="Starting Ray...")
            try:
                study = resume_study(folder / name, on_progress=progress_bar(bar))
            except engine.EngineError as e:
                bar.empty()
                st.error(f"The study stopped: {e}")
                return
            bar.empty()
            done = study.finished
            st.success(f"Study '{name}' resumed: {done} of {total} trials finished.")
    variants = study.variants()
    tested = "test" in task.splits
    st.plotly_chart(study_box_figure(variants, task.metric, task.higher_is_better, scores=tested),
                    key="study.box")
    st.dataframe(variant_rows(variants, task.metric, tested), hide_index=True, key="study.variants")
    rows = comparison_rows(study)
    if rows:
        st.markdown(f"**Each cell at its best learning rate against {study.plan.baseline}** (chosen on the held-out "
                    f"{task.metric}; compared on the {'test' if tested else 'held-out'} {task.metric} over the "
                    "seeds, Welch's t-test, significant below p = 0.05)")
        st.dataframe(rows, hide_index=True, key="study.comparison")
    for line in study.failures[:5]:
        st.warning(f"{line['trial']['variant']} seed {line['trial']['seed']} failed: {line['error'][:300]}")


def variant_rows(variants: Sequence, metric: str, tested: bool) -> list[Mapping]:
    rows = []
    for v in variants:
        row = {"variant": v.name, "finished": len(v.held_out), "failed": v.failed,
               f"held-out {metric}": float(np.mean(v.held_out)) if v.held_out else None}
        if tested:
            row[f"test {metric}"] = float(np.mean(v.scores)) if v.scores else None
        rows.append(row)
    return rows
