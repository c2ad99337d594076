"""The step GEMMs' outputs kept in shared memory on the persistent kernel's fp32 tiled path.

A stage's GEMMs write Y (B rows x the block's terms x units columns) and the cell code, on the same block, reads it
back; through global memory that is a store and an L2 round trip a value (the LSTM's cell math at `blogB` is 1.1 us of
a 12.4 us step on an H200, most of it those loads). The persistent kernel keeps every block on its units for the
whole run, so Y can stay in a region of shared memory past the staging area, where the GEMM's epilogue writes it
and every later stage of the step reads it (the LayerNorm LSTM reads W_o x and R_o h in stage 3). The next step's
GEMMs overwrite it only after the grid barrier that ends the step.

Where it applies: the persistent kernel on the fp32 register-tile path (not the tensor-core MMAs, the warp GEMV or
cluster mode, which keeps its own tiles), when the region fits beside the resident weights and the staging area
(at `blogB` 12 KiB beside 204.8; at `mid` it would need 32 KiB more than the 213 in use, so `mid` keeps global Y).
"""
from __future__ import annotations

from dataclasses import replace

FLOAT_BYTES = 4


def shared_outputs(program, tiling):
    """The tiling with `y_shared` ((GEMM name, float offset, row stride), ...) and its shared memory grown by the
    region, or the tiling as it is where the outputs stay in global memory."""
    if not (tiling.persistent and tiling.path == "tiled" and not tiling.mma and not tiling.cluster and tiling.gemms
            and tiling.config.sync in ("grid", "layer")):
        return tiling
    reductions = program.reductions
    tiles = [t for t in tiling.gemms if t.name not in reductions]
    start = -(-tiling.smem_bytes // 16) * 16 // FLOAT_BYTES     # 16-byte aligned
    placed, offset = [], start
    for t in tiles:
        ld = t.terms * tiling.units_per_block
        placed.append((t.name, offset, ld))
        offset += tiling.batch * ld
    if not placed or offset * FLOAT_BYTES > tiling.limits.smem_per_block:
        return tiling
    kept = replace(tiling, smem_bytes=offset * FLOAT_BYTES, y_shared=tuple(placed))
    return kept if readable(program, kept) else tiling


def _kept(program, tiling) -> dict:
    """{output buffer: (GEMM, float offset, row stride)} of the outputs kept in shared memory."""
    return {g.out_buffer: (g, offset, ld) for g in program.gemms for name, offset, ld in tiling.y_shared
            if g.name == name}


def untouched(program, tiling) -> set:
    """The GEMM output buffers the kernel never reads or writes in global memory (its Y is in shared memory): a run
    allocates one element for each (an input projection's would be T x B x its columns a layer)."""
    return set(_kept(program, tiling))


def staging_floats(tiling) -> int:
    """Floats of shared memory before the outputs' region (all of it where there is none)."""
    return min((offset for _, offset, _ in tiling.y_shared), default=tiling.smem_bytes // FLOAT_BYTES)


def places(kernel, program, tiling) -> dict:
    """kernel_body's places for the kernel's loads of an output kept in shared memory: element (row b, term offset c,
    unit j) of GEMM output Y at b * ld + c + terms * (j - u0) of its region (shared_outputs keeps an output there only
    where every load of it has that form: readable)."""
    kept = _kept(program, tiling)
    return {p.name: _reader(kept[p.source][1], kept[p.source][2], len(kept[p.source][0].terms))
            for p in kernel.params if not p.writes and p.source in kept}


def _reader(offset: int, ld: int, terms: int):
    def expression(access) -> list[str]:
        return [f"(smem + {offset})[(int)b * {ld} + {access.offset.c} + {terms} * (j - u0)]"]
    return expression


def readable(program, tiling) -> bool:
    """Whether every load of every kept output reads an element of the form places() writes: a row of the step
    (batch rows, or the step's row of a sequence), a term at a fixed offset, the block's own unit."""
    kept = _kept(program, tiling)
    for k in program.kernels:
        sources = {p.name: p.source for p in k.params}
        for ld in k.loads:
            a = ld.access
            if a is not None and sources.get(a.param) in kept and not (
                    a.rows in ("batch", "sequence") and a.fixed_term(len(kept[sources[a.param]][0].terms))):
                return False
    return True
