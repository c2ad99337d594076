"""A study's folder: study.json (its definition) and trials.jsonl (one line a finished trial, appended as it ends).

    folder/study.json      {"format": "cellforge.study/1", "hash": ..., "cells": [...], "task": ..., ...}
    folder/trials.jsonl    {"id": ..., "status": "ok", "trial": {...}, "result": {TrainResult.to_dict()}}
                           {"id": ..., "status": "failed", "trial": {...}, "error": "TrainingError: ..."}

Only the process that runs the study writes, one whole line a trial in one write() on a file opened for appending,
then fsync: a study killed at any moment leaves every finished trial on disk, and at worst a last line cut short,
which reading skips (that trial runs again). A folder holding another study's definition is refused, so two
studies never mix their trials.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..files import check_destination, error_of, load_json, write_text
from ..training.results import TrainResult
from .errors import StudyError
from .trials import FORMAT, StudyPlan, Trial

DEFINITION, TRIALS = "study.json", "trials.jsonl"


def open_folder(folder, plan: StudyPlan) -> Path:
    """The study's folder, made and given the plan's definition, or found holding the same one."""
    if not isinstance(folder, (str, os.PathLike)) or not str(folder):
        raise StudyError(f"the study's folder must be a path, got {type(folder).__name__} {folder!r}"[:200],
                         hint="folder='studies/my-study'")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise StudyError(f"the study folder {str(folder)!r} is a file", hint="give a folder (it is made if missing)")
    definition = folder / DEFINITION
    if definition.is_file():
        saved = read_definition(folder)
        if saved.get("hash") != plan.hash:
            raise StudyError(f"the folder {str(folder)!r} holds another study (task {saved.get('task')!r}, "
                             f"cells {[c.get('name') for c in saved.get('cells', [])]}, its own seeds and settings)",
                             hint="give this study a folder of its own, or rerun the saved one with "
                                  "engine.resume_study(folder)")
        return folder
    if folder.is_dir() and any(folder.iterdir()):
        raise StudyError(f"the folder {str(folder)!r} is not empty and holds no study",
                         hint="give a new or empty folder")
    check_destination(definition, "the study's definition")
    write_text(definition, json.dumps({**plan.to_dict(), "hash": plan.hash}, indent=1) + "\n",
               "the study's definition")
    return folder


def read_definition(folder) -> dict:
    data = load_json(Path(folder) / DEFINITION, "the study's definition", error=error_of(StudyError),
                     hint="give a folder written by engine.study")
    if not isinstance(data, dict) or data.get("format") != FORMAT or "hash" not in data:
        raise StudyError(f"{str(Path(folder) / DEFINITION)!r} is not a study definition (format {FORMAT!r})",
                         hint="give a folder written by engine.study")
    return data


def plan_of(folder) -> StudyPlan:
    """The saved study's plan (engine.resume_study)."""
    data = read_definition(folder)
    try:
        plan = StudyPlan.from_dict(data)
    except (KeyError, TypeError) as e:
        raise StudyError(f"the study definition in {str(folder)!r} lacks {e}", hint="give a folder written by "
                                                                                  "engine.study") from None
    if plan.hash != data["hash"]:
        raise StudyError(f"the study definition in {str(folder)!r} was edited (its hash does not match)",
                         hint="start a new study in a new folder")
    return plan


def finished(folder) -> dict[str, dict]:
    """Trial id -> its line, for every whole line of trials.jsonl (the last of a trial's lines wins)."""
    path = Path(folder) / TRIALS
    if not path.is_file():
        return {}
    lines = {}
    for raw in path.read_bytes().split(b"\n"):
        try:
            line = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue                                      # a line cut short by a kill: that trial runs again
        if isinstance(line, dict) and isinstance(line.get("id"), str) and line.get("status") in ("ok", "failed"):
            lines[line["id"]] = line
    return lines


def append(folder, trial: Trial, *, result: TrainResult | None = None, error: str | None = None) -> dict:
    """Write one finished trial as one line, durably."""
    line = {"id": trial.id, "status": "ok" if result is not None else "failed", "trial": trial.to_dict()}
    if result is not None:
        line["result"] = result.to_dict()
    else:
        line["error"] = error
    data = (json.dumps(line) + "\n").encode()
    fd = os.open(Path(folder) / TRIALS, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data                              # after a line cut short, on a line of its own
        written = os.write(fd, data)
        if written != len(data):
            raise StudyError(f"wrote {written} of {len(data)} bytes of a trial to {str(folder)!r}",
                             hint="check the free space of the disk")
        os.fsync(fd)
    finally:
        os.close(fd)
    return line
