"""A text progress bar for the CLI (the app passes its own callback to run_bench instead)."""
from __future__ import annotations

import sys
import time


class TextProgress:
    """progress(done, total, label) -> one line '[#####.....] 12/40  31s eta 72s  lstm/mid naive'.

    On a terminal the line is redrawn in place; in a log (not a tty) each update is its own line."""

    def __init__(self, stream=None, width: int = 24):
        self.stream = stream or sys.stderr
        self.width = width
        self.start = time.monotonic()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.last_length = 0

    def __call__(self, done: int, total: int, label: str) -> None:
        fraction = min(done / total, 1.0) if total else 1.0
        filled = int(round(self.width * fraction))
        elapsed = time.monotonic() - self.start
        eta = f"eta {elapsed / done * (total - done):4.0f}s" if 0 < done < total else " " * 8
        line = f"[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} {elapsed:5.0f}s {eta}  {label}"
        if self.tty:
            self.stream.write("\r" + line.ljust(self.last_length))
            self.last_length = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
