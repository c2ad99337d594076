"""What a pipelined run measured on its GPUs."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PipelineMeasurement:
    """A pipelined run timed on its GPUs: the wall time of a whole forward (median), each GPU's busy time (the sum
    over its chunks of the time from its input being ready to its work being done, CUDA events) and the bubble,
    1 - sum(busy) / (N * wall). one_gpu_ms: the net run in one piece on one GPU, where measured."""

    ms: float
    busy_ms: list[float]
    repeats: int
    one_gpu_ms: float | None = None

    @property
    def bubble(self) -> float:
        return 1.0 - sum(self.busy_ms) / (len(self.busy_ms) * self.ms)

    def as_dict(self) -> dict:
        return {"ms": self.ms, "busy_ms": self.busy_ms, "bubble": self.bubble, "repeats": self.repeats,
                "one_gpu_ms": self.one_gpu_ms}

    def describe(self) -> str:
        busy = ", ".join(f"GPU {g} {ms:.2f}" for g, ms in enumerate(self.busy_ms))
        one = "" if self.one_gpu_ms is None else (f", {self.one_gpu_ms / self.ms:.2f}x the one-GPU run's "
                                                  f"{self.one_gpu_ms:.2f} ms")
        return (f"{self.ms:.2f} ms (median of {self.repeats}{one}), bubble {100 * self.bubble:.0f}% "
                f"(busy ms: {busy})")
