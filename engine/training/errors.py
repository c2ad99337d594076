"""The training layer's one exception type."""
from __future__ import annotations

from ..errors import EngineError


class TrainingError(EngineError):
    """A training request cannot be carried out: an unknown task, bad settings, or a loss that diverged.

    `step` is the optimisation step where training stopped (None when it never started)."""

    def __init__(self, message: str, *, hint: str | None = None, step: int | None = None):
        self.hint, self.step = hint, step
        super().__init__(message + (f"; hint: {hint}" if hint else ""))
