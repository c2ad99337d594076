"""Writing files without losing work: check a destination before the work, write atomically, leave no temporary.

Every writer of the engine (designs, parameters, results, exports) goes through `write_text` / `write_bytes` /
`write_with`: the data goes to a temporary file beside the destination, then `os.replace` puts it in place, so a
reader never sees half a file and a crash leaves the old file whole. A failed write removes its temporary.
`check_destination` runs the same checks up front, so that a long job (training, a benchmark) refuses a bad
destination before it starts rather than after it has finished.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import IO, Callable

from .errors import FileError


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
    path = Path(path)
    where = _where(what, flag)
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
