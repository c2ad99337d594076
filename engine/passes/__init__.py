"""The compiler: pure passes from a cell graph to a Program (engine.plan), listed in `pipeline()`.

Every pass takes a Lowering and returns a new one with a one-line summary; none mutates its input.
Each can be switched off (explain() and the tests compare plans with and without a pass); a pass
that is off runs its `off` function instead, the plainest correct choice (e.g. one GEMM per matmul),
or nothing at all. The optimizations are those of Appleyard, Kocisky & Blunsom, "Optimizing
Performance of Recurrent Neural Networks on GPUs" (2016), applied to any cell graph.

    program = compile_cell(cell)                              # every pass on
    program = compile_cell(cell, {"fuse_elementwise": False})  # one kernel per op
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from ..codegen.precision import precision as lookup_precision
from ..errors import CompileError
from ..ir import CellGraph
from ..plan import LAYOUTS, PassRecord, Program
from .constants import fold_constants
from .fold import fold_biases
from .fusion import fuse_elementwise, one_kernel_per_op
from .gemms import group_gemms, one_gemm_per_matmul
from .hoist import hoist_inputs
from .lower import lower
from .lowering import Lowering, describe
from .prune import prune_dead
from .schedule import layer_by_layer, schedule_wavefront
from .sums import flatten_sums

@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[Lowering], tuple[Lowering, str]]
    off: Callable[[Lowering], tuple[Lowering, str]] | None = None   # what runs instead when switched off

    @property
    def why(self) -> str:
        return (self.run.__doc__ or "").strip().splitlines()[0]


def pipeline() -> tuple[Pass, ...]:
    """The passes, in order. Each line says why the pass is there (its docstring says it in full)."""
    return (
        Pass("prune_dead", prune_dead),                                  # dead values cost launches, change nothing
        Pass("fold_constants", fold_constants),                          # numbers-only ops: once, not per thread
        Pass("flatten_sums", flatten_sums),                              # GEMMs absorb only what they see summed
        Pass("hoist_inputs", hoist_inputs),                              # W x_t for all t in one big GEMM
        Pass("group_gemms", group_gemms, off=one_gemm_per_matmul),       # fewer, larger GEMMs per step
        Pass("fold_biases", fold_biases),                                # biases ride along in the hoisted GEMM
        Pass("fuse_elementwise", fuse_elementwise, off=one_kernel_per_op),  # one kernel per GEMM stage
        Pass("wavefront", schedule_wavefront, off=layer_by_layer),       # layers overlap along diagonals
    )


PASS_NAMES = tuple(p.name for p in pipeline())


def enabled_passes(passes=None) -> dict[str, bool]:
    """Normalize a selection: None (all on), {name: bool} (others on), or a collection of the names to run."""
    if passes is None:
        chosen = {name: True for name in PASS_NAMES}
    elif isinstance(passes, dict):
        chosen = {name: True for name in PASS_NAMES}
        chosen.update(passes)
    elif isinstance(passes, str):
        raise CompileError(f"passes={passes!r}: give a list of pass names or a {{name: bool}} dict; "
                           "hint: e.g. {'fuse_elementwise': False}")
    else:
        names = list(passes)
        chosen = {name: name in names for name in PASS_NAMES}
        chosen.update({name: True for name in names})
    unknown = [name for name in chosen if name not in PASS_NAMES]
    if unknown:
        raise CompileError(f"unknown pass(es) {', '.join(map(repr, unknown))}; hint: the passes are "
                           + ", ".join(PASS_NAMES))
    for name, value in chosen.items():
        if not isinstance(value, bool):
            raise CompileError(f"pass '{name}': on/off must be True or False, got {value!r}")
    return chosen


def compile_cell(cell: CellGraph, passes=None, *, layout: str = "blocked", precision: str = "float32") -> Program:
    """Run the pipeline on one cell. Cached: equal structure and options give the same Program."""
    if not isinstance(cell, CellGraph):
        raise CompileError(f"compile needs a CellGraph, got {type(cell).__name__}")
    if layout not in LAYOUTS:
        raise CompileError(f"unknown weight layout '{layout}'; hint: use one of {', '.join(LAYOUTS)}")
    precision = lookup_precision(precision).name     # raises CompileError naming the supported ones
    chosen = enabled_passes(passes)
    return _compile(cell, tuple(sorted(chosen.items())), layout, precision)


def program_key(cell: CellGraph, chosen: tuple, layout: str, precision: str) -> str:
    from ..codegen import GENERATOR_VERSION
    body = json.dumps([cell.structural_hash, cell.name, chosen, layout, precision, GENERATOR_VERSION])
    return hashlib.sha256(body.encode()).hexdigest()[:16]


@lru_cache(maxsize=128)
def _compile(cell: CellGraph, chosen: tuple, layout: str, precision: str) -> Program:
    on = dict(chosen)
    low = Lowering(cell=cell, source_cell=cell, layout=layout, precision=precision)
    records = []
    for p in pipeline():
        step = p.run if on[p.name] else p.off
        if step is None:
            summary = "off"
        else:
            low, summary = step(low)
            if not on[p.name]:
                summary = f"off: {summary}"
        records.append(PassRecord(p.name, on[p.name], p.why, summary, describe(low)))
    return lower(low, tuple(records), program_key(cell, chosen, layout, precision))


__all__ = ["Pass", "pipeline", "PASS_NAMES", "enabled_passes", "compile_cell", "Lowering", "describe"]
