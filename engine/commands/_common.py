"""Helpers shared by CLI commands: resolve 'a preset name or a cell JSON file' to a CellGraph."""
from __future__ import annotations

from pathlib import Path

from ..errors import CellGraphError
from ..gallery import closest_names, get, presets
from ..ir import CellGraph
from ..serialize import load


def resolve_cell(spec: str) -> CellGraph:
    """A preset name (lstm, gru, ...) or a path to a cell-graph JSON file."""
    if spec in presets():
        return get(spec).cell
    path = Path(spec)
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise CellGraphError(f"file '{spec}' does not exist", field="cell",
                                 hint="give a preset name (see `python -m engine presets`) or a cell JSON file")
        return load(path)
    raise CellGraphError(f"'{spec}' is neither a preset nor a JSON file", field="cell",
                         hint=closest_names(spec, presets()) + "presets: " + ", ".join(presets()))


def add_size_args(parser, *, steps: bool = False, batch: bool = False) -> None:
    parser.add_argument("--input-size", "-I", type=int, default=64, help="input size I (default 64)")
    parser.add_argument("--hidden-size", "-H", type=int, default=128, help="hidden size H (default 128)")
    parser.add_argument("--layers", "-L", type=int, default=1, help="number of stacked layers (default 1)")
    parser.add_argument("--proj-size", "-P", type=int, default=None,
                        help="projection size P, for cells with projected states (default: H)")
    if steps:
        parser.add_argument("--steps", "-T", type=int, default=20, help="time steps T (default 20)")
    if batch:
        parser.add_argument("--batch", "-B", type=int, default=4, help="batch size B (default 4)")
