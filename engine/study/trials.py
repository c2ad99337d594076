"""A study's trials: every (cell, hyperparameters, seed) of a grid, each a pure value with a stable id.

    plan = StudyPlan.make(["lstm", "gru"], "jsb", seeds=[0, 1, 2], space={"lr": [0.01, 0.003]},
                          settings={"hidden_size": 32, "steps": 500})
    [t.label for t in plan.trials]      # "lstm lr=0.01 seed 0", ...

A trial is what engine.train needs and nothing else: the cell as JSON (so a worker on another machine rebuilds it),
the task's name, and every setting. Its id hashes that value, so the same trial has the same id in any process and
a restarted study knows which trials it has already run (ROADMAP: trials mergeable across searches).
"""
from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from functools import cached_property

from ..arguments import shown
from ..errors import EngineError
from ..gallery import Preset
from ..gallery import get as get_preset
from ..ir import CellGraph
from ..serialize import from_dict, to_dict
from ..training.loop import EXAMPLES, check_settings
from ..training.tasks import get_task
from .errors import StudyError

FORMAT = "cellforge.study/1"
SPACE_KEYS = ("lr", "hidden_size", "num_layers", "batch", "seq_len", "clip", "steps")   # what a study may vary
SETTING_KEYS = SPACE_KEYS + ("eval_every", "eval_batch", "device")
DEFAULTS = {"hidden_size": 32, "num_layers": 1, "steps": 200, "batch": 16, "seq_len": 20, "lr": 0.01, "clip": 1.0,
            "eval_every": None, "eval_batch": 128, "device": "auto"}   # auto: "gpu" where the cluster has GPUs
MAX_TRIALS = 100_000


@dataclass(frozen=True)
class Trial:
    cell: str                   # the cell's name
    cell_json: dict             # engine.to_dict(cell)
    task: str
    seed: int
    settings: dict              # every keyword of engine.train but the seed
    variant: str                # the cell and the space's values, e.g. "lstm lr=0.01"

    @cached_property
    def id(self) -> str:
        value = json.dumps({"cell": self.cell_json, "task": self.task, "seed": self.seed,
                            "settings": self.settings}, sort_keys=True)
        return hashlib.sha256(value.encode()).hexdigest()[:16]

    @property
    def label(self) -> str:
        return f"{self.variant} seed {self.seed}"

    def to_dict(self) -> dict:
        return {"id": self.id, "cell": self.cell, "cell_json": self.cell_json, "task": self.task, "seed": self.seed,
                "settings": self.settings, "variant": self.variant}


def cell_of(spec) -> tuple[str, dict]:
    """(name, cell JSON) of a preset name, a Preset, a CellGraph or a cell JSON dict."""
    if isinstance(spec, str):
        try:
            spec = get_preset(spec)
        except EngineError as e:
            raise StudyError(f"unknown cell {spec!r}: {e}", hint="name a preset (engine.presets()) or pass a "
                                                                   "CellGraph") from None
    if isinstance(spec, Preset):
        spec = spec.cell
    if isinstance(spec, dict):
        spec = from_dict(spec)
    if not isinstance(spec, CellGraph):
        raise StudyError(f"a study's cell must be a preset name, a Preset or a CellGraph, got {type(spec).__name__}",
                         hint="engine.study(['lstm', my_cell], ...)")
    return spec.name, to_dict(spec)


def check_space(space) -> dict[str, list]:
    if not isinstance(space, dict):
        raise StudyError(f"space must be a dict of setting -> list of values, got {type(space).__name__}",
                         hint="space={'lr': [0.01, 0.003]}")
    checked = {}
    for key, values in space.items():
        if key not in SPACE_KEYS:
            raise StudyError(f"space names {key!r}, which a study cannot vary",
                             hint="vary " + ", ".join(SPACE_KEYS))
        if not isinstance(values, (list, tuple)) or not values:
            raise StudyError(f"space[{key!r}] must be a non-empty list of values, got {values!r}",
                             hint=f"space={{'{key}': [{DEFAULTS[key]}]}}")
        if len(set(map(repr, values))) != len(values):
            raise StudyError(f"space[{key!r}] repeats a value: {list(values)!r}", hint="list each value once")
        checked[key] = list(values)
    return checked


def check_seeds(seeds) -> list[int]:
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = list(range(seeds))
    if not isinstance(seeds, (list, tuple, range)) or not seeds:
        raise StudyError(f"seeds must be a count or a non-empty list of seeds, got {seeds!r}",
                         hint="seeds=5 (seeds 0 to 4) or seeds=[0, 1, 2]")
    seeds = list(seeds)
    if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise StudyError(f"seeds must be distinct non-negative integers, got {seeds!r}", hint="seeds=[0, 1, 2]")
    return seeds


def variant_name(cell: str, values: dict) -> str:
    return " ".join([cell] + [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()])


@dataclass(frozen=True)
class StudyPlan:
    """What a study runs: its definition (saved as study.json; its hash names the study) and its trials."""
    cells: tuple[tuple[str, dict], ...]
    task: str
    seeds: tuple[int, ...]
    space: dict
    settings: dict
    baseline: str               # the cell the others are compared with (the first unless named)

    @staticmethod
    def make(cells, task, *, seeds=3, space=None, settings=None, baseline: str | None = None) -> "StudyPlan":
        if isinstance(cells, (str, Preset, CellGraph, dict)):
            cells = [cells]                                 # one cell: a study of its seeds and settings
        if not isinstance(cells, (list, tuple)) or not cells:
            raise StudyError(f"a study needs a list of one or more cells, got {shown(cells)}",
                             hint="engine.study(['lstm', 'gru'], 'jsb', ...)")
        named = [cell_of(c) for c in cells]
        names = [n for n, _ in named]
        if len(set(names)) != len(names):
            raise StudyError(f"two cells of the study share a name: {names}", hint="give each cell its own name")
        task = get_task(task).name
        space = check_space(space or {})
        unknown = sorted(set(settings or {}) - set(SETTING_KEYS))
        if unknown:
            raise StudyError(f"settings names {unknown}, which engine.train does not take",
                             hint="settings may hold " + ", ".join(SETTING_KEYS))
        both = sorted(set(settings or {}) & set(space))
        if both:
            raise StudyError(f"{both} is both fixed in settings and varied in space", hint="give it in one of them")
        settings = {**DEFAULTS, **(settings or {})}
        if settings["device"] not in ("auto", "cpu", "gpu"):
            raise StudyError(f"settings['device'] must be 'auto', 'cpu' or 'gpu', got {shown(settings['device'])}",
                             hint="'auto' (the default): a GPU a trial where Ray has GPUs, else CPU cores")
        if baseline is None:
            baseline = names[0]
        if baseline not in names:
            raise StudyError(f"baseline {baseline!r} is not a cell of the study", hint=f"one of {names}")
        plan = StudyPlan(tuple(named), task, tuple(check_seeds(seeds)), space, settings, baseline)
        total = len(plan.cells) * len(plan.seeds) * len(list(plan.grid()))
        if total > MAX_TRIALS:
            raise StudyError(f"the study has {total:,} trials, more than {MAX_TRIALS:,}",
                             hint="fewer seeds or fewer values in space")
        for values in plan.grid():             # every setting checked before the first trial runs
            merged = {**settings, **values}
            steps, eval_every = merged["steps"], merged["eval_every"]
            if eval_every is None and isinstance(steps, int):
                eval_every = max(1, steps // 10)                      # engine.train's default
            try:
                check_settings(get_task(task), steps, merged["batch"], merged["seq_len"], merged["lr"],
                               merged["clip"], 0, eval_every, merged["eval_batch"])
            except EngineError as e:
                raise StudyError(f"settings {values or settings} cannot train: {e}",
                                 hint=f"e.g. {EXAMPLES}") from None
        return plan

    def grid(self):
        """Every combination of the space's values, in order (one empty dict when nothing varies)."""
        keys = list(self.space)
        for values in itertools.product(*(self.space[k] for k in keys)):
            yield dict(zip(keys, values))

    @cached_property
    def trials(self) -> list[Trial]:
        return [Trial(name, cell_json, self.task, seed, {**self.settings, **values}, variant_name(name, values))
                for name, cell_json in self.cells for values in self.grid() for seed in self.seeds]

    def to_dict(self) -> dict:
        return {"format": FORMAT, "cells": [{"name": n, "cell_json": j} for n, j in self.cells], "task": self.task,
                "seeds": list(self.seeds), "space": self.space, "settings": self.settings, "baseline": self.baseline}

    @cached_property
    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]

    @staticmethod
    def from_dict(data: dict) -> "StudyPlan":
        return StudyPlan(tuple((c["name"], c["cell_json"]) for c in data["cells"]), data["task"],
                         tuple(data["seeds"]), data["space"], data["settings"], data["baseline"])
