"""Running a study's trials on Ray: each trial is a Ray task holding one GPU, or CPU cores where the cluster has no
GPU, and the driver writes each finished trial to the study's folder as it ends.

`ray.init()` starts an embedded local Ray when no address is given, so one machine needs no setup; an address joins
an existing cluster (checked to answer first: Ray itself retries an unreachable one for minutes). The driver keeps
as many trials in flight as the cluster has slots, so the trials in flight are the ones running and a study of
thousands of trials does not queue them all at once.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

from ..autodiff.fused_planner import training_plan
from ..errors import EngineError
from ..serialize import from_dict
from ..training.loop import train
from ..training.results import TrainResult
from . import store
from .errors import StudyError
from .trials import StudyPlan, Trial

CONNECT_TIMEOUT_S = 5.0
ROOT = Path(__file__).resolve().parents[2]          # the checkout: engine/, kernels/


@dataclass
class StudyProgress:
    total: int                              # trials of the study
    done: int = 0                           # finished, ok or failed (those finished before a restart included)
    failed: int = 0
    running: list[str] = field(default_factory=list)    # labels of the trials in flight
    resumed: int = 0                        # finished before this run started (a restarted study)


Progress = Callable[[StudyProgress], None]


def run_trial(trial: dict) -> dict:
    """One trial, in a Ray worker: train, and say how it ended (a failure is data, not an exception)."""
    try:
        result = train(from_dict(trial["cell_json"]), trial["task"], seed=trial["seed"], **trial["settings"])
        return {"status": "ok", "result": result.to_dict()}
    except EngineError as e:
        return {"status": "failed", "error": f"{type(e).__name__}: {e}"}
    except MemoryError:
        return {"status": "failed", "error": "MemoryError: the trial ran out of memory"}
    except Exception as e:          # an out-of-memory of CuPy, a bug: recorded with the trial, the study goes on
        return {"status": "failed", "error": f"{type(e).__name__}: {e}"}


def check_address(address: str) -> None:
    """Refuse an address of a Ray cluster that does not take a TCP connection within CONNECT_TIMEOUT_S."""
    if address == "auto":
        return
    parsed = urlparse(address if "://" in address else f"ray://{address}")
    try:
        host, port = parsed.hostname, parsed.port
    except ValueError:
        host = port = None
    if not host or not port:
        raise StudyError(f"Ray address {address!r} is not host:port", hint="e.g. --address 10.0.0.5:6379, "
                                                                          "ray://10.0.0.5:10001 or auto")
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise StudyError(f"the Ray cluster at {address!r} does not answer ({e.strerror or e})",
                         hint="start it with `ray start --head` there, check the address, or leave the address out "
                              "to run on an embedded local Ray") from None


def connect(address: str | None):
    """Ray, initialised: the cluster at `address`, else an embedded local one (reused if already up)."""
    try:
        import ray  # deferred: ray is only needed by studies, and takes a second to import
    except ImportError:
        raise StudyError("studies run on Ray, which is not installed", hint="pip install -r requirements.txt") \
            from None
    if address:
        check_address(address)
    if ray.is_initialized():            # this process's Ray (a study before, or the caller's own ray.init)
        return ray
    if address:
        # Workers of a cluster get this checkout (engine/ and kernels/, which GPU trials compile), not its
        # environments or results.
        code = {"working_dir": str(ROOT), "excludes": [".venv", ".git", "benchmarks/results", "designs", "studies",
                                                        "*.npz", "__pycache__"]}
    else:
        # local workers import this checkout's engine, and whatever the driver's PYTHONPATH holds
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        code = {"env_vars": {"PYTHONPATH": path}}
    try:
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 runtime_env=code)
    except Exception as e:          # Ray raises ConnectionError, RuntimeError, ValueError, its own types
        where = f"the Ray cluster at {address!r}" if address else "an embedded local Ray"
        raise StudyError(f"{where} could not be started or joined: {type(e).__name__}: {str(e).splitlines()[0]}",
                         hint="check `ray status` there, or leave --address out to run on this machine") from None
    return ray


def resolve_device(plan: StudyPlan, gpus: float) -> StudyPlan:
    """device "auto" in the plan's settings made "gpu" where the cluster has a GPU, else "cpu" (part of the
    study's definition: the GPU trains in float32, the CPU in float64)."""
    if plan.settings.get("device") != "auto":
        return plan
    device = "gpu" if gpus >= 1 else "cpu"
    return StudyPlan(plan.cells, plan.task, plan.seeds, plan.space, {**plan.settings, "device": device},
                     plan.baseline)


def check_gpu_cells(plan: StudyPlan) -> None:
    """On the GPU every trial trains on the generated training step: a cell it cannot take is refused before any
    trial runs (on the driver, which may have no GPU of its own), not found failing in every one of its trials."""
    if plan.settings.get("device") != "gpu":
        return
    refused = []
    for name, cell_json in plan.cells:
        try:
            training_plan(from_dict(cell_json))
        except EngineError as e:
            refused.append(f"'{name}' ({e})")
    if refused:
        raise StudyError("the GPU's training step cannot train " + "; ".join(refused),
                         hint="settings={'device': 'cpu'} trains every cell on the CPU in float64")


def run(plan: StudyPlan, folder, ray, *, cpus_per_trial: int = 1, on_progress: Progress | None = None,
        retry_failed: bool = False) -> dict[str, dict]:
    """Run every trial of `plan` not yet finished in `folder` (failed ones too with retry_failed), each written as
    it ends; returns trial id -> its line."""
    trials = plan.trials
    lines = store.finished(folder)
    failed = {t.id for t in trials if lines.get(t.id, {}).get("status") == "failed"}
    todo = [t for t in trials if t.id not in lines or (retry_failed and t.id in failed)]
    progress = StudyProgress(total=len(trials), done=len(trials) - len(todo), failed=0 if retry_failed else len(failed))
    progress.resumed = progress.done
    on_gpu = plan.settings.get("device") == "gpu"
    resources = ray.cluster_resources()
    slots = int(resources.get("GPU", 0)) if on_gpu else int(resources.get("CPU", 1)) // max(1, cpus_per_trial)
    if slots < 1:
        raise StudyError(f"the Ray cluster has no {'GPU' if on_gpu else f'{cpus_per_trial} CPU cores'} for a trial",
                         hint="device='cpu' in settings, or fewer cpus_per_trial")
    remote = ray.remote(num_gpus=1 if on_gpu else 0, num_cpus=0 if on_gpu else cpus_per_trial,
                        max_retries=0)(run_trial)
    in_flight: dict = {}
    queue = list(todo)
    if on_progress:
        on_progress(progress)
    while queue or in_flight:
        while queue and len(in_flight) < slots:
            trial = queue.pop(0)
            in_flight[remote.remote(trial.to_dict())] = trial
        progress.running = [t.label for t in in_flight.values()]
        ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
        for ref in ready:
            trial = in_flight.pop(ref)
            lines[trial.id] = record(folder, trial, ray, ref)
            progress.done += 1
            progress.failed += lines[trial.id]["status"] == "failed"
        if on_progress and ready:
            progress.running = [t.label for t in in_flight.values()]
            on_progress(progress)
    return lines


def record(folder, trial: Trial, ray, ref) -> dict:
    try:
        outcome = ray.get(ref)
    except Exception as e:          # the worker died (killed, out of memory): the trial failed, the study goes on
        outcome = {"status": "failed", "error": f"{type(e).__name__}: {str(e).splitlines()[0][:500]}"}
    if outcome["status"] == "ok":
        return store.append(folder, trial, result=TrainResult.from_dict(outcome["result"]))
    return store.append(folder, trial, error=outcome["error"])
