"""lengths= on the generated kernels (issue #35): a Program whose stores hold the rows past their sequence's end.

A batch padded at the end runs sequence b for its own lengths[b] steps (engine/backends/lengths.py). The fast
schedules run every row of every step (a row is one thread's work, the GEMMs take every row, and every thread takes
every barrier), so this pass makes a padded step change nothing. At step t >= lengths[b] each store of row b writes,
instead of the value it computed:
- into a double buffer's next version (a state's home, or anything else carried to the next step): the element's
  current version, so the state stays as it was and its final value is the sequence's own last one;
- into the layer output: 0;
and any other store (a value a later stage of the same step reads) as computed: the held stores ignore it.
Store.past_end names what is stored there, a Load of the current version (the one the kernel reads already where it
has it) or a literal 0. The generated code selects (`within ? value : held`, engine/codegen/cuda.py kernel_body), a
select and not a branch, so every thread still takes part in every barrier of the schedules.

Without lengths the pass does not run: the Program, its key and its CUDA are what they were.
"""
from __future__ import annotations

from dataclasses import replace

from ..c_names import c_identifier
from ..errors import CompileError
from ..plan import Kernel, KernelParam, Load, Program


def hold_past_end(program: Program, key: str) -> Program:
    """The Program whose kernels hold the rows past their end (the module's docstring), keyed `key`. CompileError
    where a state does not live in a double buffer a kernel writes (the pass would not see its update)."""
    doubles = {b.name for b in program.buffers if b.double}
    for home in program.homes:
        if home.slot.buffer not in doubles:
            raise CompileError(f"cell '{program.cell.name}': state {home.state!r} lives in buffer "
                               f"{home.slot.buffer!r}, not a double buffer, so lengths= cannot hold it past a "
                               "sequence's end; hint: run it with backend='reference', or without lengths")
    for gemm in program.gemms:
        if gemm.out_buffer in doubles:
            raise CompileError(f"cell '{program.cell.name}': GEMM {gemm.name} writes the double buffer "
                               f"{gemm.out_buffer!r}, which lengths= cannot hold past a sequence's end; hint: run "
                               "it with backend='reference', or without lengths")
    kernels = tuple(_held(kernel, program) for kernel in program.kernels)
    return replace(program, kernels=kernels, lengths=True, key=key)


def _held(kernel: Kernel, program: Program) -> Kernel:
    params = list(kernel.params)
    loads = list(kernel.loads)
    taken = {p.name for p in params} | {ld.var for ld in loads} | {st.var for st in kernel.statements}

    def fresh(name: str) -> str:
        name = c_identifier(name, taken)
        taken.add(name)
        return name

    zero = None
    stores = []
    for store in kernel.stores:
        param = next(p for p in params if p.name == store.access.param)
        if param.kind != "buffer":
            stores.append(store)
            continue
        if param.source == program.output_buffer:
            if zero is None:
                zero = fresh("zero")
                loads.append(Load(zero, zero, literal=0.0))
            stores.append(replace(store, past_end=zero))
            continue
        if not program.buffer(param.source).double:
            stores.append(store)
            continue
        if param.version != "next":
            raise CompileError(f"cell '{program.cell.name}': kernel {kernel.name} writes the current version of "
                               f"double buffer {param.source!r}, which lengths= cannot hold; hint: this is a bug in "
                               "engine/passes/lengths.py, run it with backend='reference' meanwhile")
        current = next((p for p in params if p.kind == "buffer" and p.source == param.source and p.version == "cur"),
                       None)
        if current is None:
            current = KernelParam(fresh(f"{param.source}_cur"), param.source, "buffer", "cur",
                                  doc=f"{param.source} (cur): held past a sequence's end")
            params.append(current)
        access = replace(store.access, param=current.name)
        held = next((ld.var for ld in loads if ld.access == access), None)
        if held is None:
            state = next((h.state for h in program.homes if h.slot.buffer == param.source
                          and (h.slot.offset, h.slot.stride) == (store.access.offset, store.access.stride)), None)
            held = fresh(f"{state or param.source}_held")
            loads.append(Load(held, held, access))
        stores.append(replace(store, past_end=held))
    return replace(kernel, params=tuple(params), loads=tuple(loads), stores=tuple(stores))

