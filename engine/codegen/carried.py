"""Values the persistent kernel carries in registers from one stage of a step to a later one.

A multi-stage cell's kernels pass values between the stages of a step through global memory: the LayerNorm LSTM's
stage 2 stores c_next and four per-row temporaries of its gates (spills), and stage 3 loads them back, an L2 round
trip at the head of stage 3's cell math (1.0 us a step at blogB on an H200, against the LSTM's 0.74 for all of
its cell math; benchmarks/NOTES.md, 2026-11-27 19:40). On the persistent kernel a block keeps its units for the
whole run, and where every thread owns at most one (row, unit) element (B x UNITS <= THREADS) it is the same element
in every stage: the thread that stored the value is the one that loads it. So the value can stay in a register of
that thread across the grid barrier between the stages (`carry[i]`, an array of the kernel's loop that the stage
functions take by pointer and that the inlining leaves in registers).

Where: the persistent kernel outside cluster mode (a launch per stage, the graph schedule, keeps global memory), for
a buffer that one kernel stores and only later stages' kernels load, every access the element (row b, unit j) of a
single-version batch buffer, no store held past a sequence's end (lengths=). A spill nothing else reads is then no
longer stored at all; a buffer a GEMM or a reduction reads is still stored (c_next: the reduction's partials)."""
from __future__ import annotations

from functools import partial

from ..plan import Lin, Program
from .cuda import index_expr


def carried(program: Program, tiling) -> dict[str, int]:
    """{buffer name: its index in carry[]} of the buffers the persistent kernel carries in registers."""
    if not (tiling.persistent and not tiling.cluster and tiling.batch * tiling.units_per_block
            <= (tiling.config.threads or 0)):
        return {}
    found = {}
    for buffer in program.buffers:
        if buffer.double or buffer.rows != "batch" or buffer.role in ("state", "input", "output"):
            continue
        if any(g.out_buffer == buffer.name for g in program.gemms):
            continue
        stores = [(k, st) for k in program.kernels for st in k.stores if _source(k, st.access) == buffer.name]
        loads = [(k, ld) for k in program.kernels for ld in k.loads
                 if ld.access is not None and _source(k, ld.access) == buffer.name]
        if len(stores) != 1 or not loads:
            continue
        writer, store = stores[0]
        if store.past_end is not None or not _own_element(store.access):
            continue
        if all(k.stage > writer.stage and k.dim == writer.dim and _own_element(ld.access) for k, ld in loads):
            found[buffer.name] = len(found)
    return found


def _source(kernel, access) -> str:
    return next(p for p in kernel.params if p.name == access.param).source


def _own_element(access) -> bool:
    """Element (row b, unit j) of a batch buffer: no column offset, stride 1."""
    return access.rows == "batch" and access.offset == Lin() and access.stride == 1


def places(kernel, program: Program, carry: dict[str, int], kept: dict) -> dict:
    """kernel_body's places for the kernel's params whose buffers are carried, composed with `kept` (the places
    already chosen for the kernel, shared memory's): a load reads carry[i]; a store writes carry[i], and whatever
    `kept` or the global array would have received where another reader (a GEMM, a reduction) needs it."""
    out = {}
    for p in kernel.params:
        if p.source not in carry:
            continue
        index = carry[p.source]
        if not p.writes:
            out[p.name] = partial(_load, index)
            continue
        readers = [g for g in program.gemms if g.in_buffer == p.source]
        out[p.name] = partial(_store, index, kept.get(p.name), p.name, bool(readers))
    return out


def _load(index: int, access) -> list[str]:
    return [f"carry[{index}]"]


def _store(index: int, kept, param: str, stored: bool, access) -> list[str]:
    targets = [f"carry[{index}]"]
    if kept is not None:
        targets += kept(access)
    elif stored:
        targets.append(f"{param}[{index_expr(access)}]")
    return targets
