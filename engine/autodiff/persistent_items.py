"""The CUDA of one item of a persistent training launch's step (engine/autodiff/persistent.py): a fused stage's GEMM
into shared memory and where the GEMM writes, then the kernel's statements on the block's units; for the grid
layout and the head-local one (engine/autodiff/persistent_heads.py)."""
from __future__ import annotations

from ..codegen.precision import precision
from ..codegen.wavefront import MODE_NAMES, gemv_ksteps
from ..schedules.staging import weight_stride
from .fused_codegen import element, gemm_loads, statement_body, statement_expr, store_lines, var
from .persistent_plan import CG, GEMV_MAX_ROWS, RW, THREADS, Item, PersistentPlan, row_stride


def head_stride(layout: PersistentPlan) -> int:
    """Elements between a head-local block's resident weight rows, a head's columns each (rnn_wstride of the mode)."""
    return weight_stride(layout.head_units, precision(layout.mode))


def head_on_tensor_cores(layout: PersistentPlan) -> bool:
    """Whether a head-local launch's GEMMs run on mma.sync (kernels/persistent_gemm.cuh rnn_head_mma): the 16-bit
    modes, a head's columns whole k steps of 16. fp32 stays FFMA (strict), tf32 too."""
    return layout.mode in ("float16", "bfloat16") and layout.head_units % 16 == 0


def head_gemm_lines(it: Item, columns: dict, layout: PersistentPlan, tg: str, pad: str) -> list[str]:
    """A head-local block's GEMM of step tg: its RB rows x its units' columns, over the head's columns of each run of K
    from k0 (rnn_head_gemm, a part a run), the parts added in order into dots and where the GEMM writes (to what is
    there when it accumulates)."""
    gemm, out = it.gemm, it.gemm.out
    M, COLS, runs, rows = it.members, it.columns, it.k // layout.sizes[1], layout.rows
    mode = MODE_NAMES[precision(layout.mode).mode]
    operand = gemm.operand
    ldx = f"({columns[operand.buffer].c_expr()})"
    offset = operand.offset.c_expr()
    x = (f"{operand.buffer} + ((long)({tg} + {operand.shift}) * B + r0) * {ldx}"
         + (f" + ({offset})" if offset != "0" else "") + " + k0")
    parts = " + ".join(f"dots[{p * rows * COLS} + i]" for p in range(runs))
    product = (f"rnn_head_mma<{mode}, {layout.head_units}, {runs}>" if head_on_tensor_cores(layout) else
               f"rnn_head_gemm<{mode}, RB, {64 // rows}, {layout.head_units}, {runs}>")
    ldr = head_stride(layout)
    lines = [f"{pad}{product}({x}, {ldx}, H, RB, "
             f"reinterpret_cast<const RnnWeight<{mode}>::type*>(smem + {it.offset}), {ldr}, "
             f"{COLS * ldr}L, {COLS}, dots, {COLS}, {rows * COLS});",
             f"{pad}__syncthreads();                       // the block's GEMM columns are in dots, a part a run",
             f"{pad}for (int i = threadIdx.x; i < RB * {COLS}; i += blockDim.x) {{   // ... summed, and where the GEMM "
             "writes",
             f"{pad}    const int r = i / {COLS}, c = i - r * {COLS}, u = c / {M}, m = c - u * {M};",
             f"{pad}    float* o = {out.buffer} + ((long)({tg} + {out.shift}) * B + r0 + r) * "
             f"({columns[out.buffer].c_expr()}) + ({out.offset.c_expr()}) + m * {it.dim} + j0 + u;",
             f"{pad}    const float v = {'*o + ' if gemm.accumulate else ''}({parts});",
             f"{pad}    *o = v;",
             f"{pad}    dots[i] = v;",
             f"{pad}}}",
             f"{pad}__syncthreads();"]
    return lines


def gemm_lines(it: Item, columns: dict, B: int, tg: str, pad: str) -> list[str]:
    """The block's columns of the item's GEMM of step tg into dots, then where the GEMM writes (added to what is
    there when it accumulates; then dots holds the sums too)."""
    gemm, out = it.gemm, it.gemm.out
    M, K, COLS = it.members, it.k, it.columns
    x = f"{gemm.operand.buffer} + (long)({tg} + {gemm.operand.shift}) * B * {K}"
    if B <= GEMV_MAX_ROWS:
        cw = -(-COLS // (THREADS // 32))
        weight = f"W_{it.weight} + (long)j0 * {M} * {K}"
        lines = [f"{pad}const RnnGemvJob<RNN_FP32> jobs[1] = {{{{{x}, {K}, {K}, {weight}, {K}, "
                 f"smem + {it.offset}, nu * {M}, dots, {COLS}, nullptr}}}};",
                 f"{pad}rnn_warp_gemvs<B, {cw}, 4, RNN_FP32, 1, {gemv_ksteps(1, B, K)}, 1u>(jobs);"]
    else:
        lines = [f"{pad}rnn_rows_gemm<{RW}, {CG}, {K}>({x}, B, smem + {it.offset}, {row_stride(K)}, nu * {M}, "
                 f"dots, {COLS});"]
    lines += [f"{pad}__syncthreads();                       // the block's GEMM columns are in dots",
              f"{pad}for (int i = threadIdx.x; i < B * nu * {M}; i += blockDim.x) {{   // ... and, in place, where "
              "the GEMM writes",
              f"{pad}    const int r = i / (nu * {M}), c = i - r * (nu * {M}), u = c / {M}, m = c - u * {M};",
              f"{pad}    float* o = {out.buffer} + ((long)({tg} + {out.shift}) * B + r) * "
              f"({columns[out.buffer].c_expr()}) + ({out.offset.c_expr()}) + m * {it.dim} + j0 + u;",
              f"{pad}    const float v = {'*o + ' if gemm.accumulate else ''}dots[r * {COLS} + c];",
              f"{pad}    *o = v;"]
    if gemm.accumulate:
        return lines + [f"{pad}    dots[r * {COLS} + c] = v;", f"{pad}}}", f"{pad}__syncthreads();"]
    return lines + [f"{pad}}}"]


def item_lines(it: Item, columns: dict, B: int, heads: PersistentPlan | None = None) -> list[str]:
    """One item of step t on this block's units. Where the block's elements fit its threads (B x TU <= THREADS) each
    thread issues its element's loads other than the GEMM's before the GEMM, so their latency hides behind it (as the
    fused stages do); the grid barrier after the item is the block's barrier too. A lag-1 item's GEMM (of step t + 1)
    is skipped at the chunk's first step: the kernel then reads those values where the GEMM wrote them. heads: the
    head-local layout, whose block owns RB batch rows from r0 and the head's units from j0 (render_heads)."""
    kernel, stage = it.kernel, it.stage
    pad = "                "
    what = (f"GEMM {it.gemm.name} of step t alone" if it.gemm_only else
            f"{kernel.name}" + (f" after GEMM {it.gemm.name} of step t{' + 1' if it.lag else ''}" if stage else ""))
    rows, first = ("RB", "r0 + ") if heads else ("B", "")
    lines = [f"        {{   // {what}, on this block's units"]
    if not heads:
        lines.append(f"            const int j0 = blockIdx.x * {it.units}, nu = min({it.units}, {it.dim} - j0);")
    lines.append("            if (nu > 0) {")
    close = [f"{pad[:-4]}}}", "        }"]

    def gemm_of(tg: str, indent: str) -> list[str]:
        return head_gemm_lines(it, columns, heads, tg, indent) if heads else gemm_lines(it, columns, B, tg, indent)

    def element_index(indent: str) -> list[str]:
        if heads:
            return [f"{indent}const int er = e / nu;", f"{indent}const long b = r0 + er;",
                    f"{indent}const int j = j0 + (e - er * nu);"]
        return [f"{indent}const long b = e / nu;", f"{indent}const int j = j0 + (int)(e - b * nu);"]
    if it.gemm_only:
        return lines + gemm_of("t", pad) + close
    if stage is None:
        lines += [f"{pad}for (int e = threadIdx.x; e < {rows} * nu; e += blockDim.x) {{"] + element_index(pad + "    ")
        lines += statement_body(kernel, columns, pad + "    ")
        return lines + [f"{pad}}}"] + close
    M, COLS = it.members, it.columns
    from_dots = gemm_loads(stage)
    early = [(value, place) for value, place in kernel.loads if value not in from_dots]
    gemm_values = [(value, place) for value, place in kernel.loads if value in from_dots]
    row = "(b - r0)" if heads else "b"

    def from_gemm(value, place) -> str:
        dot = f"dots[{row} * {COLS} + (j - j0) * {M} + {from_dots[value]}]"
        return f"here ? {dot} : {element(place, columns)}" if it.lag else dot
    math = [f"const float {var(st.var)} = {statement_expr(st)};" for st in kernel.statements]
    stores = store_lines(kernel, columns)
    one_each = (heads.rows if heads else B) * it.units <= THREADS
    if it.lag:
        lines.append(f"{pad}const bool here = t + 1 < t1;         // else the chunk before ran this GEMM")
    if one_each:                         # an element a thread: its other loads in flight during the GEMM
        lines.append(f"{pad}const int e = (int)threadIdx.x < {rows} * nu ? (int)threadIdx.x : 0;")
        lines += element_index(pad)
        lines += [f"{pad}const float {var(value)} = {element(place, columns)};" for value, place in early]
    tg = "t + 1" if it.lag else "t"
    gemm = gemm_of(tg, pad + ("    " if it.lag else ""))
    lines += ([f"{pad}if (here) {{"] + gemm + [f"{pad}}}"]) if it.lag else gemm
    if one_each:
        lines.append(f"{pad}if ((int)threadIdx.x < {rows} * nu) {{")
        body = [f"const float {var(value)} = {from_gemm(value, place)};" for value, place in gemm_values]
    else:
        lines += [f"{pad}for (int e = threadIdx.x; e < {rows} * nu; e += blockDim.x) {{"] + element_index(pad + "    ")
        body = ([f"const float {var(value)} = {element(place, columns)};" for value, place in early]
                + [f"const float {var(value)} = {from_gemm(value, place)};" for value, place in gemm_values])
    lines += [f"{pad}    {line}" for line in body + math + stores]
    return lines + [f"{pad}}}"] + close
