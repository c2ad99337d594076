"""Timing and memory probes: CUDA events for CuPy and for torch, a wall clock for CPU tests.

Each repetition is timed on its own: start event, the call, a device synchronize, end event. The
synchronize makes the end event wait for work on any stream the implementation used (a backend
may launch on streams of its own), at the cost of a few microseconds per repetition, the same for
every implementation. Inputs rotate among several buffers so that no repetition reads an input
still in cache from the previous one.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    reps: int
    warmup: int

    def to_dict(self) -> dict:
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "max_ms": self.max_ms, "reps": self.reps,
                "warmup": self.warmup}


def summarize(samples_ms: list[float], warmup: int) -> Timing:
    return Timing(statistics.median(samples_ms), min(samples_ms), max(samples_ms), len(samples_ms), warmup)


def time_runs(forward: Callable[[int], object], timer: Callable[[Callable[[], object]], float], *,
              buffers: int, warmup: int, reps: int) -> Timing:
    """forward(k) runs on input buffer k. timer(fn) returns fn's time in ms."""
    for k in range(warmup):
        timer(lambda k=k: forward(k % buffers))
    samples = [timer(lambda k=k: forward(k % buffers)) for k in range(reps)]
    return summarize(samples, warmup)


# ---- timers ------------------------------------------------------------------------------------

def cupy_timer(fn: Callable[[], object]) -> float:
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    fn()
    cupy.cuda.Device().synchronize()
    end.record()
    end.synchronize()
    return float(cupy.cuda.get_elapsed_time(start, end))


def torch_timer(fn: Callable[[], object]) -> float:
    import torch  # deferred: torch is optional (the cuDNN and torch baselines)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    torch.cuda.synchronize()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def wall_timer(fn: Callable[[], object]) -> float:
    """For CPU tests of the harness: host wall time."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


TIMERS = {"cupy": cupy_timer, "torch": torch_timer, "wall": wall_timer}


# ---- peak memory ---------------------------------------------------------------------------------

class CupyMemory:
    """Peak bytes taken from CuPy's memory pool while an implementation sets up and runs once.

    The pool keeps freed blocks cached, so its total after the run is the high-water mark of the
    run (an upper bound: a cached block of one size may not serve a request of another)."""

    def reset(self) -> None:
        import cupy  # deferred: CuPy is optional (no GPU in CI)
        pool = cupy.get_default_memory_pool()
        pool.free_all_blocks()
        self.base = pool.total_bytes()

    def peak(self) -> int:
        import cupy  # deferred: CuPy is optional (no GPU in CI)
        return int(cupy.get_default_memory_pool().total_bytes() - self.base)


class TorchMemory:
    """Peak bytes from torch's caching allocator (max_memory_allocated), over what was allocated before."""

    def reset(self) -> None:
        import torch  # deferred: torch is optional (the cuDNN and torch baselines)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        self.base = torch.cuda.memory_allocated()

    def peak(self) -> int:
        import torch  # deferred: torch is optional (the cuDNN and torch baselines)
        return int(torch.cuda.max_memory_allocated() - self.base)


class NoMemory:
    """For CPU tests: no device memory to measure."""

    def reset(self) -> None:
        pass

    def peak(self) -> int | None:
        return None


MEMORY = {"cupy": CupyMemory, "torch": TorchMemory, "wall": NoMemory}
