"""CUDA for the reductions over the hidden units on the wavefront schedules (engine/codegen/wavefront.py).

A block owns a slice of a layer's hidden units, and a reduction (sum_h, mean_h, a LayerNorm's variance) needs the
whole row: it crosses the blocks. In the Program it is a GEMM of reductions only (Program.reductions: matmuls by the
fixed matrices of engine/dense.py), which the wavefront schedules never multiply:
- at the end of the stage that stores its operands (partial_stage), each block sums its own units per batch row and
  term and writes that partial to slot k * BLOCKS_PER_LAYER + blk of the partials buffer (term k, block blk), the
  rows innermost (element slot * B + b), so that a warp's threads, a batch row each, read one 128-byte line per
  load; a variance writes its block's sum and its sum of squares about the block's own mean, the second at slot
  (terms + k) * BLOCKS_PER_LAYER + blk;
- after the grid-wide barrier that ends the stage, every block adds the BLOCKS_PER_LAYER partials of each row and
  term (a variance combines its blocks' sums and squares pairwise: Chan, Golub & LeVeque, "Updating formulae and a
  pairwise algorithm for computing sample variances", 1979) and writes the row's value to each of its units. A
  sum or mean of the same values as a variance (a LayerNorm's mean: twins()) has no partials of its own; the
  variance's thread adds its blocks' sums and writes both.
Per step and layer that is 2 x B x blocks floats and the barrier the stage has anyway, where the dense form's GEMM
was 2 B H^2 FLOPs. Where the operands are not all stored by the step's own earlier stages (a reduction of a state),
every block sums whole rows instead. Each thread owns a (row, term) and adds in a fixed order: reruns are
bit-identical. Within a block nothing else goes through L2 on the tiled path (StageShared): the cell code writes the
operands of its own units into the GEMMs' staging area, where the partials read them, and the row values go there
once a row for the cell code to read; a buffer another stage reads is written to global memory as well. At `mid`
that took the LayerNorm LSTM from 70.8 to 51.8 us a wavefront step on an H200 (benchmarks/NOTES.md, 2026-11-27).

Rounding: none in any precision mode. A reduction is a float32 sum, not a matmul; the reference's emulation of a mode
rounds matmul operands only (engine/backends/reference.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from ..errors import CompileError
from ..plan import Gemm, Lin, Program
from .cuda import index_expr

SCALE = {"sum_h": "", "mean_h": " * (1.0f / H)"}


def partial_stage(program: Program, gemm: Gemm, present: tuple[int, ...]) -> int | None:
    """The stage at whose end each block writes its partials of a reduction: the last stage before the reduction's,
    when every operand is stored by this step's kernels by then. None: every block sums whole rows."""
    before = [p for p in present if p < gemm.stage]
    if not before or program.buffer(gemm.in_buffer).double:
        return None
    writers = [k.stage for k, _ in _stores_into(program, gemm.in_buffer)]
    if not writers or max(writers) > before[-1]:
        return None
    return before[-1]


def _source(kernel, access) -> str:
    """The buffer a kernel's load or store reaches (its param's source)."""
    return next(p for p in kernel.params if p.name == access.param).source


def _stores_into(program: Program, buffer: str) -> list:
    """(kernel, access) of every store into `buffer`."""
    return [(k, st.access) for k in program.kernels for st in k.stores if _source(k, st.access) == buffer]


def _terms(program: Program, gemm: Gemm) -> tuple[tuple[tuple[str, str], ...], ...]:
    """The GEMM's reduction terms, each a variance of all its operands or a sum of sum_h / mean_h ones."""
    terms = program.reductions[gemm.name]
    cell = program.cell
    for term, pairs in zip(gemm.terms, terms):
        ops = {op for _, op in pairs}
        if "var_h" in ops:
            weights = {cell[m].args[0] for m in term.matmuls}
            users = {n.name for n in cell.nodes if n.op == "matmul" and n.args[0] in weights}
            if ops != {"var_h"} or len(weights) != 1 or users != set(term.matmuls):
                raise CompileError(f"cell '{cell.name}': GEMM '{gemm.name}' has a variance term that is not one whole "
                                   "variance; hint: this is a bug in engine.dense.variance_form, run the cell with "
                                   "backend='fused' meanwhile")
    return terms


def twins(program: Program, gemm: Gemm) -> dict[int, int]:
    """{index of a sum term: index of the variance term of the same operands}. A LayerNorm's mean term (the mean_h
    of its operands) adds the same values as its variance term, whose partials carry each block's sum: so its
    consumer merges the variance's sums and writes the mean as well, and the mean term has no partials of its own.
    That halves the partials a block loads for a LayerNorm, 43 blocks' worth a row at blogB, every block reading
    every other block's (8.5 MB of L2 reads a step over three layers for the LayerNorm LSTM's stage 2)."""
    terms = _terms(program, gemm)
    found = {}
    for index, pairs in enumerate(terms):
        if len({op for _, op in pairs}) != 1 or pairs[0][1] == "var_h":
            continue
        operands = sorted(o for o, _ in pairs)
        for other, var in enumerate(terms):
            if var[0][1] == "var_h" and sorted(o for o, _ in var) == operands and other not in found.values():
                found[index] = other
                break
    return found


def _produced(program: Program, gemm: Gemm) -> list[tuple[int, tuple]]:
    """(index, pairs) of the terms whose partials the producer writes: all but the twins' sums."""
    skip = twins(program, gemm)
    return [(index, pairs) for index, pairs in enumerate(_terms(program, gemm)) if index not in skip]


def _unit_loop(indent: str, offset: str, body: str) -> list[str]:
    """body over this block's units of the operand at `offset`, `x` the unit's value. No load behind a branch: the
    index is clamped to the block's last unit and the value dropped past it, so the unrolled loads are all in flight
    at once."""
    return [f"{indent}#pragma unroll",
            f"{indent}for (int j = 0; j < UNITS; ++j) {{ const float x = row[{offset} + min(j, tu - 1)]; "
            f"if (j < tu) {{ {body} }} }}"]


STAGING_SKIP = 64          # floats at the start of the staging area left alone (the bulk pipeline's barriers)


def staged_floats(gemm: Gemm, units: int, batch: int) -> int:
    """Shared memory reduction_partials stages the block's operand values in: B rows of _row's floats."""
    return batch * (len(gemm.operands) * units | 1)


def _row(nops: int) -> str:
    """The floats between two batch rows of the staged operand values, as C: the row's nops x UNITS values made odd.
    A warp's threads each read their own row at one column, so an even row length put them on few banks: at blogB
    (4 operands x 6 units) 24 floats a row is 8 threads a bank, an 8-way conflict on every load of the partials;
    an odd length is 32 banks for 32 rows."""
    return f"({nops} * UNITS | 1)"


def _shared(offset: int) -> str:
    """The staging area's float at `offset` past STAGING_SKIP, as C."""
    return f"smem + SCRATCH + {STAGING_SKIP + offset}"


@dataclass(frozen=True)
class StageShared:
    """A stage's reduction values kept in the GEMMs' staging area of shared memory (free from the end of the
    stage's GEMMs to the start of the next stage's), so that they make no round trip through L2:
    - sums: for each reduction the stage consumes, its terms' row values (B floats a term, row b of term k at
      (offset + k) * B + b), written once a row by reduction_sums and read by the cell code, rather than once a
      unit into the GEMM's output buffer and loaded back;
    - vals: for each reduction whose partials the stage writes and whose operands only this stage's cell code
      stores, the block's values (B rows of operands x UNITS, the row made odd: _row), written by the cell code as
      it computes them, rather than stored to the operand buffer and copied back from L2 by reduction_partials.
    A buffer another stage or GEMM reads is still written to global memory too (keep). Offsets are floats past
    STAGING_SKIP; `end` is the first float free after them."""
    sums: dict                    # {GEMM name: (Gemm, offset)}
    vals: dict                    # {GEMM name: (Gemm, offset)}
    keep: frozenset
    end: int

    def places(self, kernel) -> dict:
        """kernel_body's places for the kernel's params that live here."""
        sums = {g.out_buffer: off for g, off in self.sums.values()}
        vals = {g.in_buffer: (g, off) for g, off in self.vals.values()}
        places = {}
        for p in kernel.params:
            if not p.writes and p.source in sums:
                places[p.name] = partial(_row_value, sums[p.source])
            elif p.writes and p.source in vals:
                places[p.name] = partial(_operand_value, *vals[p.source], p.name, p.source in self.keep)
        return places


def _row_value(offset: int, access) -> list[str]:
    """A load of a reduction's output at term access.offset: the row's value in StageShared.sums."""
    return [f"({_shared(offset)})[{access.offset.c} * B + b]"]


def _operand_value(gemm: Gemm, offset: int, param: str, global_copy: bool, access) -> list[str]:
    """A store of a reduction's operand: its unit's place in StageShared.vals, and its global element if kept."""
    index = _operand_index(gemm)[access.offset]
    return ([f"({_shared(offset)})[(int)b * {_row(len(gemm.operands))} + {index} * UNITS + (j - u0)]"]
            + ([f"{param}[{index_expr(access)}]"] if global_copy else []))


def _operand_index(gemm: Gemm) -> dict:
    """{operand's offset in the GEMM's input row: its index}."""
    return {gemm.operand_offset(op.name): i for i, op in enumerate(gemm.operands)}


def _readers(program: Program, buffer: str, but: str, carried=frozenset()) -> set:
    """The stages of the kernels that load `buffer` (but from a register, where it is carried: carried.py) and of the
    GEMMs other than `but` that read it."""
    stages = {k.stage for k in program.kernels for p in k.params
              if p.source == buffer and not p.writes and buffer not in carried}
    return stages | {g.stage for g in program.gemms if g.in_buffer == buffer and g.name != but}


def stage_shared(program: Program, stage: int, consumed: list[Gemm], produced: list[Gemm], units: int, batch: int,
                 free: int, carried=frozenset()) -> StageShared:
    """What of the stage's reductions goes through shared memory (StageShared), in `free` floats past STAGING_SKIP:
    the sums of the reductions it consumes whose loads in this stage all read a row value (a term at a fixed column
    of the unit), and the operands of those it produces partials of, stored by this stage's kernels only, each at an
    operand's place. What does not fit stays in global memory, as before. `carried`: the buffers the persistent
    kernel carries in registers to the later stages that load them (carried.py), whose global copy only another
    GEMM or reduction needs."""
    sums, vals, keep, end = {}, {}, set(), 0
    mine = [k for k in program.kernels if k.stage == stage]
    for g in consumed:
        nt = len(g.terms)
        loads = [ld.access for k in mine for ld in k.loads
                 if ld.access is not None and _source(k, ld.access) == g.out_buffer]
        if all(a.rows == "batch" and a.fixed_term(nt) for a in loads) and end + batch * nt <= free:
            sums[g.name], end = (g, end), end + batch * nt
    for g in produced:
        index = _operand_index(g)
        stores = _stores_into(program, g.in_buffer)
        size = staged_floats(g, units, batch)
        if (all(k.stage == stage and a.rows == "batch" and a.stride == 1 and a.offset in index for k, a in stores)
                and {index[a.offset] for _, a in stores} == set(range(len(g.operands))) and end + size <= free):
            vals[g.name], end = (g, end), end + size
            if _readers(program, g.in_buffer, g.name, carried):
                keep.add(g.in_buffer)
    for g, _ in sums.values():
        if _readers(program, g.out_buffer, "") - {stage}:
            keep.add(g.out_buffer)
    return StageShared(sums, vals, frozenset(keep), end)


def reduction_partials(program: Program, gemm: Gemm, indent: str, staging: bool = False, offset: int = 0,
                       direct: bool = False) -> list[str]:
    """At the end of the producing stage: this block's partials of every term, per batch row. direct: the cell code
    has written the block's operand values to shared memory at `offset` (StageShared.vals; direct_partials takes
    several such GEMMs in one loop). Else staging: first copy the block's units of every operand into the GEMMs'
    staging area at `offset` (free between the stage's GEMMs and the next stage's), consecutive threads reading
    consecutive units, so that the sums read shared memory; without it each thread reads its row's units from L2, a
    request per row and line (4.8 us a stage at `mid` on an H200)."""
    if direct:
        return direct_partials(program, [(gemm, offset)], indent)
    nops = len(gemm.operands)
    if any(gemm.operand_offset(op.name) != Lin(h=i) for i, op in enumerate(gemm.operands)):
        staging = False                      # operands not H apart (a reduction reads H-sized values: never)
    lines = [f"{indent}__syncthreads();   // this block's units of {gemm.name}'s operands are stored",
             f"{indent}{{   // partials of {gemm.name} over this block's units",
             f"{indent}    const int K = {gemm.k.c_expr()};",
             f"{indent}    const int blk = u0 / UNITS;"]
    if staging:
        lines += [f"{indent}    float* vals = {_shared(offset)};   // B rows of {nops} operands x UNITS",
                  f"{indent}    for (int e = threadIdx.x; e < B * {nops} * UNITS; e += blockDim.x) {{",
                  f"{indent}        const int j = e % UNITS, r = e / UNITS, i = r % {nops}, b = r / {nops};",
                  f"{indent}        vals[b * {_row(nops)} + i * UNITS + j] = "
                  f"j < tu ? L.{gemm.in_buffer}[(long)b * K + i * H + u0 + j] : 0.0f;",
                  f"{indent}    }}",
                  f"{indent}    __syncthreads();"]
    row = (f"vals + b * {_row(nops)}" if staging else f"L.{gemm.in_buffer} + (long)b * K + u0")
    lines += [f"{indent}    for (int e = threadIdx.x; e < B * {len(_produced(program, gemm))}; e += blockDim.x) {{",
              f"{indent}        const int k = e / B, b = e - k * B;   // a warp's threads share a term: no divergence"]
    lines += _term_branches(program, gemm, row, staging, 0, indent + "        ")
    return lines + [f"{indent}    }}", f"{indent}}}"]


def direct_partials(program: Program, items: list[tuple[Gemm, int]], indent: str) -> list[str]:
    """The partials of several reductions whose operand values the cell code has written to shared memory (each
    GEMM with its StageShared.vals offset), in one loop over (row, term) of all of them: one block barrier, and
    their terms' sums run side by side rather than each on B x its terms of the block's threads in turn."""
    names = ", ".join(g.name for g, _ in items)
    lines = [f"{indent}__syncthreads();   // this block's units of {names}'s operands are stored",
             f"{indent}{{   // " + "; ".join(f"partials of {g.name}" for g, _ in items) + " over this block's units",
             f"{indent}    const int blk = u0 / UNITS;"]
    lines += [f"{indent}    // {g.name}: B rows of {len(g.operands)} operands x UNITS at {_shared(offset)}, written by "
              "the cell code" for g, offset in items]
    lines += [f"{indent}    for (int e = threadIdx.x; e < B * {sum(len(_produced(program, g)) for g, _ in items)}; "
              "e += blockDim.x) {",
             f"{indent}        const int k = e / B, b = e - k * B;   // a warp's threads share a term: no divergence"]
    first = 0
    for gemm, offset in items:
        row = f"{_shared(offset)} + b * {_row(len(gemm.operands))}"
        lines += _term_branches(program, gemm, row, True, first, indent + "        ")
        first += len(_produced(program, gemm))
    return lines + [f"{indent}    }}", f"{indent}}}"]


def _term_branches(program: Program, gemm: Gemm, row: str, staged: bool, first: int, indent: str) -> list[str]:
    """`if (k == first + number) { ... }` for every term of the GEMM that has partials (_produced): the block's
    partial of row b, from the row's values at `row` (a C pointer: the staged values, B rows of operands x UNITS, or
    the operand buffer's row)."""
    nt = len(gemm.terms)
    index_of = {op.name: i for i, op in enumerate(gemm.operands)}

    def offset(operand: str) -> str:
        return f"{index_of[operand]} * UNITS" if staged else gemm.operand_offset(operand).c_expr()
    inner = indent + "    "
    lines = []
    for number, (index, pairs) in enumerate(_produced(program, gemm)):
        lines += [f"{indent}{'if' if first + number == 0 else 'else if'} (k == {first + number}) {{   // "
                  f"{gemm.name} term {index}",
                  f"{inner}const float* row = {row};",
                  f"{inner}float* part = L.{gemm.partial_buffer} + b;   // slot s of row b at s * B + b"]
        if pairs[0][1] == "var_h":
            lines += [f"{inner}// the variance of {', '.join(o for o, _ in pairs)}: this block's sum, then its "
                      "squares about its own mean",
                      f"{inner}float s = 0.0f, m2 = 0.0f;"]
            for operand, _ in pairs:
                lines += _unit_loop(inner, offset(operand), "s += x;")
            lines.append(f"{inner}const float mean = s / (float)({len(pairs)} * tu);")
            for operand, _ in pairs:
                lines += _unit_loop(inner, offset(operand), "const float d = x - mean; m2 += d * d;")
            lines += [f"{inner}part[({index} * BLOCKS_PER_LAYER + blk) * B] = s;",
                      f"{inner}part[(({nt} + {index}) * BLOCKS_PER_LAYER + blk) * B] = m2;"]
        else:
            lines.append(f"{inner}float acc = 0.0f;")
            for operand, op in pairs:
                lines.append(f"{inner}{{   // {op}({operand})")
                lines.append(f"{inner}    float s = 0.0f;")
                lines += _unit_loop(inner + "    ", offset(operand), "s += x;")
                lines.append(f"{inner}    acc += s{SCALE[op]};")
                lines.append(f"{inner}}}")
            lines.append(f"{inner}part[({index} * BLOCKS_PER_LAYER + blk) * B] = acc;")
        lines.append(f"{indent}}}")
    return lines


PART_CHUNK = "(BLOCKS_PER_LAYER < 64 ? BLOCKS_PER_LAYER : 64)"   # partials loaded in flight at once, per name


def _chunks(indent: str, loads: dict[str, str], passes: list[str], between: list[str] = (),
            after: list[str] = (), before: list[str] = ()) -> list[str]:
    """For every PART_CHUNK blocks of the layer (all of them up to 64: one L2 round trip; blogB's 43 took two in
    chunks of 32), in order: load each name of `loads` (that block's partial at slot (its expression) *
    BLOCKS_PER_LAYER + blk), every load in flight before the first use (the index clamped to the last block, the
    values past it dropped: a chunk costs one L2 round trip); then the lines of `before`, each of `passes` for every
    block of the chunk with the lines of `between` between them, and those of `after` last."""
    lines = [f"{indent}constexpr int CH = {PART_CHUNK};",
             f"{indent}#pragma unroll",
             f"{indent}for (int c = 0; c < BLOCKS_PER_LAYER; c += CH) {{",
             f"{indent}    float " + ", ".join(f"{name}[CH]" for name in loads) + ";",
             f"{indent}    #pragma unroll",
             f"{indent}    for (int i = 0; i < CH; ++i) {{",
             f"{indent}        const int blk = min(c + i, BLOCKS_PER_LAYER - 1);"]
    lines += [f"{indent}        {name}[i] = __ldcg(part + (({column}) * BLOCKS_PER_LAYER + blk) * B);"
              for name, column in loads.items()]
    lines.append(f"{indent}    }}")
    lines += [f"{indent}    {line}" for line in before]
    for number, body in enumerate(passes):
        if number:
            lines += [f"{indent}    {line}" for line in between]
        lines += [f"{indent}    #pragma unroll",
                  f"{indent}    for (int i = 0; i < CH; ++i) {{",
                  f"{indent}        const int blk = c + i;",
                  f"{indent}        if (blk < BLOCKS_PER_LAYER) {{ {body} }}",
                  f"{indent}    }}"]
    return lines + [f"{indent}    {line}" for line in after] + [f"{indent}}}"]


def _combine_partials(col: str, col2: str, parts: int, var: bool, indent: str, twin: str | None = None) -> list[str]:
    """acc = the row's value of the term whose partials are at column `col` (a variance's squares at `col2`; both
    C expressions) from the blocks' partials; twin ("sum_h" or "mean_h", a variance's only): also twin_acc = that
    reduction of the same operands, from the same sums (twins()). A variance: per chunk of blocks (_chunks), their mean from their sums and
    their squares about it (independent operations, no chain of divisions), then the chunk merged into the running
    (count, mean, squares) (Chan, Golub & LeVeque's pairwise update). A block's mean is its sum times the reciprocal
    of its count, a constant once the loop is unrolled: a division by a count that is not a power of two (24 at
    blogB) is an IEEE division with a branch to its slow path, and 43 of them in a row, with the code they took,
    cost ~1.5 us of each consumer at blogB (H200, benchmarks/NOTES.md 2026-11-27 15:50)."""
    if not var:
        return _chunks(indent, {"sums": col}, ["acc += sums[i];"])
    size = f"(float)({parts} * min(UNITS, H - blk * UNITS))"      # the values a block's partials cover
    total = ["tot += cs;"] if twin else []
    return ([f"{indent}float n = 0.0f, mean = 0.0f, m2 = 0.0f;   // the chunks merged one by one"]
            + ([f"{indent}float tot = 0.0f;   // the sum of every value: the twin's"] if twin else [])
            + _chunks(indent, {"sums": col, "m2s": col2},
                      ["cs += sums[i]; cn += " + size + ";",
                       f"const float d = sums[i] * (1.0f / {size}) - cmean; cm2 += m2s[i] + {size} * d * d;"],
                      before=["float cs = 0.0f, cn = 0.0f;"],
                      between=["const float cmean = cs / cn;", "float cm2 = 0.0f;"],
                      after=[*total, "const float d = cmean - mean, total = n + cn;",
                             "mean += d * (cn / total); m2 += cm2 + d * d * (n * cn / total); n = total;"])
            + [f"{indent}acc = m2 * (1.0f / H);   // the sum over the parts of mean_h((v_k - mean)^2)"]
            + ([f"{indent}twin_acc = tot{SCALE[twin]};   // {twin} of the same operands"] if twin else []))


def _whole_rows(gemm: Gemm, pairs, indent: str) -> list[str]:
    """acc = the term's value from the whole rows of its operands (H values a row and operand)."""
    offsets = [gemm.operand_offset(operand).c_expr() for operand, _ in pairs]
    if pairs[0][1] == "var_h":
        lines = [f"{indent}float s = 0.0f;"]
        lines += [f"{indent}for (int j = 0; j < H; ++j) s += __ldcg(row + {off} + j);" for off in offsets]
        lines.append(f"{indent}const float mean = s / (float)({len(pairs)} * H);")
        lines += [f"{indent}for (int j = 0; j < H; ++j) {{ const float d = __ldcg(row + {off} + j) - mean; "
                  "acc += d * d; }" for off in offsets]
        return lines + [f"{indent}acc *= 1.0f / H;"]
    lines = []
    for (operand, op), off in zip(pairs, offsets):
        lines += [f"{indent}{{   // {op}({operand}), the whole row",
                  f"{indent}    float s = 0.0f;",
                  f"{indent}    for (int j = 0; j < H; ++j) s += __ldcg(row + {off} + j);",
                  f"{indent}    acc += s{SCALE[op]};",
                  f"{indent}}}"]
    return lines


def reduction_sums(program: Program, gemms: list[Gemm], partial: dict[str, bool], indent: str,
                   shared: StageShared | None = None) -> list[str]:
    """Each term's row value, for every reduction GEMM of the stage at once (a thread per row and term of any of
    them: their loads all in flight together), written to this block's units (interleaved columns: unit j of term
    k at j * terms + k), or once a row to shared memory where shared.sums has the GEMM (and to the units too where
    another stage reads them); from the blocks' partials where partial[gemm], else from the whole rows of the
    operands. A sum term with a twin variance (twins(): a LayerNorm's mean) has no thread of its own: the
    variance's thread writes it too. The slots' sums share one copy of their code for each shape (a sum, or a
    variance of so many operands, with or without a twin), which reads the slot's partials at the columns its branch
    sets: a copy a slot made the LayerNorm LSTM's kernel 136 KB of code at blogB, and its GEMM, the same
    instructions, took 9.4 us a step instead of 8.4 at 100 KB (H200; a kernel past the SM's instruction cache
    refetches its code every step)."""
    pairs_of = {g.name: twins(program, g) if partial[g.name] else {} for g in gemms}
    slots = [(g, index, pairs) for g in gemms for index, pairs in enumerate(_terms(program, g))
             if index not in pairs_of[g.name]]
    sums = shared.sums if shared else {}
    folded = [(g, index) for g in gemms for index in pairs_of[g.name]]
    lines = [f"{indent}{{   // reductions, no GEMM: " + "; ".join(
                 f"{g.name} term {index} = " + " + ".join(f"{op}({operand})" for operand, op in pairs)
                 for g, index, pairs in slots)
             + "".join(f"; {g.name} term {index} with term {pairs_of[g.name][index]}" for g, index in folded),
             f"{indent}    for (int e = threadIdx.x; e < B * {len(slots)}; e += blockDim.x) {{",
             f"{indent}        const int slot = e / B, b = e - slot * B;   // a warp's threads share a term",
             f"{indent}        float acc = 0.0f;",
             f"{indent}        float* out = nullptr;   // the units' columns in global memory",
             f"{indent}        float* row_value = nullptr;   // the row's value in shared memory",
             f"{indent}        int nt = 1;   // terms of the slot's GEMM: its units' columns are nt apart"]
    if folded:
        lines += [f"{indent}        float twin_acc = 0.0f;   // a variance's twin sum (twins()), and where it goes",
                  f"{indent}        float* twin_out = nullptr;",
                  f"{indent}        float* twin_row = nullptr;"]
    if any(partial[g.name] for g, _, _ in slots):
        lines += [f"{indent}        const float* part = nullptr;   // the slot's partials: row b's term at column col "
                  "(col * BLOCKS_PER_LAYER * B + b), a variance's squares at col2",
                  f"{indent}        int col = 0, col2 = 0, shape = -1;   // shape: which of the sums below adds them",
                  f"{indent}        (void)col2;"]
    inner = indent + "            "
    shapes: dict = {}       # (variance, its operands, its twin's op; a sum: 0): the number of its code
    for number, (g, index, pairs) in enumerate(slots):
        nt = len(g.terms)
        twin = next((m for m, v in pairs_of[g.name].items() if v == index), None)
        lines.append(f"{indent}        {'if' if number == 0 else 'else if'} (slot == {number}) {{   // {g.name} "
                     f"term {index}" + (f" and term {twin}" if twin is not None else ""))
        if g.name in sums:
            lines.append(f"{inner}row_value = {_shared(sums[g.name][1])} + {index} * B + b;")
            if twin is not None:
                lines.append(f"{inner}twin_row = {_shared(sums[g.name][1])} + {twin} * B + b;")
        if g.name not in sums or g.out_buffer in shared.keep:
            lines += [f"{inner}const int N = {g.n.c_expr()};",
                      f"{inner}out = L.{g.out_buffer} + (long)b * N + (long)u0 * {nt} + {index};",
                      f"{inner}nt = {nt};"]
            if twin is not None:
                lines.append(f"{inner}twin_out = L.{g.out_buffer} + (long)b * N + (long)u0 * {nt} + {twin};")
        if partial[g.name]:
            var = pairs[0][1] == "var_h"
            key = (var, len(pairs) if var else 0, _terms(program, g)[twin][0][1] if twin is not None else None)
            shape = shapes.setdefault(key, len(shapes))
            lines.append(f"{inner}part = L.{g.partial_buffer} + b; col = {index}; col2 = {nt} + {index}; "
                         f"shape = {shape};")
        else:
            current = "[t & 1]" if program.buffer(g.in_buffer).double else ""    # a state's home: its version of step t
            lines.append(f"{inner}const float* row = L.{g.in_buffer}{current} + (long)b * ({g.k.c_expr()});")
            lines += _whole_rows(g, pairs, inner)
        lines.append(f"{indent}        }}")
    for (var, parts, twin), shape in shapes.items():
        lines.append(f"{indent}        {'if' if shape == 0 else 'else if'} (shape == {shape}) {{   // "
                     + (f"a variance of {parts} operands" + (f", and their {twin}" if twin else "") if var
                        else "a sum"))
        lines += _combine_partials("col", "col2", parts, var, inner, twin)
        lines.append(f"{indent}        }}")
    lines += [f"{indent}        if (row_value) *row_value = acc;",
              f"{indent}        if (out) for (int j = 0; j < tu; ++j) out[j * nt] = acc;"]
    if folded:
        lines += [f"{indent}        if (twin_row) *twin_row = twin_acc;",
                  f"{indent}        if (twin_out) for (int j = 0; j < tu; ++j) twin_out[j * nt] = twin_acc;"]
    return lines + [f"{indent}    }}", f"{indent}}}"]
