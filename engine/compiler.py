"""The compile step: run the passes on a cell, render the Program's CUDA, and bind it to a run shape.

It sits above both halves of the compiler so that neither knows the other: engine.passes turns a cell
graph into a Program (plain data, engine.plan) and engine.codegen turns a Program into CUDA source.

    program = compile_cell(cell)                                 # the passes only: no CUDA source yet
    program = compile_program(cell, {"fuse_elementwise": False})  # the passes, then the CUDA source
    plan = make_plan(network, steps=T, batch=B)                  # compiled and bound to T and B
    plan = make_plan(network, T, B, lengths=True)                # kernels that hold rows past their end (lengths=)

Programs are cached by their key: the cell's structural hash and name, the passes switched on, the weight
layout, the precision and engine.codegen.GENERATOR_VERSION (the rendered source is cached by codegen).

May import: engine.ir, engine.network, engine.plan, engine.passes, engine.codegen. Never: backends, schedules,
api or anything else above them.
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache

from . import codegen
from .codegen.precision import precision as lookup_precision
from .dense import dense_form
from .errors import BackendError, CompileError
from .ir import CellGraph
from .network import Network
from .passes import enabled_passes, run_passes
from .passes.lengths import hold_past_end
from .plan import LAYOUTS, Plan, Program, bind


def compile_cell(cell: CellGraph, passes=None, *, layout: str = "blocked", precision: str = "float32",
                 lengths: bool = False) -> Program:
    """Run the passes on one cell. Cached: equal structure and options give the same Program. lengths=True: its
    kernels take the sequences' lengths and hold the rows past their end (engine/passes/lengths.py)."""
    if not isinstance(cell, CellGraph):
        raise CompileError(f"compile needs a CellGraph, got {type(cell).__name__}")
    if layout not in LAYOUTS:
        raise CompileError(f"unknown weight layout '{layout}'; hint: use one of {', '.join(LAYOUTS)}")
    precision = lookup_precision(precision).name     # raises CompileError naming the supported ones
    chosen = enabled_passes(passes)
    cell = dense_form(cell).cell         # heads weights as block-diagonal ones, sum_h/mean_h as matmuls (engine.dense)
    return _compile(cell, tuple(sorted(chosen.items())), layout, precision, bool(lengths))


def program_key(cell: CellGraph, chosen: tuple, layout: str, precision: str, lengths: bool = False) -> str:
    parts = [cell.structural_hash, cell.name, chosen, layout, precision, codegen.GENERATOR_VERSION]
    body = json.dumps(parts + (["lengths"] if lengths else []))        # the key without lengths as it always was
    return hashlib.sha256(body.encode()).hexdigest()[:16]


@lru_cache(maxsize=128)
def _compile(cell: CellGraph, chosen: tuple, layout: str, precision: str, lengths: bool = False) -> Program:
    program = run_passes(cell, dict(chosen), layout, precision, program_key(cell, chosen, layout, precision))
    if lengths:          # the last step: the kernels' stores past a sequence's end
        program = hold_past_end(program, program_key(cell, chosen, layout, precision, lengths=True))
    return program


def compile_program(cell: CellGraph, passes=None, *, layout: str = "blocked", precision: str = "float32",
                    doc: str = "", lengths: bool = False) -> Program:
    """Run the passes and render the CUDA source (both cached by the program key)."""
    program = compile_cell(cell, passes, layout=layout, precision=precision, lengths=lengths)
    return codegen.with_source(program, doc=doc)


def make_plan(network: Network, steps: int, batch: int, passes=None, *, layout: str = "blocked",
              chunk_steps: int | None = None, precision: str = "float32", doc: str = "",
              lengths: bool = False) -> Plan:
    """Compile the network's cell and bind it to T=steps, B=batch (lengths=True: kernels that take the sequences'
    lengths, engine/passes/lengths.py)."""
    for name, value in (("steps", steps), ("batch", batch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BackendError(f"{name} must be a positive integer, got {value!r}")
    program = compile_program(network.cell, passes, layout=layout, precision=precision, doc=doc, lengths=lengths)
    return bind(program, network, steps, batch, chunk_steps)


__all__ = ["compile_cell", "compile_program", "make_plan", "program_key"]
