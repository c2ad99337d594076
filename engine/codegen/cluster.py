"""Source of the persistent schedule's cluster mode (engine/schedules/cluster.py): the local copies of the step GEMMs'
operand in every block's shared memory, the exchange of each block's units with the others (exchange(): stores and a
cluster barrier after every stage, a pull after it, or st.async pushes onto each block's transaction barriers), and
the kernel's entry (no grid-wide barrier). engine/codegen/wavefront.py calls these where
tiling.cluster is set; everything else of the kernel is the same source."""
from __future__ import annotations

from dataclasses import replace

from ..errors import CompileError
from ..plan import Lin
from .cuda import index_expr, kernel_body, reads_rows, stored, within_line
from .precision import precision as lookup_precision

CLUSTER_HELPER = "cluster_sync.cuh"
WGMMA_HELPERS = ("wgmma.cuh", "wgmma_gemm.cuh")     # the wgmma path (tiling.wgmma), after mma_gemm and cluster_sync


def exchange(tiling) -> str:
    """How the blocks of a cluster exchange their units of the local copies each step:
    - "share": each stores its slice into the others' copies, then a cluster barrier a stage (the mma.sync path);
    - "pull": a cluster barrier a stage, then each reads the others' slices (the wgmma path, B layout);
    - "push": each sends its slice of the next version with st.async, completing on the receiver's transaction
      barrier, and no cluster barrier (the wgmma path where every copy is a double buffer, so a version is not
      written again before its readers are done: kernels/wgmma_gemm.cuh says why; st.async moves 4 bytes at least,
      so an even number of units a block)."""
    if not tiling.wgmma[0]:
        return "share"
    if all(x.versions == 2 for x in tiling.local_x) and tiling.units_per_block % 2 == 0:
        return "push"
    return "pull"


def constants(tiling) -> list[str]:
    groups = tiling.blocks_per_layer // tiling.cluster
    lines = [f"constexpr int CLUSTER = {tiling.cluster};                // blocks of a cluster: one "
             f"{'head' if groups > 1 else 'layer'} (engine/schedules/cluster.py)",
             f"constexpr int GROUP = H / {groups};            // hidden units of a cluster",
             f"constexpr int X_LOCAL = {tiling.x_local_floats};          // floats of the local copies of X at smem + "
             "SCRATCH (the split-K sums after them)"]
    if exchange(tiling) == "push":
        lines.append(f"__shared__ __align__(8) unsigned long long rnn_xchg_bar[{2 * len(tiling.local_x)}];"
                     "   // the push exchange's barriers: copy c, version v at 2 c + v")
    if tiling.wgmma[0]:
        tiles, parts, ksp = tiling.wgmma
        lines.append(f"constexpr int NB = {round_up16(tiling.batch)}, TILES = {tiles}, PARTS = {parts}, KSP = {ksp};"
                     "   // wgmma: batch rows (its N), tiles of 64 weight rows, parts of K, k steps a warpgroup")
    return lines


def round_up16(n: int) -> int:
    return -(-n // 16) * 16


def stage_params(tiling) -> tuple[str, str]:
    """(the stage functions' extra parameters, the arguments of their calls): the wgmma path's weights in registers,
    and with the push exchange the number of steps."""
    if exchange(tiling) == "push":          # T: the last step sends nothing (no block reads it, some may be gone)
        return ", const unsigned (&wreg)[KSP][4], const int T", ", wreg, T"
    return (", const unsigned (&wreg)[KSP][4]", ", wreg") if tiling.wgmma[0] else ("", "")


def first_tiles(program, tiling) -> dict[str, int]:
    """The wgmma path: {step GEMM: its first tile of 64 weight rows}, the stages' GEMMs in order (the tiles
    rnn_wgmma_gemms_rs deals to the warpgroups)."""
    first, at = {}, 0
    terms = {g.name: g.terms for g in tiling.gemms}
    for s in sorted({g.stage for g in program.gemms if not g.hoisted}):
        for g in program.step_gemms(s):
            if g.name in program.reductions or g.name not in terms:
                continue
            first[g.name] = at
            at += -(-terms[g.name] * tiling.units_per_block // 64)
    return first


def register_weights(program, tiling) -> list[str]:
    """The wgmma path, after the resident weights are in shared memory: each warpgroup's tile of them into
    registers, once a launch (kernels/wgmma_gemm.cuh rnn_wgmma_rs_load)."""
    if not tiling.wgmma[0]:
        return []
    mode = {2: "RNN_FP16", 3: "RNN_BF16"}[lookup_precision(program.precision).mode]
    lines = ["    // The wgmma path: warpgroup w holds tile w % TILES of the step weights, part w / TILES of its K, in",
             "    // registers for the whole launch.",
             "    unsigned wreg[KSP][4];",
             "    {",
             "        const int tile = (threadIdx.x >> 7) % TILES, part = (threadIdx.x >> 7) / TILES;"]
    tiles = {t.name: t for t in tiling.gemms}
    firsts = first_tiles(program, tiling)
    gemms = {g.name: g for g in program.gemms}
    for i, (name, first) in enumerate(firsts.items()):
        t, g = tiles[name], gemms[name]
        k = f"({g.k.c_expr()}) / {t.heads}" if t.heads > 1 else f"({g.k.c_expr()})"
        count = -(-t.terms * tiling.units_per_block // 64)
        lines += [f"        {'if' if i == 0 else 'else if'} (tile >= {first} && tile < {first + count})   // {name}",
                  f"            rnn_wgmma_rs_load<KSP>(wreg, reinterpret_cast<const unsigned short*>(smem + "
                  f"{t.smem_offset}), rnn_wstride<{mode}>({k}), {k}, {t.terms} * tu, 64 * (tile - {first}), part * KSP);"]
    lines += ["        else",
              "            for (int s = 0; s < KSP; ++s) wreg[s][0] = wreg[s][1] = wreg[s][2] = wreg[s][3] = 0u;",
              "    }"]
    return lines


def _local(tiling, buffer: str):
    found = next((x for x in tiling.local_x if x.buffer == buffer), None)
    if found is None:
        raise CompileError(f"buffer {buffer!r} has no local copy in cluster mode; hint: this is a bug in "
                           "engine.schedules.tiling, run with sync='grid' meanwhile")
    return found


def pointer(tiling, buffer: str, version: str) -> str:
    """This block's local copy of `buffer`, version `version` (a C expression; 0 for a single buffer)."""
    x = _local(tiling, buffer)
    ver = f" + ({version}) * {x.floats}" if x.versions > 1 else ""
    base = "rnn_align1024(smem + SCRATCH)" if x.swizzled else "smem + SCRATCH"
    return f"reinterpret_cast<unsigned short*>({base} + {x.offset}{ver})"


def _element(x, row: str, col: str) -> str:
    """Where element (row, col) of a local copy lies: padded rows, or wgmma's B layout."""
    return f"rnn_swz_index<NB>({row}, {col})" if x.swizzled else f"{row} * {x.stride} + {col}"


def store(tiling, buffer: str, version: str, access, value: str) -> str:
    """The statement writing a unit's 16-bit value of `buffer` into this block's local copy (row b, the unit's
    column within its cluster's group); share() then copies the block's slice into the others."""
    if access.rows == "sequence" or access.offset.c_expr() != "0" or access.stride != 1:
        raise CompileError(f"cluster mode keeps buffer {buffer!r} in shared memory by unit, and this store writes "
                           "another layout; hint: sync='grid'")
    x = _local(tiling, buffer)
    return f"{pointer(tiling, buffer, version)}[{_element(x, '(int)b', 'j - (u0 / GROUP) * GROUP')}] = {value};"


def share(tiling, written: list[tuple[str, str]], indent: str) -> list[str]:
    """After a stage's cell code: a block barrier, then this block's slice of each (buffer, version) it wrote
    copied into every other block of the cluster, as wide as the slice's alignment allows. (The stage then arrives
    at the cluster barrier: rnn_cluster_arrive.)"""
    if exchange(tiling) == "push":
        return push(tiling, written, indent)
    written = [(buffer, version) for buffer, version in dict.fromkeys(written) if not _local(tiling, buffer).swizzled]
    if not written:
        return []                        # (the wgmma path's copies are gathered by their readers: gather)
    vector = _vector(tiling)
    lines = [f"{indent}__syncthreads();   // this block's units of h are in its own copy: now into the cluster's others"]
    for buffer, version in written:
        x = _local(tiling, buffer)
        lines.append(f"{indent}rnn_cluster_share<CLUSTER, {vector}>({pointer(tiling, buffer, version)}, B, "
                     f"{2 * x.stride}, 2 * (u0 - (u0 / GROUP) * GROUP), 2 * UNITS);")
    return lines


def barrier(tiling, buffer: str, version: str) -> str:
    """The shared::cta address of the push exchange's barrier of `buffer`, version `version` (a C expression)."""
    c = [x.buffer for x in tiling.local_x].index(buffer)
    return f"(unsigned)__cvta_generic_to_shared(rnn_xchg_bar + {2 * c} + ({version}))"


def push(tiling, written: list[tuple[str, str]], indent: str) -> list[str]:
    """The push exchange after a stage's cell code: a block barrier, then this block's slice of each copy's next
    version sent into every other block's (kernels/wgmma_gemm.cuh rnn_cluster_push_swz), except at the last step."""
    lines = []
    for buffer, version in dict.fromkeys(written):
        if version != "(t + 1) & 1":
            raise CompileError(f"the push exchange sends the next version of a double buffer, and buffer {buffer!r} "
                               f"is written as version {version}; hint: this is a bug in engine.codegen.cluster "
                               "exchange(), run with TileConfig(wgmma=False) meanwhile")
        lines.append(f"{indent}if (t + 1 < T)   // (the last step's values go to no GEMM)")
        lines.append(f"{indent}    rnn_cluster_push_swz<CLUSTER, NB, {_vector(tiling)}>({pointer(tiling, buffer, version)}, "
                     f"{barrier(tiling, buffer, version)}, B, UNITS);")
    if not lines:
        return []
    return [f"{indent}__syncthreads();   // this block's units are in its own copies: now into the cluster's others"] + lines


def arrive(tiling, indent: str) -> list[str]:
    """The end of a stage's exchange: the cluster barrier's arrive, or nothing with the push exchange."""
    return [] if exchange(tiling) == "push" else [f"{indent}rnn_cluster_arrive();"]


def _vector(tiling) -> str:
    """The widest copy (up to 16 bytes) that divides a block's slice of a local copy."""
    width = next(w for w in (16, 8, 4, 2) if (2 * tiling.units_per_block) % w == 0)
    return {16: "uint4", 8: "uint2", 4: "unsigned", 2: "unsigned short"}[width]


def gather(tiling, buffers: list[str], indent: str) -> list[str]:
    """The wgmma path, before a stage's GEMMs, the other blocks' slices of the local copies they read (version
    t & 1) made whole in this block's, then a block barrier. The push exchange waits on the copies' barriers
    (kernels/wgmma_gemm.cuh rnn_cluster_receive); the pull reads the slices from the cluster (rnn_cluster_pull_swz):
    the stage that wrote them ended at the cluster barrier, and no block writes them again before every block has
    passed the next one."""
    copies = [b for b in dict.fromkeys(buffers) if _local(tiling, b).swizzled]
    if not copies:
        return []
    if exchange(tiling) == "push":        # step 0 reads version 0 as the host wrote it; step t >= 1 the pushes of t - 1
        lines = [f"{indent}if (t > 0) {{   // the peers' units of this step have landed (phase (t - 1) / 2 of version t & 1)"]
        lines += [f"{indent}    rnn_cluster_receive({barrier(tiling, b, 't & 1')}, ((t - 1) >> 1) & 1);" for b in copies]
        lines += [f"{indent}}} else {{",
                  f"{indent}    rnn_fence_async_shared();   // what the block wrote, to the tensor cores",
                  f"{indent}}}"]
        return lines + [f"{indent}__syncthreads();   // every thread has waited: this block's copies are whole"]
    lines = [f"{indent}rnn_cluster_pull_swz<CLUSTER, NB, {_vector(tiling)}>({pointer(tiling, b, 't & 1')}, B, UNITS);"
             for b in copies]
    return lines + [f"{indent}__syncthreads();   // this block's copies are whole"]


def outputs(program, tiling) -> dict:
    """{GEMM output buffer: its cluster.LocalY} for the step GEMMs whose output stays in shared memory."""
    return {g.out_buffer: y for g in program.gemms for y in tiling.local_y if y.gemm == g.name}


def tile(tiling, y, step: str = "t") -> str:
    """This block's tile of a GEMM output in shared memory (an input projection's: the version of step `step`)."""
    version = f" + (({step}) & 1) * {tiling.batch * y.floats}" if y.versions > 1 else ""
    return f"(smem + SCRATCH + {y.offset}{version})"


def copies(program, tiling, step: str, indent: str) -> list[str]:
    """This block's rows of the input projections of step `step` into their tiles: 16-byte cp.async copies, one
    group a step (the loop waits for them a step later)."""
    lines = []
    for g in program.hoisted_gemms:
        y = next((y for y in tiling.local_y if y.gemm == g.name), None)
        if y is None:
            continue
        lines += [f"{indent}for (int i = threadIdx.x; i < B * {y.ld // 4}; i += blockDim.x) {{   // {g.name}, step {step}",
                  f"{indent}    const int r = i / {y.ld // 4}, q = i - r * {y.ld // 4};",
                  f"{indent}    rnn_cp_async16({tile(tiling, y, step)} + r * {y.ld} + 4 * q, L.{g.out_buffer} + "
                  f"((long)({step}) * B + r) * ({g.n.c_expr()}) + (long){y.terms} * u0 + 4 * q);",
                  f"{indent}}}"]
    return lines + [f"{indent}rnn_cp_async_commit();"] if lines else []


def gemm_output(tiling, gemm) -> tuple[str, str]:
    """(Y, its ld) of a step GEMM: this block's tile in shared memory."""
    y = next(y for y in tiling.local_y if y.gemm == gemm.name)
    return f"smem + SCRATCH + {y.offset}", str(y.ld)


def reads_tiles(kernel, program, tiling):
    """(the kernel with its loads of step GEMM outputs reading the tiles, {param: C pointer}): the pointer is shifted
    by the block's first unit, so the index of unit j (offset + terms * j) lands on its tile column."""
    tiles = outputs(program, tiling)
    pointers = {p.name: f"{tile(tiling, tiles[p.source])} - (long){tiles[p.source].terms} * u0"
                for p in kernel.params if p.kind == "buffer" and p.source in tiles and not p.writes}
    if not pointers:
        return kernel, {}
    sources = {p.name: p.source for p in kernel.params}
    loads = []
    for load in kernel.loads:
        if load.access is not None and load.access.param in pointers:
            y = tiles[sources[load.access.param]]
            if load.access.rows != ("sequence" if y.versions > 1 else "batch"):
                raise CompileError(f"cluster mode keeps GEMM output {sources[load.access.param]!r} in shared memory, "
                                   f"and a load reads it by {load.access.rows} row; hint: sync='grid'")
            load = replace(load, access=replace(load.access, rows="batch", ld=Lin(c=y.ld)))
        loads.append(load)
    return replace(kernel, loads=tuple(loads)), pointers


def preloaded(kernel, precision, indent: str, around, copies: list[str], tiling) -> list[str]:
    """The body of a stage's one kernel around its GEMMs, one element a thread (B x UNITS <= THREADS): the loads
    that read no output of the stage's GEMMs (states, parameters, the input projection's tile) first, so that their
    L2 round trip overlaps the GEMMs; then the GEMMs (around[0]); then the GEMM outputs' loads, the statements and
    the stores (with `copies`, the 16-bit copies' stores) on the thread's element."""
    gemm_lines, outputs, shared = around
    late_params = {p.name for p in kernel.params if p.source in outputs}
    early = tuple(ld for ld in kernel.loads if ld.access is None or ld.access.param not in late_params)
    late = tuple(ld for ld in kernel.loads if ld not in early)
    lines = [f"{indent}    const int e = threadIdx.x;",
             f"{indent}    const bool live = e < B * tu;             // one element a thread (the others compute "
             "element 0's and store nothing)",
             f"{indent}    const long b = live ? e / tu : 0;",
             f"{indent}    const int j = u0 + (live ? (int)(e - b * tu) : 0);"]
    if reads_rows(kernel):
        lines.append(f"{indent}    const long row = (long)t * B + b;   // row of step t in (T*B, .) sequence buffers")
    first = kernel_body(replace(kernel, loads=early, statements=(), stores=()), precision, indent + "    ")
    rest = kernel_body(replace(kernel, loads=late, stores=()), precision, indent + "    ")
    lines += [line for line in first + ["    " + line for line in gemm_lines] + rest if "const long row" not in line]
    if any(store.past_end is not None for store in kernel.stores):
        lines.append(f"{indent}    {within_line('L.lengths')}")
    lines += [f"{indent}    if (live) {{   // the 16-bit copies into this block's shared memory"]
    lines += [f"{indent}        {line}" for line in copies] + [f"{indent}    }}"]
    lines += ["    " + line for line in shared]
    lines += [f"{indent}    {line.strip()}   // the cluster's copies are written; the stores below overlap the wait"
              for line in arrive(tiling, "")]
    lines += [f"{indent}    if (live) {{"]
    lines += [f"{indent}        {store.access.param}[{index_expr(store.access)}] = {precision.store(stored(store))};"
              for store in kernel.stores]
    return lines + [f"{indent}    }}", f"{indent}}}"]


ARGS = ["    // The argument table in shared memory: every stage reads its pointers, and a cluster barrier's acquire",
        "    // leaves no L1 line of it to hit.",
        "    static_assert(sizeof(LayerArgs) % 8 == 0 && sizeof(LayerArgs) <= 4096, \"LayerArgs: whole int64s, 4 KiB\");",
        "    __shared__ __align__(128) long long layer_args[(sizeof(LayerArgs) + 127) / 128 * 16];",
        "    for (int i = threadIdx.x; i < (int)(sizeof(LayerArgs) / 8); i += blockDim.x)",
        "        layer_args[i] = reinterpret_cast<const long long*>(layers + layer)[i];",
        "    __syncthreads();",
        "    const LayerArgs& L = *reinterpret_cast<const LayerArgs*>(layer_args);"]


def signature(prefix: str) -> str:
    return (f'extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS, 1) '
            f"{prefix}_persistent(const LayerArgs* __restrict__ layers, const int T)")


def loop(program, tiling, prefix: str, present, columns: dict[str, str]) -> list[str]:
    """After the resident weights: on the wgmma path their tiles into registers; the local copies loaded from the
    16-bit copies the host wrote (step 0 reads version 0), the push exchange's barriers, a cluster barrier, then the
    steps (each stage ending at a cluster barrier, or with the push exchange re-arming the barriers of the version
    read). columns: the C expression of each copied buffer's columns."""
    lines = register_weights(program, tiling)
    lines += ["    // The local copies of X: the host's 16-bit values of this cluster's columns, zeros past B rows and the",
              "    // group's columns (whole MMA tiles)."]
    for x in tiling.local_x:
        for v in range(x.versions):
            source = f"L.{x.buffer}_h16" + (f"[{v}]" if x.versions > 1 else "")
            lines += [f"    for (int i = threadIdx.x; i < rnn_round_up(B, 16) * {x.stride}; i += blockDim.x) {{",
                      f"        const int r = i / {x.stride}, c = i - r * {x.stride};",
                      f"        {pointer(tiling, x.buffer, str(v))}[{_element(x, 'r', 'c') if x.swizzled else 'i'}] = "
                      f"r < B && c < {x.cols} ? "
                      f"{source}[(long)r * ({columns[x.buffer]}) + (u0 / GROUP) * GROUP + c] : (unsigned short)0;",
                      "    }"]
    if any(x.swizzled for x in tiling.local_x):
        lines.append("    rnn_fence_async_shared();   // written by this block's threads, read by its tensor cores")
    push = exchange(tiling) == "push"
    if push:
        lines += ["    // The push exchange's barriers, each armed for the peers' bytes of its first phase (version 1 is sent at",
                  "    // step 0, version 0 at step 1), published to the cluster by the barrier below.",
                  f"    rnn_cluster_receive_init((unsigned)__cvta_generic_to_shared(rnn_xchg_bar), {2 * len(tiling.local_x)}, "
                  "(CLUSTER - 1) * B * UNITS * 2);"]
    lines += ["    rnn_cluster_sync();   // every block's copies are loaded before any block of the cluster writes into them"]
    ahead = copies(program, tiling, "0", "    ")
    lines += (["    if (T > 0) {   // the input projections' rows of step 0 (each step copies the next step's)"]
              + ["    " + line for line in ahead] + ["    }"]) if ahead else []
    lines += ["    for (int t = 0; t < T; ++t) {   // the steps: each stage ends at a cluster barrier"]
    if ahead:
        lines += ["        rnn_cp_async_wait<0>();   // this step's rows of the input projections have landed",
                  "        __syncthreads();",
                  "        if (t + 1 < T) {"] + copies(program, tiling, "t + 1", "            ") + ["        }"]
    for s in present:
        if push:
            lines.append(f"        {prefix}_stage_{s}(L, layer, t, u0, tu, smem{stage_params(tiling)[1]});")
        else:
            lines += [f"        {prefix}_stage_{s}(L, layer, t, u0, tu, smem{stage_params(tiling)[1]});   // ends with its arrive",
                      "        rnn_cluster_wait();"]
    if push:               # every thread has waited on version t & 1 (a block barrier since): its next phase
        lines += ["        if (threadIdx.x == 0 && t > 0) {   // armed for the peers' bytes of step t + 2",
                  *[f"            rnn_bar_expect({barrier(tiling, x.buffer, 't & 1')}, (CLUSTER - 1) * B * UNITS * 2);"
                    for x in tiling.local_x],
                  "        }"]
    return lines + ["    }", "}"]
