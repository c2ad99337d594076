"""Designs as JSON files: read an upload, and save/list/load named designs in the designs folder.

Only valid cells are saved and loaded: a file in designs/ or a download always opens again. Work in
progress is never lost anyway: it lives in the session's autosaved working design (see app.state).
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import engine
from engine.errors import Problem
from engine.files import write_text

NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
RESERVED = ("autosave",)


def read_design(text: str | bytes) -> tuple[dict | None, list[Problem]]:
    """Parse cell JSON text: (design, []) for a valid cell, else (None, problems naming the field)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            return None, [Problem(f"the file is not UTF-8 text ({e.reason} at byte {e.start})", field="(file)",
                                  hint="upload a .json file exported from this app")]
    try:
        cell = engine.from_json(text)
    except engine.CellGraphError as e:
        return None, e.problems
    return engine.to_dict(cell), []


def name_problem(name: str) -> str | None:
    if not NAME_PATTERN.fullmatch(name or ""):
        return (f"'{name}' is not a usable file name. hint: use letters, digits, '_', '-' or '.', "
                "at most 64, not starting with '.' or '-'")
    if name.lower() in RESERVED:
        return f"'{name}' is reserved for the autosave. hint: choose another name"
    return None


def list_designs(folder: Path) -> list[str]:
    """Names of the saved designs (file stems), the autosave left out."""
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.json") if p.stem.lower() not in RESERVED)


def save_design(folder: Path, name: str, cell: engine.CellGraph) -> Path:
    """Write designs/<name>.json atomically (temporary file, then os.replace). A file of that name that does
    not hold a valid cell is never overwritten (ValueError naming it): it may be someone's work to rescue."""
    problem = name_problem(name)
    if problem:
        raise ValueError(problem)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    if path.exists():
        try:
            readable = read_design(path.read_bytes())[0] is not None
        except OSError:
            readable = False
        if not readable:
            raise ValueError(f"{path} exists and does not hold a valid cell, so it is not overwritten. hint: save "
                             "under another name, or repair or move that file")
    _write(path, json.dumps(engine.to_dict(cell), indent=2))
    return path


def _write(path: Path, text: str) -> None:
    write_text(path, text, "the design")


def duplicate_design(folder: Path, name: str) -> str:
    """Copy designs/<name>.json to the first free <name>-copy, <name>-copy2, ...; returns the new name."""
    design, problems = load_design(folder, name)
    if design is None:
        raise ValueError("; ".join(p.message for p in problems))
    for n in range(1, 1000):
        new = f"{name[:58]}-copy" + ("" if n == 1 else str(n))
        if not (folder / f"{new}.json").exists():
            _write(folder / f"{new}.json", json.dumps(design, indent=2))
            return new
    raise ValueError(f"no free name for a copy of '{name}'. hint: delete some copies")


def delete_design(folder: Path, name: str) -> Path:
    """Move designs/<name>.json into designs/.deleted/ (with the time in its name): nothing is destroyed, and
    the saved list no longer shows it. Returns where it went."""
    problem = name_problem(name)
    if problem:
        raise ValueError(problem)
    path = folder / f"{name}.json"
    if not path.exists():
        raise ValueError(f"{path} does not exist (deleted already?)")
    trash = folder / ".deleted"
    trash.mkdir(exist_ok=True)
    target = trash / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.json"
    os.replace(path, target)
    return target


def load_design(folder: Path, name: str) -> tuple[dict | None, list[Problem]]:
    problem = name_problem(name)
    if problem:
        return None, [Problem(problem, field="name")]
    path = folder / f"{name}.json"
    try:
        text = path.read_bytes()
    except OSError as e:
        return None, [Problem(f"cannot read {path}: {e.strerror}", field="(file)")]
    design, problems = read_design(text)
    if design is None:          # say which file: the problems name fields inside it
        problems = [Problem(f"{path} is not a valid cell; it is left as it is", field="(file)",
                            hint="repair it in an editor, or delete it here")] + list(problems)
    return design, problems
