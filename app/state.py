"""The design being edited, shared by every page of a session, with undo/redo and an autosave.

    state.current_design()        # the cell JSON (engine.to_dict form), possibly invalid while editing
    state.current_cell()          # the validated engine.CellGraph, or None while the design is invalid
    state.set_current_design(d, source="gallery")
    state.undo(); state.redo()
    state.design_sizes()          # input_size, hidden_size, num_layers, steps, batch

Each browser session has a working design of its own: the page's URL carries an id
(`?design=<32 hex digits>`, put there on the first run), and every change is written to
designs/sessions/<id>.json (a temporary file, then os.replace: a crash never leaves half a file). A
reload keeps the URL, so it finds the design again; another user (another URL) never sees it. A new
session starts from the "lstm" preset. A working file that does not parse is reported with its path,
moved aside (never overwritten) and the session starts from the preset. RNN_DESIGNS_DIR moves the
designs folder (the tests point it at a temporary one).

Snapshots are kept as JSON text: immutable, cheap to compare, and exactly what is saved.
"""
from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path

import streamlit as st

import engine

ROOT = Path(__file__).resolve().parents[1]
SESSION_PARAM = "design"              # the URL query parameter naming a session's working design
SESSIONS = "sessions"                 # designs/sessions/<id>.json: each session's working design
TOKEN_PATTERN = re.compile(r"[0-9a-f]{32}")
HISTORY_LIMIT = 200
DEFAULT_SIZES = {"input_size": 64, "hidden_size": 256, "num_layers": 2, "steps": 50, "batch": 16,
                 "proj_size": 128}      # P: used by cells with projected states only

_DESIGN = "state.design"              # JSON text of the current design
_HISTORY = "state.history"            # list of JSON texts, oldest first
_CURSOR = "state.cursor"              # index of the current design in the history
_SOURCE = "state.source"
_SIZES = "state.sizes"
_CELL = "state.cell"                  # (JSON text, CellGraph | None): the validation of the current text
_NOTICE = "state.notice"              # what the start-up or the last autosave has to tell the user
_TOKEN = "state.token"                # this session's working-design id


def designs_dir() -> Path:
    return Path(os.environ.get("RNN_DESIGNS_DIR") or ROOT / "designs")


def _canonical(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True)


def _session() -> dict:
    ss = st.session_state
    if _TOKEN in ss and st.query_params.get(SESSION_PARAM) != ss[_TOKEN]:
        st.query_params[SESSION_PARAM] = ss[_TOKEN]      # a page switch may drop it: a reload must find the design
    if _DESIGN not in ss:
        text, source, notice = _first_design()
        ss[_DESIGN] = text
        ss[_HISTORY] = [text]
        ss[_CURSOR] = 0
        ss[_SOURCE] = source
        ss[_NOTICE] = notice
    return ss


def session_token() -> str:
    """This session's working-design id: the URL's `design` parameter when it is one this app made, else a
    new one, which goes into the URL so that a reload comes back to it."""
    ss = st.session_state
    if _TOKEN not in ss:
        given = st.query_params.get(SESSION_PARAM)
        if given and TOKEN_PATTERN.fullmatch(given):
            ss[_TOKEN] = given
        else:
            ss[_TOKEN] = uuid.uuid4().hex
            st.query_params[SESSION_PARAM] = ss[_TOKEN]
            if given:
                ss[_NOTICE] = (f"the link's design id {given!r} is not one this app makes (32 hex digits); "
                               "started a new design from the LSTM preset")
    return ss[_TOKEN]


def working_path() -> Path:
    """Where this session's working design is autosaved."""
    return designs_dir() / SESSIONS / f"{session_token()}.json"


def _first_design() -> tuple[str, str, str | None]:
    """(JSON text, source, notice): the session's working design when it is readable, else the LSTM preset.
    An unreadable file is moved aside, not overwritten, and the notice names where it went."""
    path = working_path()
    notice = st.session_state.get(_NOTICE)
    if path.exists():
        try:
            data = json.loads(path.read_text())
            if isinstance(data, dict):
                return json.dumps(data), "autosave", None
            problem = "does not hold a design object"
        except (OSError, ValueError) as e:
            problem = f"could not be read ({e})"
        kept = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            os.replace(path, kept)
            where = f"kept as {kept}"
        except OSError as e:
            where = f"left in place ({e})"
        notice = f"{path} {problem}; {where}; started from the LSTM preset instead"
    return json.dumps(engine.to_dict(engine.preset("lstm").cell)), "preset", notice


def _autosave(text: str) -> None:
    path = working_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        st.session_state[_NOTICE] = None
    except OSError as e:
        st.session_state[_NOTICE] = f"autosave to {path} failed: {e}"


def current_design() -> dict:
    """A fresh copy of the current design (edit it freely; call set_current_design to keep changes)."""
    return json.loads(_session()[_DESIGN])


def current_cell() -> engine.CellGraph | None:
    """The current design as a validated CellGraph, or None while it has problems."""
    ss = _session()
    text = ss[_DESIGN]
    cached = ss.get(_CELL)
    if cached is not None and cached[0] == text:
        return cached[1]
    try:
        cell = engine.from_dict(json.loads(text))
    except engine.CellGraphError:
        cell = None
    ss[_CELL] = (text, cell)
    return cell


def set_current_design(d: dict, source: str) -> bool:
    """Make `d` the current design: a new undo snapshot (the redo tail is dropped) and an autosave.

    source says where it came from ("canvas", "gallery", "preset", "upload", ...). Returns False
    (and records nothing) when `d` equals the current design.
    """
    ss = _session()
    text = json.dumps(d)
    if _canonical(text) == _canonical(ss[_DESIGN]):
        return False
    history = ss[_HISTORY][: ss[_CURSOR] + 1] + [text]
    history = history[-HISTORY_LIMIT:]
    ss[_HISTORY] = history
    ss[_CURSOR] = len(history) - 1
    _become(text, source)
    return True


def _become(text: str, source: str) -> None:
    ss = st.session_state
    ss[_DESIGN] = text
    ss[_SOURCE] = source
    _autosave(text)


def can_undo() -> bool:
    return _session()[_CURSOR] > 0


def can_redo() -> bool:
    ss = _session()
    return ss[_CURSOR] < len(ss[_HISTORY]) - 1


def undo() -> bool:
    ss = _session()
    if not can_undo():
        return False
    ss[_CURSOR] -= 1
    _become(ss[_HISTORY][ss[_CURSOR]], "undo")
    return True


def redo() -> bool:
    ss = _session()
    if not can_redo():
        return False
    ss[_CURSOR] += 1
    _become(ss[_HISTORY][ss[_CURSOR]], "redo")
    return True


def design_source() -> str:
    return _session()[_SOURCE]


def notice() -> str | None:
    """A problem with the autosave (unreadable at start, or a failed write), for the page to show."""
    return _session().get(_NOTICE)


def design_sizes() -> dict[str, int]:
    """The sizes the pages compile and run the design at (session values, defaults DEFAULT_SIZES)."""
    return {**DEFAULT_SIZES, **st.session_state.get(_SIZES, {})}


def set_design_sizes(**sizes: int) -> None:
    unknown = set(sizes) - set(DEFAULT_SIZES)
    if unknown:
        raise KeyError(f"unknown size(s) {sorted(unknown)}; known: {sorted(DEFAULT_SIZES)}")
    st.session_state[_SIZES] = {**st.session_state.get(_SIZES, {}), **sizes}
