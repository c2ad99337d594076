"""Reading and writing files: check a destination before the work, write atomically, leave no temporary; read
text and JSON with every failure as the reader's own error.

Every writer of the engine (designs, parameters, results, exports) goes through `write_text` / `write_bytes` /
`write_with`: the data goes to a temporary file beside the destination, then `os.replace` puts it in place, so a
reader never sees half a file and a crash leaves the old file whole. A failed write removes its temporary.
`check_destination` runs the same checks up front, so that a long job (training, a benchmark) refuses a bad
destination before it starts rather than after it has finished.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import zipfile
import zlib
from pathlib import Path
from typing import IO, Any, Callable

from .arguments import shown
from .errors import EngineError, FileError

MakeError = Callable[[str, str], EngineError]     # (message, hint) -> the loader's own error
# What reading a damaged or foreign .npz archive raises through np.load and zipfile: besides OSError, ValueError and
# EOFError, a bad central directory (BadZipFile), a corrupt deflate stream (zlib.error), a member whose compression
# method is unknown (NotImplementedError) or whose flags say it is encrypted (RuntimeError).
DAMAGED_ARCHIVE = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError)


def _where(what: str, flag: str | None) -> str:
    return f"{flag} ({what})" if flag else what


def _existing_ancestor(path: Path) -> Path:
    parent = path.parent if str(path.parent) else Path(".")
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


def check_destination(path: str | Path, what: str, *, flag: str | None = None, overwrite: bool = True,
                      example: str | None = None) -> Path:
    """Refuse, before any work, a destination that cannot take a file: a folder, a parent that is a file or not
    writable, or (overwrite=False) a file that exists. Missing parent folders are fine (writers create them).
    `what` names the file ("training results"), `flag` the option that gave the path ("--json"), `example` a file
    name to suggest inside a folder. Returns the path."""
    where = _where(what, flag)
    path = as_path(path, where)
    if path.name != path.name.strip():      # legal, but a quoting slip: "out.npz " would be written as it is
        raise FileError(f"{where}: the file name {path.name!r} begins or ends with white space; hint: remove it, "
                        f"e.g. {str(path.with_name(path.name.strip() or 'out'))!r}")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in path.name):     # a line break or tab inside: the same slip
        raise FileError(f"{where}: the file name {path.name!r} holds a control character (a line break, a tab); "
                        "hint: choose a name of printable characters")
    try:
        return _check_destination(path, where, overwrite, example, flag)
    except OSError as e:              # a name too long, a folder that cannot be looked into
        raise FileError(f"{where}: cannot use {str(path)[:200]!r}: {e.strerror or e}; hint: choose a shorter path in "
                        "a folder you can write to") from None


def _check_destination(path: Path, where: str, overwrite: bool, example: str | None, flag: str | None) -> Path:
    if path.is_dir():
        inside = f"; hint: give a file name, e.g. {path / example}" if example else "; hint: give a file name"
        raise FileError(f"{where}: {str(path)!r} is a folder, not a file{inside}")
    parent = _existing_ancestor(path)
    if not parent.is_dir():
        raise FileError(f"{where}: {str(parent)!r} is a file, so {str(path)!r} cannot be created inside it; "
                        "hint: choose a path whose folders are folders")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise FileError(f"{where}: the folder {str(parent)!r} is not writable; hint: choose a folder you can "
                        "write to")
    if path.exists():
        if not overwrite:
            raise FileError(f"{where}: {str(path)!r} exists and is not overwritten; hint: choose another name, "
                            "or pass --force to replace it" if flag else
                            f"{where}: {str(path)!r} exists and is not overwritten; hint: choose another name, "
                            "or pass overwrite=True")
        if not os.access(path, os.W_OK):
            raise FileError(f"{where}: {str(path)!r} is not writable; hint: choose another name")
    return path


def write_with(path: str | Path, write: Callable[[IO[bytes]], None], what: str, *, flag: str | None = None,
               overwrite: bool = True) -> Path:
    """Atomically write `path` with `write(binary_file)`. Parent folders are created. Returns the path."""
    path = check_destination(path, what, flag=flag, overwrite=overwrite)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FileError(f"{_where(what, flag)}: cannot create the folder {str(path.parent)!r}: {e.strerror}; "
                        "hint: choose a folder you can write to") from None
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except OSError as e:
        raise FileError(f"{_where(what, flag)}: cannot write {str(path)!r}: {e.strerror or e}; hint: check the "
                        "free space and the permissions of the folder") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def write_bytes(path: str | Path, data: bytes, what: str, *, flag: str | None = None, overwrite: bool = True) -> Path:
    return write_with(path, lambda f: f.write(data), what, flag=flag, overwrite=overwrite)


def write_text(path: str | Path, text: str, what: str, *, flag: str | None = None, overwrite: bool = True) -> Path:
    return write_bytes(path, text.encode("utf-8"), what, flag=flag, overwrite=overwrite)


def cache_root() -> Path:
    """The engine's cache folder: $CELLFORGE_CACHE_DIR, else ~/.cache/cellforge (compiled kernels, the autotuner's
    choices, JSB Chorales)."""
    root = os.environ.get("CELLFORGE_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "cellforge"


# ---- reading -----------------------------------------------------------------------------------------------

def error_of(kind: Callable[[str], EngineError]) -> MakeError:
    """The MakeError of an error type whose one-line message carries the hint ("...; hint: ...")."""
    def make(message: str, hint: str) -> EngineError:
        return kind(f"{message}; hint: {hint}")
    return make


file_error = error_of(FileError)


def as_path(path, what: str, *, error: MakeError = file_error) -> Path:
    """`path` as a Path; a value that is not a path (None, a number, a list) is refused naming `what`."""
    if isinstance(path, (str, os.PathLike)) and str(path):
        if "\x00" in str(path):           # no file system takes one; os calls raise ValueError on it
            raise error(f"{what}: the path {str(path)!r} holds a NUL character", "remove it from the path")
        return Path(path)
    raise error(f"{what}: the path must be a str or a pathlib.Path, got {type(path).__name__} {shown(path)}",
                "pass the file's path, e.g. 'designs/my_cell.json'")


def read_bytes(path, what: str, *, error: MakeError = file_error, hint: str = "check the path") -> bytes:
    """The bytes of a file; a missing file, a folder or an unreadable file is `error(message, hint)`."""
    path = as_path(path, what, error=error)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise error(f"{what} {str(path)!r} does not exist", hint) from None
    except IsADirectoryError:
        raise error(f"{what} {str(path)!r} is a folder, not a file", hint) from None
    except OSError as e:
        raise error(f"cannot read {what} {str(path)!r}: {e.strerror or e}", hint) from None


def decode_text(data: bytes, what: str, *, error: MakeError = file_error, hint: str = "check the file") -> str:
    """UTF-8 text of `data`; other bytes are `error` naming the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})", hint) from None


def read_text(path, what: str, *, error: MakeError = file_error, hint: str = "check the path") -> str:
    """The UTF-8 text of a file; anything else is `error(message, hint)` naming the file."""
    path = as_path(path, what, error=error)
    return decode_text(read_bytes(path, what, error=error, hint=hint), f"{what} {str(path)!r}", error=error,
                       hint=hint)


def parse_json(text, what: str, *, error: MakeError = file_error, hint: str = "check the file") -> Any:
    """The value of a JSON text (str or UTF-8 bytes). Malformed JSON, nesting deeper than the parser can follow and
    integers longer than Python converts (sys.get_int_max_str_digits) are `error(message, hint)`, never a
    RecursionError or ValueError."""
    if isinstance(text, (bytes, bytearray)):
        text = decode_text(bytes(text), what, error=error, hint=hint)
    if not isinstance(text, str):
        raise error(f"{what}: JSON text must be a str, got {type(text).__name__}", hint)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{what} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}", hint) from None
    except RecursionError:
        raise error(f"{what} is nested too deeply to read (arrays or objects inside each other beyond Python's "
                    "recursion limit)", hint) from None
    except ValueError:                # the int conversion limit: a number of thousands of digits
        raise error(f"{what} holds a number of more than {sys.get_int_max_str_digits()} digits, more than Python "
                    "reads", hint) from None


def load_json(path, what: str, *, error: MakeError = file_error, hint: str = "check the path") -> Any:
    """read_text, then parse_json: the value of a JSON file, or `error` naming the file and what is wrong."""
    path = as_path(path, what, error=error)
    return parse_json(read_text(path, what, error=error, hint=hint), f"{what} {str(path)!r}", error=error,
                      hint=hint)
