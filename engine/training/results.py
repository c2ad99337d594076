"""What a training run returns, and its JSON form.

A result is self-contained: the cell (its JSON and structural hash), the task, every setting including the seed,
the curves and the final numbers. Training is a pure function of (cell, task, settings), so results from many
runs and machines can later be merged by `key` (ROADMAP: cell search at scale); the trained parameters stay in
memory (`params`, `readout`) and are not written to JSON.
"""
from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..files import load_json, write_text
from ..params import Params
from .errors import TrainingError

FORMAT = "cellforge.train_results/1"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numbers(value, at_least: int = 0) -> bool:
    return isinstance(value, list) and len(value) >= at_least and all(_number(v) for v in value)


FIELD_KINDS = {    # what from_dict accepts in each field of a stored result
    "cell": lambda v: isinstance(v, str), "cell_hash": lambda v: isinstance(v, str),
    "task": lambda v: isinstance(v, str), "metric": lambda v: isinstance(v, str),
    "cell_json": lambda v: isinstance(v, dict), "settings": lambda v: isinstance(v, dict),
    "environment": lambda v: isinstance(v, dict), "baseline": _number, "seconds": _number,
    "num_params": lambda v: isinstance(v, int) and not isinstance(v, bool), "losses": _numbers,
    "eval_steps": lambda v: _numbers(v) and all(isinstance(s, int) for s in v),
    "eval_losses": lambda v: _numbers(v, 1), "eval_metrics": lambda v: _numbers(v, 1),
    "test_loss": lambda v: v is None or _number(v), "test_metric": lambda v: v is None or _number(v),
}


@dataclass
class TrainResult:
    cell: str                           # the cell's name
    cell_hash: str                      # CellGraph.structural_hash: equal structure, equal hash
    cell_json: dict                     # engine.to_dict(cell): enough to rebuild and retrain it
    task: str
    metric: str                         # "mse", "nll" or "accuracy"
    baseline: float                     # the task's input-blind metric, the bar to beat
    settings: dict                      # hidden_size, num_layers, steps, batch, seq_len, lr, clip, seed, eval_...
    losses: list[float]                 # training loss at every step (1..steps)
    eval_steps: list[int]               # steps after which the held-out set was scored (0 = before training)
    eval_losses: list[float]
    eval_metrics: list[float]
    seconds: float                      # wall time of the whole run (the only field that varies between reruns)
    num_params: int                     # trained numbers: the network's and the readout's
    environment: dict = field(default_factory=dict)   # versions the curves were computed with
    test_loss: float | None = None      # on the task's test split after training (JSB Chorales' whole test chorales)
    test_metric: float | None = None    # None where the task has no test split
    params: Params | None = None        # the trained network parameters (not serialised)
    readout: dict | None = None         # the trained readout, W_out (O, H) and b_out (O,) (not serialised)

    @property
    def final_loss(self) -> float:
        """The held-out loss after the last step."""
        return self.eval_losses[-1]

    @property
    def final_metric(self) -> float:
        """The held-out metric after the last step."""
        return self.eval_metrics[-1]

    @property
    def key(self) -> tuple:
        """What makes two results the same experiment: the cell's structure, the task and every setting."""
        return (self.cell_hash, self.task, json.dumps(self.settings, sort_keys=True))

    def to_dict(self) -> dict:
        return {"cell": self.cell, "cell_hash": self.cell_hash, "task": self.task, "metric": self.metric,
                "baseline": self.baseline, "final_loss": self.final_loss, "final_metric": self.final_metric,
                "seconds": self.seconds, "num_params": self.num_params, "settings": self.settings,
                "losses": self.losses, "eval_steps": self.eval_steps, "eval_losses": self.eval_losses,
                "eval_metrics": self.eval_metrics, "test_loss": self.test_loss, "test_metric": self.test_metric,
                "environment": self.environment, "cell_json": self.cell_json}

    @staticmethod
    def from_dict(data: dict) -> "TrainResult":
        if not isinstance(data, dict):
            raise TrainingError(f"not a training result: a result is a JSON object, got {type(data).__name__}",
                                hint="pass a file written by save_results or `python -m engine train --json`")
        for key, kind in FIELD_KINDS.items():
            if key in data and not kind(data[key]):
                raise TrainingError(f"not a training result: field '{key}' has the wrong type "
                                    f"({type(data[key]).__name__})",
                                    hint="pass a file written by save_results or `python -m engine train --json`")
        try:
            return TrainResult(**{k: data[k] for k in (
                "cell", "cell_hash", "cell_json", "task", "metric", "baseline", "settings", "losses", "eval_steps",
                "eval_losses", "eval_metrics", "seconds", "num_params")}, environment=data.get("environment", {}),
                test_loss=data.get("test_loss"), test_metric=data.get("test_metric"))
        except (KeyError, TypeError) as e:
            raise TrainingError(f"not a training result: missing or bad field {e}",
                                hint="pass a file written by save_results or `python -m engine train --json`") \
                from None


def environment() -> dict:
    """Bit-identical reruns hold for one machine and library build; record which."""
    return {"numpy": np.__version__, "python": platform.python_version(), "machine": platform.machine()}


def results_to_json(results: list[TrainResult]) -> str:
    return json.dumps({"format": FORMAT, "results": [r.to_dict() for r in results]}, indent=1)


def save_results(results: list[TrainResult], path: str | Path, *, flag: str | None = None) -> Path:
    """Write atomically (engine/files.py), so an interrupted run never leaves half a file nor a temporary;
    a destination that cannot take the file is a FileError naming `flag` (the CLI option that gave it)."""
    return write_text(path, results_to_json(results) + "\n", "training results", flag=flag)


def training_error(message: str, hint: str) -> TrainingError:
    return TrainingError(message, hint=hint)


def load_results(path: str | Path) -> list[TrainResult]:
    hint = "pass a file written by `python -m engine train --json`"
    data = load_json(path, "training results", error=training_error, hint=hint)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TrainingError(f"{str(path)!r} is not a training results file (format {FORMAT!r})", hint=hint)
    if not isinstance(data.get("results"), list):
        raise TrainingError(f"{str(path)!r}: field 'results' must be a list of training results", hint=hint)
    return [TrainResult.from_dict(r) for r in data["results"]]
