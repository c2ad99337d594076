"""Designs as JSON files: read an upload, and save/list/load named designs in the designs folder.

Only valid cells are saved and loaded: a file in designs/ or a download always opens again. Work in
progress is never lost anyway: it lives in the session's autosaved working design (see app.state).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import engine
from engine.errors import Problem

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
    """Write designs/<name>.json atomically (temporary file, then os.replace)."""
    problem = name_problem(name)
    if problem:
        raise ValueError(problem)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(engine.to_dict(cell), indent=2))
    os.replace(tmp, path)
    return path


def load_design(folder: Path, name: str) -> tuple[dict | None, list[Problem]]:
    problem = name_problem(name)
    if problem:
        return None, [Problem(problem, field="name")]
    path = folder / f"{name}.json"
    try:
        text = path.read_bytes()
    except OSError as e:
        return None, [Problem(f"cannot read {path}: {e.strerror}", field="(file)")]
    return read_design(text)
