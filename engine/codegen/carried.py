"""Values the persistent kernel carries in registers from one stage of a step to a later one, or to the next step.

A multi-stage cell's kernels pass values between the stages of a step through global memory: the LayerNorm LSTM's
stage 2 stores c_next and four per-row temporaries of its gates (spills), and stage 3 loads them back, an L2 round
trip at the head of stage 3's cell math (1.0 us a step at blogB on an H200, against the LSTM's 0.74 for all of
its cell math; benchmarks/NOTES.md, 2026-11-27 19:40). On the persistent kernel a block keeps its units for the
whole run, and where every thread owns at most one (row, unit) element (B x UNITS <= THREADS) it is the same element
in every stage: the thread that stored the value is the one that loads it. So the value can stay in a register of
that thread across the grid barrier between the stages (`carry[i]`, an array of the kernel's loop that the stage
functions take by pointer and that the inlining leaves in registers).

The same holds across steps for a state (a two-version batch buffer: version "cur" holds step t - 1's value, "next"
step t's): the thread that stores its element of step t is the one that loads it at step t + 1. So a state's load
reads carry[i] from the second step on (`t == 0 ? the global element : carry[i]`: step 0 reads the initial state), and
its store writes carry[i] as well as the global element, which the final states, the GEMMs reading h and a later
launch still need. The LSTM's c then makes no L2 round trip a step.

Where: the persistent kernel outside cluster mode (a launch per stage, the graph schedule, keeps global memory), where
B x UNITS <= THREADS, for
- a buffer that one kernel stores and only later stages' kernels load, every access the element (row b, unit j) of a
  single-version batch buffer, no store held past a sequence's end (lengths=). A spill nothing else reads is then no
  longer stored at all; one a GEMM or a reduction reads from L2 is still stored;
- a state whose "next" version one kernel stores and whose "cur" version only kernels of that stage or earlier load,
  each at the thread's own element. A store held past a sequence's end (lengths=) writes the held value to carry[i]
  as to the global element."""
from __future__ import annotations

from functools import partial

from ..plan import Lin, Program
from .cuda import index_expr


def carried(program: Program, tiling) -> dict[str, int]:
    """{buffer name: its index in carry[]} of the buffers the persistent kernel carries in registers (states among
    them: program.buffer(name).double)."""
    if not (tiling.persistent and not tiling.cluster and tiling.batch * tiling.units_per_block
            <= (tiling.config.threads or 0)):
        return {}
    found = {}
    for buffer in program.buffers:
        if buffer.double and buffer.rows == "batch" and _across_steps(program, buffer.name):
            found[buffer.name] = len(found)
            continue
        if buffer.double or buffer.rows != "batch" or buffer.role in ("state", "input", "output"):
            continue
        if any(g.out_buffer == buffer.name for g in program.gemms):
            continue
        stores, loads = _accesses(program, buffer.name)
        if len(stores) != 1 or not loads:
            continue
        writer, store = stores[0]
        if store.past_end is not None or not _own_element(store.access):
            continue
        if all(k.stage > writer.stage and k.dim == writer.dim and _own_element(ld.access) for k, ld in loads):
            found[buffer.name] = len(found)
    return found


def _across_steps(program: Program, name: str) -> bool:
    """Whether a two-version buffer's element passes from step t's store to step t + 1's loads in one thread: one
    kernel stores version "next", and only kernels of its stage or earlier load version "cur", all at the own
    element (a kernel loads before it stores)."""
    stores, loads = _accesses(program, name)
    if len(stores) != 1 or not loads:
        return False
    writer, store = stores[0]
    return (_version(writer, store.access) == "next" and _own_element(store.access)
            and all(k.stage <= writer.stage and k.dim == writer.dim and _version(k, ld.access) == "cur"
                    and _own_element(ld.access) for k, ld in loads))


def _accesses(program: Program, name: str) -> tuple[list, list]:
    """(kernel, store) of every store into buffer `name`, and (kernel, load) of every load from it."""
    stores = [(k, st) for k in program.kernels for st in k.stores if _source(k, st.access) == name]
    loads = [(k, ld) for k in program.kernels for ld in k.loads
             if ld.access is not None and _source(k, ld.access) == name]
    return stores, loads


def _version(kernel, access) -> str | None:
    return next(p for p in kernel.params if p.name == access.param).version


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
        state = program.buffer(p.source).double       # carried across steps: stored for the final states too
        if not p.writes:
            out[p.name] = partial(_load, index, p.name if state else None)
            continue
        readers = [g for g in program.gemms if g.in_buffer == p.source]
        out[p.name] = partial(_store, index, kept.get(p.name), p.name, state or bool(readers))
    return out


def _load(index: int, param: str | None, access) -> list[str]:
    """carry[index]; a state's first step reads its initial value from `param`."""
    if param is None:
        return [f"carry[{index}]"]
    return [f"(t == 0 ? {param}[{index_expr(access)}] : carry[{index}])"]


def _store(index: int, kept, param: str, stored: bool, access) -> list[str]:
    targets = [f"carry[{index}]"]
    if kept is not None:
        targets += kept(access)
    elif stored:
        targets.append(f"{param}[{index_expr(access)}]")
    return targets
