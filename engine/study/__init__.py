"""Studies: many cells x seeds x hyperparameters on one task, every trial a Ray task, every finished trial kept.

    import engine
    s = engine.study(["lstm", "gru", "lstm_nfg"], "jsb", seeds=5, space={"lr": [0.01, 0.003]},
                     settings={"hidden_size": 32, "steps": 500}, folder="studies/odyssey")
    s.comparison()          # each cell at its best lr against the baseline (the first cell), Welch's t-test

A study is its definition (cells, task, seeds, space, fixed settings; study.json in its folder, hashed) and the
trials it has finished (trials.jsonl, a line each, written as each ends). Run again on the same folder (or with
engine.resume_study(folder)) it runs only the trials not yet finished, so a study that was killed loses no finished
trial. A trial that fails (a NaN loss, out of memory) is recorded as failed with its error, and the study goes on.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..training.tasks import get_task
from . import analysis, runner, store
from .errors import StudyError
from .runner import Progress, StudyProgress
from .trials import StudyPlan, Trial

__all__ = ["study", "resume_study", "load_study", "Study", "StudyError", "StudyProgress", "StudyPlan", "Trial"]


@dataclass
class Study:
    plan: StudyPlan
    folder: Path
    lines: dict                     # trial id -> its line of trials.jsonl

    @property
    def trials(self) -> list[Trial]:
        return self.plan.trials

    @property
    def higher_is_better(self) -> bool:
        return get_task(self.plan.task).higher_is_better

    @property
    def finished(self) -> int:
        return sum(1 for t in self.trials if t.id in self.lines)

    @property
    def failures(self) -> list[dict]:
        """The failed trials' lines: the trial and its error."""
        return [self.lines[t.id] for t in self.trials if self.lines.get(t.id, {}).get("status") == "failed"]

    def results(self) -> list[dict]:
        """The finished trials' results (TrainResult.to_dict() with the trial's seed and variant), in study order."""
        return [{**self.lines[t.id]["result"], "variant": t.variant, "seed": t.seed}
                for t in self.trials if self.lines.get(t.id, {}).get("status") == "ok"]

    def variants(self) -> list[analysis.Variant]:
        return analysis.variants(self.lines, self.trials)

    def best(self) -> dict[str, analysis.Variant]:
        return analysis.best_variants(self.variants(), self.higher_is_better)

    def comparison(self) -> list[analysis.Comparison]:
        return analysis.compare_with_baseline(self.best(), self.plan.baseline, self.higher_is_better)


def default_folder(plan: StudyPlan) -> Path:
    return Path("studies") / f"{plan.task}-{plan.hash}"


def study(cells, task, *, seeds=3, space: dict | None = None, settings: dict | None = None, folder=None,
          baseline: str | None = None, address: str | None = None, cpus_per_trial: int = 1,
          on_progress: Progress | None = None, retry_failed: bool = False) -> Study:
    """Run every (cell, space value, seed) trial of the grid on Ray (an embedded local Ray unless `address` names a
    cluster) and return the Study. seeds: a count or a list. space: setting -> values to try (lr, hidden_size,
    num_layers, batch, seq_len, clip, steps). settings: the fixed keywords of engine.train (device "auto": the GPU
    where Ray has one). folder: where the study lives (default studies/<task>-<hash>); a folder of the same study
    resumes it. on_progress(StudyProgress) after each finished trial."""
    plan = StudyPlan.make(cells, task, seeds=seeds, space=space, settings=settings, baseline=baseline)
    if not isinstance(cpus_per_trial, int) or isinstance(cpus_per_trial, bool) or cpus_per_trial < 1:
        raise StudyError(f"cpus_per_trial must be a positive integer, got {cpus_per_trial!r}", hint="cpus_per_trial=1")
    ray = runner.connect(address)
    plan = runner.resolve_device(plan, ray.cluster_resources().get("GPU", 0))
    runner.check_gpu_cells(plan)
    folder = store.open_folder(folder if folder is not None else default_folder(plan), plan)
    lines = runner.run(plan, folder, ray, cpus_per_trial=cpus_per_trial, on_progress=on_progress,
                       retry_failed=retry_failed)
    return Study(plan, folder, lines)


def resume_study(folder, *, address: str | None = None, cpus_per_trial: int = 1,
                 on_progress: Progress | None = None, retry_failed: bool = False) -> Study:
    """Run the trials of the study saved in `folder` that have not finished (failed ones too with retry_failed)."""
    plan = store.plan_of(folder)
    ray = runner.connect(address)
    lines = runner.run(plan, Path(folder), ray, cpus_per_trial=cpus_per_trial, on_progress=on_progress,
                       retry_failed=retry_failed)
    return Study(plan, Path(folder), lines)


def load_study(folder) -> Study:
    """The study saved in `folder` as it stands, without running anything (no Ray needed)."""
    plan = store.plan_of(folder)
    return Study(plan, Path(folder), store.finished(folder))
