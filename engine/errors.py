"""One exception type per layer, each carrying where the problem is and what to do next."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a cell graph: where (node and/or field), what, and a hint."""

    message: str
    node: str | None = None
    field: str | None = None
    hint: str | None = None

    def __str__(self) -> str:
        where = []
        if self.node is not None:
            where.append(f"node '{self.node}'")
        if self.field is not None:
            where.append(f"field '{self.field}'")
        text = (", ".join(where) + ": " if where else "") + self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class CellGraphError(EngineError):
    """The cell graph (from the DSL or JSON) is malformed. `problems` lists every finding."""

    def __init__(self, problems: list[Problem] | Problem | str, *, node: str | None = None,
                 field: str | None = None, hint: str | None = None):
        if isinstance(problems, str):
            problems = [Problem(problems, node=node, field=field, hint=hint)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems = list(problems)
        first = self.problems[0]
        self.node, self.field, self.hint = first.node, first.field, first.hint
        text = str(first)
        if len(self.problems) > 1:
            text += "".join(f"\n- {p}" for p in self.problems[1:])
        super().__init__(text)


class CompileError(EngineError):
    """A valid cell cannot be compiled for the requested target."""


class BackendError(EngineError):
    """A backend cannot run the request (wrong shapes, device, dtype, memory)."""


class FileError(EngineError):
    """A file or folder the engine was asked to read or write cannot serve (missing, a folder, not writable)."""
