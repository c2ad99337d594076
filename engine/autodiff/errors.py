"""The autodiff layer's exception: a valid cell graph that cannot be differentiated."""
from __future__ import annotations

from ..errors import EngineError, Problem


class AutodiffError(EngineError):
    """A cell graph cannot be differentiated (an op without a gradient rule, a rule that names an unknown op).
    Carries the node and a hint, as a Problem does."""

    def __init__(self, message: str, *, node: str | None = None, field: str | None = None,
                 hint: str | None = None):
        self.node, self.field, self.hint = node, field, hint
        super().__init__(str(Problem(message, node=node, field=field, hint=hint)))
