"""The programs engine.run(backend="auto") prepares, kept for its next calls.

Preparing a schedule (packing and uploading the weights, building its buffers and kernels) costs more than a run at
small sizes: LSTM at blogB on an H200, engine.run took 17.1 ms a call against 1.42 ms for the prepared program's run
(benchmarks/results/lengths-20261127-H200/), so a loop over engine.run paid the preparation every time, and never
reached the prepared program's replay from CUDA graphs (a program's second run at a shape).

A kept program is reused only
- for the same choice: the autotuner's key (cell, sizes, T, B, precision, device, lengths or not), schedule and
  tiling;
- with parameters equal to those it was prepared with, compared in full on every call, so an array changed in place
  is never missed (the copy kept for the comparison lives where the parameters do, NumPy or CuPy);
- by one caller at a time: a program is taken out while it runs and put back after, so two threads never share a
  program's buffers (the other prepares its own).
At most KEEP programs are kept, the least recently used going first, and none whose parameters exceed KEEP_BYTES
(their runs dwarf the preparation); `forget()` drops them all, and with them their GPU memory.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

KEEP = 2
KEEP_BYTES = 512 << 20


@dataclass
class Kept:
    program: object
    params: list            # [{name: array}] per layer: a copy of the parameters the program was prepared with


def parameter_copy(params) -> list | None:
    """A copy of every layer's arrays, or None where they are too large to keep (KEEP_BYTES) or not arrays."""
    arrays = [value for layer in params.layers for value in layer.values()]
    if not all(hasattr(v, "copy") and hasattr(v, "nbytes") for v in arrays) \
            or sum(int(v.nbytes) for v in arrays) > KEEP_BYTES:
        return None
    return [{name: value.copy() for name, value in layer.items()} for layer in params.layers]


def same_parameters(kept: list, params) -> bool:
    """True where params holds the same layers, names, shapes, dtypes and values as the kept copy."""
    if len(kept) != len(params.layers):
        return False
    for old, new in zip(kept, params.layers):
        if old.keys() != new.keys():
            return False
        for name, value in new.items():
            before = old[name]
            if type(before) is not type(value) or before.shape != getattr(value, "shape", None) \
                    or before.dtype != value.dtype:
                return False
            if not bool((before == value).all()):
                return False
    return True


class KeptPrograms:
    """The kept programs (the module's docstring), by key."""

    def __init__(self, keep: int = KEEP):
        self.keep = keep
        self.entries: OrderedDict[tuple, Kept] = OrderedDict()
        self.lock = threading.Lock()

    def take(self, key: tuple, params) -> Kept | None:
        """The kept program for this key and these parameters, taken out (put it back with `put`), or None."""
        with self.lock:
            entry = self.entries.pop(key, None)
        if entry is None:
            return None
        if not same_parameters(entry.params, params):
            return None                         # other parameters: the program goes, a new one is prepared
        return entry

    def put(self, key: tuple, entry: Kept | None) -> None:
        if entry is None or entry.params is None:
            return
        with self.lock:
            self.entries[key] = entry
            self.entries.move_to_end(key)
            while len(self.entries) > self.keep:
                self.entries.popitem(last=False)

    def forget(self) -> None:
        with self.lock:
            self.entries.clear()

    def __len__(self) -> int:
        return len(self.entries)


PROGRAMS = KeptPrograms()


def forget() -> None:
    """Drop every program engine.run kept (and the GPU memory they hold)."""
    PROGRAMS.forget()
