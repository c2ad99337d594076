"""The preset gallery: every known cell variant with its metadata.

Presets live in the top-level `presets/` package, one DSL file each, each defining `PRESET`.
A preset also says how its weights map onto PyTorch's nn.LSTM / nn.GRU / nn.RNN layout (when
PyTorch has the cell), as data: the gate order is written here once, never assumed elsewhere.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import pkgutil
from dataclasses import dataclass, field
from functools import lru_cache

import presets as preset_package

from .errors import CellGraphError
from .ir import CellGraph
from .latex import to_latex


@dataclass(frozen=True)
class TorchLayout:
    """How this cell's parameters pack into torch.nn.{LSTM,GRU,RNN}'s weight_ih_l{k} etc.

    Each tuple lists our parameter names in PyTorch's row-block order (LSTM: i, f, g, o; GRU: r, z, n).
    """

    module: str                         # "LSTM", "GRU" or "RNN"
    weight_ih: tuple[str, ...]
    weight_hh: tuple[str, ...]
    bias_ih: tuple[str, ...]
    bias_hh: tuple[str, ...]
    nonlinearity: str | None = None     # nn.RNN's "tanh" or "relu"
    state_map: tuple[tuple[str, str], ...] = (("h", "h"),)   # torch state -> our state


@dataclass(frozen=True)
class Preset:
    cell: CellGraph
    family: str
    title: str
    citation: str
    cudnn: str | None = None            # cuDNN mode that computes the same function, if any
    torch: TorchLayout | None = None
    test_sizes: dict = field(default_factory=lambda: {"input_size": 5, "hidden_size": 7, "batch": 3, "steps": 6})
    notes: str = ""
    doc: str = ""                       # the equations in plain text and the paper (the module docstring)

    @property
    def name(self) -> str:
        return self.cell.name

    @property
    def latex(self) -> str:
        return to_latex(self.cell)

    @property
    def equations_doc(self) -> str:
        return self.doc or self.cell.doc


@lru_cache(maxsize=1)
def _load_all() -> dict[str, Preset]:
    found: dict[str, Preset] = {}
    for info in sorted(pkgutil.iter_modules(preset_package.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"presets.{info.name}")
        preset = getattr(module, "PRESET", None)
        if isinstance(preset, Preset):
            if preset.name in found:
                raise CellGraphError(f"presets/{info.name}.py defines cell '{preset.name}', which another "
                                     "preset already uses", field="preset",
                                     hint="name the cell after its file: presets/<name>.py defines @cell def <name>")
            if not preset.doc and module.__doc__:
                preset = dataclasses.replace(preset, doc=inspect.cleandoc(module.__doc__))
            found[preset.name] = preset
    return found


def presets() -> dict[str, Preset]:
    """All presets by name, in name order."""
    return dict(_load_all())


def closest_names(name: str, known) -> str:
    """'did you mean 'lstm'? ' for a near miss (difflib), else ''."""
    close = difflib.get_close_matches(str(name).lower(), list(known), n=3, cutoff=0.6)
    return f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""


def get(name: str) -> Preset:
    table = _load_all()
    if not isinstance(name, str):
        raise CellGraphError(f"a preset is named by a string, got {type(name).__name__}", field="preset",
                             hint="e.g. engine.preset('lstm'); known presets: " + ", ".join(table))
    if name not in table:
        raise CellGraphError(f"unknown preset '{name}'", field="preset",
                             hint=closest_names(name, table) + "known presets: " + ", ".join(table))
    return table[name]
