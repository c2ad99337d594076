"""The study layer's one exception type."""
from __future__ import annotations

from ..errors import EngineError


class StudyError(EngineError):
    """A study cannot be set up or carried on: an empty search space, a folder of another study, a Ray cluster that
    does not answer. (A trial that fails is not an error of the study: it is recorded as failed.)"""

    def __init__(self, message: str, *, hint: str | None = None):
        self.hint = hint
        super().__init__(message + (f"; hint: {hint}" if hint else ""))
