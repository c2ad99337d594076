"""Studies (issue #35, item 3): the trials of a grid, the study's folder, the comparison with Welch's t-test, and
studies run on an embedded local Ray: results equal to engine.train's, a failed trial recorded while the study goes
on, a killed study resumed without running a finished trial again, and the refusals. CPU."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.cli import main
from engine.dsl import W, exp
from engine.study import StudyError, StudyPlan, load_study, store
from engine.study.analysis import Variant, best_variants, compare_with_baseline, welch
from engine.study.runner import check_address

ROOT = Path(__file__).resolve().parents[1]
TINY = {"hidden_size": 4, "steps": 6, "seq_len": 5, "batch": 4, "eval_batch": 8, "device": "cpu"}

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -r requirements.txt)")


@pytest.fixture(scope="module")
def local_ray():
    """One embedded local Ray for the module's studies (what engine.study starts when given no address)."""
    from engine.study.runner import connect
    connect(None)
    yield
    ray.shutdown()


# ---- the grid of trials -------------------------------------------------------------------------------------------

def test_the_grid_is_every_cell_value_and_seed_with_stable_ids():
    plan = StudyPlan.make(["lstm", "gru"], "adding", seeds=[0, 1], space={"lr": [0.01, 0.003], "hidden_size": [4, 8]},
                          settings={"steps": 5})
    trials = plan.trials
    assert len(trials) == 2 * 2 * 2 * 2
    assert trials[0].label == "lstm lr=0.01 hidden_size=4 seed 0" and trials[-1].label == "gru lr=0.003 " \
                                                                                          "hidden_size=8 seed 1"
    assert len({t.id for t in trials}) == len(trials)
    again = StudyPlan.make(["lstm", "gru"], "adding", seeds=[0, 1], space={"lr": [0.01, 0.003], "hidden_size": [4, 8]},
                           settings={"steps": 5})
    assert [t.id for t in again.trials] == [t.id for t in trials] and again.hash == plan.hash
    other = StudyPlan.make(["lstm", "gru"], "adding", seeds=[0, 1], space={"lr": [0.01, 0.003], "hidden_size": [4, 8]},
                           settings={"steps": 6})
    assert other.hash != plan.hash and not {t.id for t in other.trials} & {t.id for t in trials}
    assert all(t.settings["steps"] == 5 for t in trials) and plan.baseline == "lstm"
    assert StudyPlan.from_dict(json.loads(json.dumps(plan.to_dict()))).hash == plan.hash


@pytest.mark.parametrize("call, needle", [
    (lambda: StudyPlan.make([], "adding"), "a study needs a list of one or more cells, got \\[\\]"),
    (lambda: StudyPlan.make(7, "adding"), "a study needs a list of one or more cells, got 7"),
    (lambda: StudyPlan.make(["nope"], "adding"), "unknown cell 'nope'"),
    (lambda: StudyPlan.make(["lstm"], "nope"), "unknown task 'nope'"),
    (lambda: StudyPlan.make(["lstm"], "adding", space={"lr": []}), r"space\['lr'\] must be a non-empty list"),
    (lambda: StudyPlan.make(["lstm"], "adding", space={"momentum": [0.9]}), "space names 'momentum'"),
    (lambda: StudyPlan.make(["lstm"], "adding", space={"lr": [0.1, 0.1]}), "repeats a value"),
    (lambda: StudyPlan.make(["lstm"], "adding", seeds=0), "seeds must be a count or a non-empty list"),
    (lambda: StudyPlan.make(["lstm"], "adding", seeds=[1, 1]), "seeds must be distinct"),
    (lambda: StudyPlan.make(["lstm"], "adding", space={"lr": [0.1]}, settings={"lr": 0.1}), "both fixed"),
    (lambda: StudyPlan.make(["lstm"], "adding", settings={"epochs": 3}), r"settings names \['epochs'\]"),
    (lambda: StudyPlan.make(["lstm"], "adding", baseline="gru"), "baseline 'gru' is not a cell of the study"),
    (lambda: StudyPlan.make(["lstm"], "adding", space={"lr": [0.1, -1.0]}), "lr must be a positive number"),
    (lambda: StudyPlan.make(["lstm", "lstm"], "adding"), "two cells of the study share a name"),
    (lambda: StudyPlan.make(["lstm"], "adding", settings={"device": "tpu"}), r"settings\['device'\] must be"),
])
def test_a_bad_study_is_refused_before_any_trial_runs_naming_what_is_wrong(call, needle):
    with pytest.raises(engine.EngineError, match=needle) as caught:
        call()
    assert "hint:" in str(caught.value)


# ---- the folder ---------------------------------------------------------------------------------------------------

def plan_of(**changes) -> StudyPlan:
    return StudyPlan.make(["lstm", "gru"], "adding", seeds=2, settings={**TINY, **changes})


def test_one_cell_is_a_study_of_its_seeds_and_a_folder_must_be_a_path(tmp_path):
    assert [t.cell for t in StudyPlan.make("gru", "adding", seeds=2).trials] == ["gru", "gru"]
    with pytest.raises(StudyError, match="the study's folder must be a path, got int 5"):
        store.open_folder(5, plan_of())


def test_a_folder_of_another_study_is_refused_naming_it(tmp_path):
    store.open_folder(tmp_path / "s", plan_of())
    store.open_folder(tmp_path / "s", plan_of())                            # the same study: resumed
    with pytest.raises(StudyError, match=r"holds another study \(task 'adding', cells \['lstm', 'gru'\]"):
        store.open_folder(tmp_path / "s", plan_of(steps=7))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(StudyError, match="is not empty and holds no study"):
        store.open_folder(tmp_path / "busy", plan_of())
    (tmp_path / "file").write_text("x")
    with pytest.raises(StudyError, match="is a file"):
        store.open_folder(tmp_path / "file", plan_of())


def test_a_line_cut_short_by_a_kill_is_skipped_and_the_next_one_starts_on_its_own_line(tmp_path):
    plan = plan_of()
    folder = store.open_folder(tmp_path / "s", plan)
    first, second, third = plan.trials[:3]
    store.append(folder, first, error="TrainingError: diverged")
    with open(folder / store.TRIALS, "ab") as f:
        f.write(b'{"id": "' + second.id.encode() + b'", "status": "ok", "trial": {')      # killed mid-write
    assert set(store.finished(folder)) == {first.id}
    store.append(folder, third, error="MemoryError")
    assert set(store.finished(folder)) == {first.id, third.id}
    assert store.finished(folder)[third.id]["error"] == "MemoryError"


# ---- the comparison -----------------------------------------------------------------------------------------------

def test_welch_is_scipys_unequal_variance_t_test_and_says_when_it_cannot_run():
    from scipy import stats
    a, b = [1.0, 1.2, 0.9, 1.1], [1.5, 1.7, 1.6, 2.4]
    p, _ = welch(a, b)
    assert p == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue) and p < 0.05
    assert welch([1.0], b) == (None, "needs 2 or more finished seeds on each side")
    assert welch([1.0, 1.0], [1.0, 1.0])[0] is None


def test_the_best_variant_is_chosen_on_the_held_out_metric_and_compared_on_the_test_one():
    found = [Variant("lstm lr=0.1", "lstm", (1.0, 1.1, 0.9), (5.0, 5.1, 4.9), 0),
             Variant("lstm lr=0.01", "lstm", (2.0, 2.1, 1.9), (1.0, 1.1, 0.9), 0),     # better test, worse held-out
             Variant("gru lr=0.1", "gru", (0.5, 0.6, 0.4), (3.0, 3.2, 2.9), 1)]
    best = best_variants(found, higher_is_better=False)
    assert best["lstm"].name == "lstm lr=0.1" and best["gru"].name == "gru lr=0.1"
    (row,) = compare_with_baseline(best, "lstm", higher_is_better=False)
    assert row.cell == "gru" and row.difference == pytest.approx(np.mean([3.0, 3.2, 2.9]) - 5.0)
    assert row.p_value < 0.05 and row.verdict == "better"                  # lower test NLL than lstm's best
    (flipped,) = compare_with_baseline(best, "lstm", higher_is_better=True)
    assert flipped.verdict == "worse"


# ---- on Ray -------------------------------------------------------------------------------------------------------

@pytest.mark.xdist_group("ray")
def test_a_study_on_ray_gives_engine_trains_results_and_keeps_them(local_ray, tmp_path):
    seen = []
    s = engine.study(["lstm", "gru"], "adding", seeds=2, space={"lr": [0.02, 0.005]}, settings=TINY,
                     folder=tmp_path / "s", on_progress=lambda p: seen.append((p.done, p.total, p.failed)))
    assert s.finished == len(s.trials) == 8 and not s.failures
    assert seen[0] == (0, 8, 0) and seen[-1] == (8, 8, 0)
    direct = engine.train("gru", "adding", seed=1, lr=0.005, **TINY)
    (result,) = [r for r in s.results() if r["variant"] == "gru lr=0.005" and r["seed"] == 1]
    assert result["eval_metrics"] == direct.eval_metrics and result["losses"] == direct.losses
    saved = load_study(tmp_path / "s")
    assert saved.finished == 8 and [v.held_out for v in saved.variants()] == [v.held_out for v in s.variants()]
    assert [c.cell for c in saved.comparison()] == ["gru"]
    again = engine.study(["lstm", "gru"], "adding", seeds=2, space={"lr": [0.02, 0.005]}, settings=TINY,
                         folder=tmp_path / "s", on_progress=lambda p: seen.append(p.resumed))
    assert again.finished == 8 and seen[-1] == 8                           # nothing ran again
    assert len((tmp_path / "s" / store.TRIALS).read_text().splitlines()) == 8


@engine.cell
def overflowing(x, h):
    h_next = exp(1000.0 * (W("W_x") @ x) + W("W_h") @ h)       # inf from the first step: the loss is not finite
    return {"h": h_next}


@pytest.mark.xdist_group("ray")
def test_a_failed_trial_is_recorded_with_its_error_and_the_study_goes_on(local_ray, tmp_path):
    s = engine.study(["lstm", overflowing], "adding", seeds=2, settings=TINY, folder=tmp_path / "s")
    assert s.finished == 4
    failed = s.failures
    assert [line["trial"]["cell"] for line in failed] == ["overflowing", "overflowing"]
    assert all("TrainingError: training stopped at step 1 of 6" in line["error"] for line in failed)
    assert [r["cell"] for r in s.results()] == ["lstm", "lstm"]
    assert s.comparison() == []                                             # no finished seed of the other cell
    retried = engine.resume_study(tmp_path / "s", retry_failed=True)
    assert len(retried.failures) == 2                                      # the same settings fail the same way


@pytest.mark.xdist_group("ray")
def test_a_killed_study_resumes_with_only_its_unfinished_trials(local_ray, tmp_path):
    folder = tmp_path / "s"
    argv = [sys.executable, "-m", "engine", "study", "lstm", "gru", "mgu", "--task", "adding", "--seeds", "4",
            "-H", "4", "--steps", "150", "-T", "6", "-B", "4", "--device", "cpu", "--folder", str(folder)]
    process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    trials = folder / store.TRIALS
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not trials.exists() or len(trials.read_text().splitlines()) < 3):
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)                                 # the driver and its local Ray
    process.wait()
    before = store.finished(folder)
    assert 3 <= len(before) < 12, len(before)
    code = subprocess.run([sys.executable, "-m", "engine", "study", "--resume", str(folder)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert code.returncode == 0, code.stderr[-2000:]
    assert f"({len(before)} before this run)" in code.stderr
    assert "12/12 trials finished, 0 failed" in code.stdout
    lines = [json.loads(line) for line in trials.read_text().splitlines() if line.strip().endswith("}")]
    ids = [line["id"] for line in lines]
    assert sorted(set(ids)) == sorted(t.id for t in load_study(folder).trials)
    assert all(ids.count(i) == 1 for i in before)                          # no finished trial ran again


def test_a_ray_address_that_does_not_answer_is_refused_at_once():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                                          # free, nothing listening
    started = time.monotonic()
    with pytest.raises(StudyError, match=rf"the Ray cluster at '127.0.0.1:{port}' does not answer"):
        check_address(f"127.0.0.1:{port}")
    assert time.monotonic() - started < 10
    with pytest.raises(StudyError, match="is not host:port"):
        check_address("no-port-here")


def test_the_cli_refuses_bad_studies_with_one_line(tmp_path, capsys):
    assert main(["study", "--task", "adding"]) == 2
    assert "no cell to study" in capsys.readouterr().err
    assert main(["study", "--show", str(tmp_path / "missing")]) == 2
    assert "study.json" in capsys.readouterr().err
    assert main(["study", "lstm", "--lr", "0", "--folder", str(tmp_path / "s")]) == 2
    assert "--lr" in capsys.readouterr().err
    assert main(["study", "lstm", "--address", "127.0.0.1:1", "--folder", str(tmp_path / "s")]) == 2
    assert "does not answer" in capsys.readouterr().err


def test_a_cell_the_gpus_training_step_cannot_take_is_refused_before_any_trial(monkeypatch):
    from engine.autodiff.errors import AutodiffError
    from engine.study import runner

    def planner(cell):
        if cell.name == "gru":
            raise AutodiffError("value 'x' has no place", node="x")
    monkeypatch.setattr(runner, "training_plan", planner)
    plan = runner.resolve_device(StudyPlan.make(["lstm", "gru"], "adding", seeds=2), gpus=2)
    assert plan.settings["device"] == "gpu"
    with pytest.raises(StudyError, match=r"cannot train 'gru' \(node 'x': value 'x' has no place.*hint: settings=\{'device': "
                                         r"'cpu'\}"):
        runner.check_gpu_cells(plan)
    runner.check_gpu_cells(runner.resolve_device(StudyPlan.make(["gru"], "adding", seeds=2), gpus=0))   # CPU: none


def test_a_ray_that_cannot_start_is_a_named_error(monkeypatch):
    from engine.study import runner
    monkeypatch.setattr(ray, "is_initialized", lambda: False)

    def refuse(**_):
        raise RuntimeError("Failed to start the GCS server\nmore lines")
    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(StudyError, match=r"an embedded local Ray could not be started or joined: RuntimeError: "
                                         r"Failed to start the GCS server; hint: check `ray status`"):
        runner.connect(None)
