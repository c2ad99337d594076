"""The wavefront schedules by name: what backend="graph" / "persistent" and the autotuner's choices build."""
from __future__ import annotations

from ..errors import BackendError
from .graph import GraphSchedule
from .persistent import PersistentSchedule

SCHEDULES = ("graph", "persistent")


def schedule_class(name: str):
    if name == "graph":
        return GraphSchedule
    if name == "persistent":
        return PersistentSchedule
    raise BackendError(f"unknown schedule '{name}'; choose one of: {', '.join(SCHEDULES)}")
