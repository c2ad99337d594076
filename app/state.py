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
designs folder (the tests point it at a temporary one). A fresh visit (no id in the URL) starts a new
session; last_design() finds the design last autosaved, for the Designer to offer.

The state lives in one dict (see _store): a change is made with no st.session_state access in between, so
a rerun that Streamlit starts at such an access never cuts it in half. Snapshots are kept as JSON text: immutable, cheap to compare, and exactly what is saved.
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
from engine.errors import FileError
from engine.files import write_text

ROOT = Path(__file__).resolve().parents[1]
SESSION_PARAM = "design"              # the URL query parameter naming a session's working design
SESSIONS = "sessions"                 # designs/sessions/<id>.json: each browser session's working design
TOKEN_PATTERN = re.compile(r"[0-9a-f]{32}")
HISTORY_LIMIT = 200
DEFAULT_SIZES = {"input_size": 64, "hidden_size": 256, "num_layers": 2, "steps": 50, "batch": 16,
                 "proj_size": 128}      # P: used by cells with projected states only

_STORE = "state.store"                # the session's design state: one dict, changed in place (see _store)
_TOKEN = "state.token"                # this browser session's working-design id
_SIZES = "state.sizes"
# Keys of the store: the design (JSON text), its undo history (texts, oldest first) and where in it we are, where
# the design came from, the validation of the current text ((text, CellGraph | None)), and what the start-up or
# the last autosave has to tell the user.
DESIGN, HISTORY, CURSOR, SOURCE, CELL, NOTICE = "design", "history", "cursor", "source", "cell", "notice"


def designs_dir() -> Path:
    return Path(os.environ.get("RNN_DESIGNS_DIR") or ROOT / "designs")


def _canonical(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True)


def _store() -> dict:
    """The session's design state, a plain dict.

    Every read or write of st.session_state is a point where Streamlit may stop the script for a rerun that the
    browser asked for meanwhile (a canvas edit, a click). A change made of several session_state writes could
    be cut in half there (a new design without its history entry, an edit marked as taken but never applied).
    So the state lives in one dict, fetched once, and every change to it is made with no session_state access
    in between: a rerun lands before the change or after it, never inside.
    """
    ss = st.session_state
    if _TOKEN in ss and st.query_params.get(SESSION_PARAM) != ss[_TOKEN]:
        st.query_params[SESSION_PARAM] = ss[_TOKEN]      # a page switch may drop it: a reload must find the design
    store = ss.get(_STORE)
    if store is None:
        text, source, notice = _first_design()
        store = {DESIGN: text, HISTORY: [text], CURSOR: 0, SOURCE: source, NOTICE: notice, CELL: None}
        ss[_STORE] = store
    return store


def session_token() -> str:
    """This browser session's working-design id: the URL's `design` parameter when it is one this app made, else a
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
                ss["state.link_notice"] = (f"the link's design id {given!r} is not one this app makes (32 hex digits); "
                               "started a new design from the LSTM preset")
    return ss[_TOKEN]


def working_path() -> Path:
    """Where this browser session's working design is autosaved."""
    return designs_dir() / SESSIONS / f"{session_token()}.json"


def _first_design() -> tuple[str, str, str | None]:
    """(JSON text, source, notice): the session's working design when it is readable, else the LSTM preset.
    An unreadable file is moved aside, not overwritten, and the notice names where it went."""
    path = working_path()
    notice = st.session_state.get("state.link_notice")
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


def _autosave(store: dict, path: Path) -> None:
    # engine.files writes through a temporary file named by process and thread: two sessions of one server may
    # write the same working design at once (a reload while the old session's run still finishes).
    try:
        write_text(path, store[DESIGN], "the working design")
        store[NOTICE] = None
    except FileError as e:
        store[NOTICE] = f"autosave failed: {e}"


def current_design() -> dict:
    """A fresh copy of the current design (edit it freely; call set_current_design to keep changes)."""
    return json.loads(_store()[DESIGN])


def current_cell() -> engine.CellGraph | None:
    """The current design as a validated CellGraph, or None while it has problems."""
    store = _store()
    text = store[DESIGN]
    cached = store.get(CELL)
    if cached is not None and cached[0] == text:
        return cached[1]
    try:
        cell = engine.from_dict(json.loads(text))
    except engine.CellGraphError:
        cell = None
    store[CELL] = (text, cell)
    return cell


class Transaction:
    """A change to the design made without touching st.session_state (see _store): take one with transaction()
    before the change, while a rerun may still stop the script, then call its methods."""

    def __init__(self, store: dict, path: Path):
        self.store, self.path = store, path

    def set_design(self, d: dict, source: str) -> bool:
        """Make `d` the current design: a new undo snapshot (the redo tail is dropped) and an autosave.
        Returns False (and records nothing) when `d` equals the current design."""
        store = self.store
        text = json.dumps(d)
        if _canonical(text) == _canonical(store[DESIGN]):
            return False
        history = (store[HISTORY][: store[CURSOR] + 1] + [text])[-HISTORY_LIMIT:]
        store.update({HISTORY: history, CURSOR: len(history) - 1})
        self._become(text, source)
        return True

    def undo(self) -> bool:
        if self.store[CURSOR] <= 0:
            return False
        self.store[CURSOR] -= 1
        self._become(self.store[HISTORY][self.store[CURSOR]], "undo")
        return True

    def redo(self) -> bool:
        if self.store[CURSOR] >= len(self.store[HISTORY]) - 1:
            return False
        self.store[CURSOR] += 1
        self._become(self.store[HISTORY][self.store[CURSOR]], "redo")
        return True

    def _become(self, text: str, source: str) -> None:
        self.store.update({DESIGN: text, SOURCE: source})
        _autosave(self.store, self.path)


def transaction() -> Transaction:
    return Transaction(_store(), working_path())


def set_current_design(d: dict, source: str) -> bool:
    """Make `d` the current design (Transaction.set_design). source says where it came from ("canvas", "gallery",
    "preset", "upload", ...)."""
    return transaction().set_design(d, source)


def can_undo() -> bool:
    return _store()[CURSOR] > 0


def can_redo() -> bool:
    store = _store()
    return store[CURSOR] < len(store[HISTORY]) - 1


def undo() -> bool:
    return transaction().undo()


def redo() -> bool:
    return transaction().redo()


def untouched() -> bool:
    """True while the session still shows the design it started from the preset: nothing edited or loaded."""
    store = _store()
    return store[SOURCE] == "preset" and len(store[HISTORY]) == 1


def design_source() -> str:
    return _store()[SOURCE]


def notice() -> str | None:
    """A problem with the autosave (unreadable at start, or a failed write), for the page to show."""
    return _store().get(NOTICE)


def last_design(exclude: Path | None = None) -> tuple[Path, dict, float] | None:
    """The most recently autosaved working design of the designs folder other than `exclude` (this browser session's),
    as (path, design, its modification time), or None. A fresh visit (no ?design= in the address) starts a new session: the Designer
    offers this one to reopen."""
    folder = designs_dir() / SESSIONS
    found = []
    for path in folder.glob("*.json") if folder.is_dir() else []:
        try:
            found.append((path.stat().st_mtime, path))
        except OSError:                  # deleted meanwhile
            continue
    for mtime, path in sorted(found, reverse=True):
        if exclude is not None and path == exclude:
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("nodes"), list):
            return path, data, mtime
    return None


def design_sizes() -> dict[str, int]:
    """The sizes the pages compile and run the design at (session values, defaults DEFAULT_SIZES)."""
    return {**DEFAULT_SIZES, **st.session_state.get(_SIZES, {})}


def set_design_sizes(**sizes: int) -> None:
    unknown = set(sizes) - set(DEFAULT_SIZES)
    if unknown:
        raise KeyError(f"unknown size(s) {sorted(unknown)}; known: {sorted(DEFAULT_SIZES)}")
    st.session_state[_SIZES] = {**st.session_state.get(_SIZES, {}), **sizes}
