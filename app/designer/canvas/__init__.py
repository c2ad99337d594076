"""The Designer's canvas: a Streamlit component on React Flow (@xyflow/react), built from ./frontend into ./static.

    value = cell_canvas(schema, revision=3, marks={"node-7": "port 'x' is not connected"}, key="designer.canvas")

Why not barfi (the editor of the first designer): its blocks are large (a name field on every block), so the 48
nodes of the LSTM fit the view only at a tenth of their size, and every message from Python meant drawing the
editor afresh. Here blocks are compact (their fields show while selected), the canvas has zoom, fit view and a
minimap, every edit goes to Python at once (no Execute button), and Python's verdict comes back as marks drawn in
place. The graph travels in barfi's editor-schema form, so app/designer/adapter.py reads and writes it unchanged.

Protocol: `schema` is drawn when `revision` is new (a preset, undo, a redraw); otherwise the canvas keeps its own
state and only updates the marks. The value is {"revision", "edit", "schema"}: `edit` counts the edits made on
that revision, so the caller applies each once. Rebuild the frontend with `npm ci && npm run build` in ./frontend
(Node 20); the built files are committed, so running the app needs no Node.
"""
from __future__ import annotations

from pathlib import Path

import streamlit.components.v1 as components

from ..palette import CATEGORIES, SPECS

STATIC = Path(__file__).resolve().parent / "static"
_component = components.declare_component("cell_canvas", path=str(STATIC))


def palette_args() -> list[dict]:
    """The palette as the frontend takes it: categories of block specs (ports, fields, description)."""
    out = []
    for category in CATEGORIES:
        blocks = [{"type": s.type, "inputs": list(s.inputs), "outputs": list(s.outputs), "description": s.description,
                   "options": [{"name": o.name, "kind": o.kind, "default": o.default, "items": list(o.items)}
                               for o in s.options]}
                  for s in SPECS.values() if s.category == category]
        out.append({"name": category, "blocks": blocks})
    return out


def cell_canvas(schema: dict, *, revision: int, marks: dict[str, str] | None = None, height: int = 640,
                key: str | None = None) -> dict | None:
    """Draw the canvas; its last edit ({"revision", "edit", "schema"}), or None before the first."""
    return _component(schema=schema, revision=revision, palette=palette_args(), marks=marks or {}, height=height,
                      key=key, default=None)
