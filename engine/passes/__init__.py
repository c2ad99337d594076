"""The passes: pure rewrites from a cell graph to a Program (engine.plan), listed in `pass_list()`.

Every pass takes a Lowering and returns a new one with a one-line summary; none mutates its input.
Each can be switched off (explain() and the tests compare plans with and without a pass); a pass
that is off runs its `off` function instead, the plainest correct choice (e.g. one GEMM per matmul),
or nothing at all. The optimizations are those of Appleyard, Kocisky & Blunsom, "Optimizing
Performance of Recurrent Neural Networks on GPUs" (2016), applied to any cell graph.

engine.compiler runs them: it checks the options, keys and caches the Program, and renders its CUDA.

    program = compile_cell(cell)                              # every pass on (engine.compiler)
    program = compile_cell(cell, {"fuse_elementwise": False})  # one kernel per op

May import: engine.ir, engine.ops, engine.plan, engine.errors. Never: engine.codegen, engine.compiler, or
anything above them (backends, api).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import CompileError
from ..ir import CellGraph
from ..plan import PassRecord, Program
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


def pass_list() -> tuple[Pass, ...]:
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


PASS_NAMES = tuple(p.name for p in pass_list())


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


def run_passes(cell: CellGraph, on: dict[str, bool], layout: str, precision: str, key: str) -> Program:
    """Run every pass of pass_list() on one cell (or its `off` function where on[name] is False) and lower the
    result to a Program keyed `key`. The options are checked by the caller (engine.compiler.compile_cell)."""
    low = Lowering(cell=cell, source_cell=cell, layout=layout, precision=precision)
    records = []
    for p in pass_list():
        step = p.run if on[p.name] else p.off
        if step is None:
            summary = "off"
        else:
            low, summary = step(low)
            if not on[p.name]:
                summary = f"off: {summary}"
        records.append(PassRecord(p.name, on[p.name], p.why, summary, describe(low)))
    return lower(low, tuple(records), key)


__all__ = ["Pass", "pass_list", "PASS_NAMES", "enabled_passes", "run_passes", "Lowering", "describe"]
