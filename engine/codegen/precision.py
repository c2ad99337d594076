"""Number formats of generated code: how values are stored in memory and computed in registers.

Only float32 exists today. fp16/bf16 storage (float arithmetic in registers) will add entries
here: the kernels already spell every load and store through `load`/`store`, and every type
through `storage`/`compute`, so no renderer has to change.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import CompileError


@dataclass(frozen=True)
class Precision:
    name: str
    storage: str              # C type of buffers
    compute: str              # C type of registers
    literal_suffix: str       # "1.0f"
    numpy_dtype: str

    def load(self, expr: str) -> str:
        return expr if self.storage == self.compute else f"({self.compute})({expr})"

    def store(self, expr: str) -> str:
        return expr if self.storage == self.compute else f"({self.storage})({expr})"

    def describe(self) -> str:
        if self.storage == self.compute:
            return f"{self.name} ({self.storage} storage and arithmetic)"
        return f"{self.name} ({self.storage} storage, {self.compute} arithmetic)"


PRECISIONS = {"float32": Precision("float32", "float", "float", "f", "float32")}


def precision(name: str) -> Precision:
    if name not in PRECISIONS:
        raise CompileError(f"precision '{name}' is not supported yet; hint: use one of {', '.join(PRECISIONS)}")
    return PRECISIONS[name]
