"""Helpers shared by CLI commands: resolve 'a preset name or a cell JSON file' to a CellGraph, and check each flag
where it enters: numbers against their range (argparse types), input files before reading them, output files and
folders before any work (engine/files.py), arrays the command allocates against the machine's memory."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import BackendError, CellGraphError, FileError
from ..files import check_destination
from ..gallery import closest_names, get, presets
from ..ir import CellGraph
from ..serialize import load

# Upper bounds of the size flags: far above any cell the engine runs in practice, low enough that a typo
# (-H 1048576, -T 10**12) is refused at the flag instead of failing to allocate terabytes.
MAX_SIZE = 16384            # -I, -H, -P
MAX_LAYERS = 128            # -L
MAX_STEPS = 1_000_000       # -T
MAX_BATCH = 65536           # -B
MAX_SEED = 2**32 - 1        # what every seeded generator of the engine (NumPy, torch) accepts


def int_flag(low: int, high: int | None = None):
    """An argparse type: a whole number from `low` to `high`; argparse names the flag in its error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{value} is too large (at most {high:,})")
        return value
    return parse


def float_flag(low: float, high: float | None = None, *, low_inclusive: bool = True):
    """An argparse type: a finite number from `low` (inclusive unless low_inclusive=False) to `high`."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if value < low or (value == low and not low_inclusive):
            raise argparse.ArgumentTypeError(f"must be {'at least' if low_inclusive else 'more than'} {low:g}, "
                                             f"got {value:g}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{value:g} is too large (at most {high:g})")
        return value
    return parse


size_flag = int_flag(1, MAX_SIZE)
layers_flag = int_flag(1, MAX_LAYERS)
steps_flag = int_flag(1, MAX_STEPS)
batch_flag = int_flag(1, MAX_BATCH)
seed_flag = int_flag(0, MAX_SEED)


def add_seed_arg(parser, what: str) -> None:
    parser.add_argument("--seed", type=seed_flag, default=0, help=f"seed of {what}, 0 to {MAX_SEED} (default 0)")


def resolve_cell(spec: str) -> CellGraph:
    """A preset name (lstm, gru, ...) or a path to a cell-graph JSON file."""
    if spec in presets():
        return get(spec).cell
    path = Path(spec)
    if path.suffix == ".json" or path.exists():
        return load(check_input_file(path, "cell", "cell graph", "give a preset name (see `python -m engine "
                                     "presets`) or a cell JSON file", text=True))
    raise CellGraphError(f"'{spec}' is neither a preset nor a JSON file", field="cell",
                         hint=closest_names(spec, presets()) + "presets: " + ", ".join(presets()))


def check_input_file(path: str | Path, flag: str, what: str, hint: str, *, text: bool = False) -> Path:
    """Refuse, naming the flag, an input path that is missing, a folder or unreadable (with text=True: not UTF-8
    text), before anything reads it."""
    path = Path(path)
    if not path.exists():
        raise FileError(f"{flag}: the {what} file {str(path)!r} does not exist; hint: {hint}")
    if path.is_dir():
        raise FileError(f"{flag}: {str(path)!r} is a folder, not a file ({what}); hint: {hint}")
    if not os.access(path, os.R_OK):
        raise FileError(f"{flag}: the {what} file {str(path)!r} is not readable; hint: check its permissions")
    if text:
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise FileError(f"{flag}: the {what} file {str(path)!r} is not UTF-8 text (byte {e.start}); "
                            f"hint: {hint}") from None
        except OSError as e:
            raise FileError(f"{flag}: cannot read the {what} file {str(path)!r}: {e.strerror or e}; "
                            f"hint: {hint}") from None
    return path


def check_output_folder(folder: str | Path, flag: str, what: str) -> Path:
    """Refuse, naming the flag, a folder destination that is a file or cannot be created or written."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise FileError(f"{flag}: {str(folder)!r} is a file, not a folder for the {what}; hint: give a folder")
    check_destination(folder / "file", what, flag=flag)       # the folder (or its nearest ancestor) takes files
    return folder


def physical_memory() -> int | None:
    """Bytes of memory of this machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_array_fits(name: str, shape: tuple[int, ...], flags: str, itemsize: int = 8) -> None:
    """Refuse, before allocating it, an array of `shape` larger than half of this machine's memory."""
    elements = 1
    for n in shape:
        elements *= n
    needed, memory = elements * itemsize, physical_memory()
    if memory is not None and needed > memory // 2:
        raise BackendError(f"{name} of shape {shape} would take {gib(needed)}, more than half of this machine's "
                        f"{gib(memory)} of memory; hint: smaller {flags}")


def gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def add_size_args(parser, *, steps: bool = False, batch: bool = False) -> None:
    parser.add_argument("--input-size", "-I", type=size_flag, default=64, help="input size I (default 64)")
    parser.add_argument("--hidden-size", "-H", type=size_flag, default=128,
                        help=f"hidden size H (default 128; at most {MAX_SIZE})")
    parser.add_argument("--layers", "-L", type=layers_flag, default=1, help="number of stacked layers (default 1)")
    parser.add_argument("--proj-size", "-P", type=size_flag, default=None,
                        help="projection size P, for cells with projected states (default: H)")
    if steps:
        parser.add_argument("--steps", "-T", type=steps_flag, default=20, help="time steps T (default 20)")
    if batch:
        parser.add_argument("--batch", "-B", type=batch_flag, default=4, help="batch size B (default 4)")


def print_columns(header, rows) -> None:
    """Columns as wide as their widest entry, the first left-aligned, the rest right-aligned."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(text).ljust(w) if i == 0 else str(text).rjust(w)
                        for i, (text, w) in enumerate(zip(row, widths))))

