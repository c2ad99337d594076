"""Where a wavefront step of the persistent kernel spends its time: clock64 marks between its phases.

    python benchmarks/phase_profile.py --preset lstm --config lat [--precision bfloat16] [--json out.json]

ncu says *that* a latency-bound kernel waits; this says *where*. The script builds the persistent schedule
as a run would, then compiles an instrumented copy of its generated source: thread 0 of every block reads
clock64 after each GEMM call, after the stage's block barrier, at the end of each stage and after every
grid-wide barrier, and adds the cycles since the previous mark to that phase's counter (shared memory,
written to a global table at the end). The instrumented kernel runs on the schedule's own buffers and
argument table; its output is checked against the uninstrumented run (the marks must not change the
function). Printed: the mean cycles and microseconds per wavefront step of each phase over busy blocks,
for the first block of every layer and averaged over all blocks. The clock is converted with the ratio of
clock64 to %globaltimer over the whole launch, measured in the same kernel.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.bench.configs import parse_configs  # noqa: E402
from engine.codegen.nvrtc import load_module  # noqa: E402
from engine.schedules import schedule_class  # noqa: E402
from engine.schedules.base import NON_PORTABLE_CLUSTER_SIZE_ALLOWED  # noqa: E402
from engine.schedules.tiling import TileConfig  # noqa: E402

MAX_PHASES = 31                 # + the last mark: 32 int64s, 256 bytes of static shared memory
PRELUDE = f"""
#define RNN_PROF_PHASES {MAX_PHASES}
__shared__ __align__(128) long long rnn_prof_acc[RNN_PROF_PHASES + 1];   // 256 bytes: dynamic smem stays aligned
#define rnn_prof_last rnn_prof_acc[RNN_PROF_PHASES]
__device__ long long rnn_prof_table[1024 * (RNN_PROF_PHASES + 2)];
__device__ __forceinline__ void rnn_prof_mark(int phase)
{{
    if (threadIdx.x == 0) {{
        const long long now = clock64();
        rnn_prof_acc[phase] += now - rnn_prof_last;
        rnn_prof_last = now;
    }}
}}
__device__ __forceinline__ unsigned long long rnn_prof_ns()
{{
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}}
"""


def instrument(source: str, inner: bool = False) -> tuple[str, list[str]]:
    """The source with marks inserted, and the phase names in index order."""
    phases: list[str] = []

    def phase(name: str) -> int:
        if name not in phases:
            phases.append(name)
        return phases.index(name)

    out, stage, in_call, calls, reduced, local, arrived, shared, pushed = [], None, None, 0, False, False, False, False, False
    wgmma = False
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if inner:                       # marks inside the cluster mode's GEMM helper (kernels/mma_gemm.cuh)
            if line.startswith(("__device__ void rnn_mma_gemms_local(", "__device__ __forceinline__ void rnn_mma_gemms_local(")):
                local = True
            elif local and line == "}":
                local = False
            elif local and line.strip().startswith("rnn_store_mma<WM, WN>("):
                out += [f"            rnn_prof_mark({phase('gemm: products')});", line,
                        f"            rnn_prof_mark({phase('gemm: split-K sums, Y stored')});"]
                continue
        if inner:                       # and inside the wgmma path's (kernels/wgmma_gemm.cuh)
            if line.startswith("__device__ __forceinline__ void rnn_wgmma_gemms_rs("):
                wgmma = True
            elif wgmma and line == "}":
                wgmma = False
            elif wgmma and line.strip() == "rnn_wgmma_wait<0>();":
                out += [line, f"    rnn_prof_mark({phase('gemm: fence, wgmma chain, wait')});"]
                continue
            elif wgmma and line.strip() == "__syncthreads();":
                out += [line, f"        rnn_prof_mark({phase('gemm: K parts stored')});"]
                continue
            elif wgmma and line.strip().startswith("__syncthreads();") and "Y is complete" in line:
                out += [line, f"    rnn_prof_mark({phase('gemm: K parts summed, Y stored')});"]
                continue
        if inner and stage is not None and line.strip().startswith("{   // the stage's GEMMs"):
            out.append(f"    rnn_prof_mark({phase(f's{stage} prefetch')});")
        m = re.match(r"__device__ __forceinline__ void \w+_stage_(\d+)\(", line)
        if m:
            stage = m.group(1)
        if stage is not None:
            call = re.search(r"(rnn_warp_gemvs|rnn_tile_gemms|rnn_mma_gemms_local|rnn_wgmma_gemms_rs|rnn_mma_gemms)<",
                             line)
            if call:
                calls += 1
                in_call = f"{call.group(1)} #{calls}"
            out.append(line)
            if in_call and line.rstrip().endswith(");"):
                out.append(f"        rnn_prof_mark({phase(f's{stage} {in_call}')});")
                in_call = None
            elif line.strip() == "__syncthreads();":
                out.append(f"        rnn_prof_mark({phase(f's{stage} block barrier')});")
            elif line.strip().startswith("__syncthreads();   // this block's units of h"):   # sync="cluster"
                out.append(f"    rnn_prof_mark({phase(f's{stage} cell math')});")
            elif line.strip().startswith("rnn_cluster_share<"):
                out.append(f"    rnn_prof_mark({phase(f's{stage} cluster share')});")
                shared = True
            elif line.strip().startswith("__syncthreads();   // this block's copies are whole"):   # the wgmma path
                out.append(f"            rnn_prof_mark({phase(f's{stage} cluster pull')});")
            elif line.strip().startswith("__syncthreads();   // every thread has waited"):   # the push exchange
                out.append(f"            rnn_prof_mark({phase(f's{stage} cluster receive')});")
            elif line.strip().startswith("__syncthreads();   // this block's units are in its own copies"):
                out.append(f"    rnn_prof_mark({phase(f's{stage} cell math')});")
            elif line.strip().startswith("rnn_cluster_push_swz<"):
                out.append(f"    rnn_prof_mark({phase(f's{stage} cluster push')});")
                pushed = True
            elif line.strip().startswith("rnn_cluster_arrive();"):
                if not shared:                     # the wgmma path: no share, the cell code runs up to the arrive
                    out.insert(len(out) - 1, f"    rnn_prof_mark({phase(f's{stage} cell math')});")
                out.append(f"    rnn_prof_mark({phase(f's{stage} cluster arrive')});")
                arrived, shared = True, False
            elif line.strip().startswith("__syncthreads();   // the reductions' sums"):      # engine/codegen/reductions.py
                out.append(f"    rnn_prof_mark({phase(f's{stage} reduction sums')});")
            elif line.strip().startswith("__syncthreads();   // this block's units of"):
                # the first ends the cell math; a later one the partials of the reduction before it
                out.append(f"    rnn_prof_mark({phase(f's{stage} partials' if reduced else f's{stage} cell math')});")
                reduced = True
            elif line.strip() == "(void)I;":
                what = ("partials" if reduced else "stores after the arrive" if arrived else
                        "stores after the push" if pushed else "cell math")
                out.append(f"    rnn_prof_mark({phase(f's{stage} {what}')});")
                reduced = arrived = pushed = False
            if line == "}":
                stage, calls = None, 0
            continue
        if "_persistent(" in line and "__global__" in line:
            out.append(line)
            continue
        if (line.strip() == "__syncthreads();" and i + 1 < len(lines) and
                lines[i + 1].lstrip().startswith(("for (int k", "constexpr unsigned S"))) or \
                line.strip().startswith("for (int t = 0; t < T; ++t) {   // the steps"):    # the steps start
            start = ["    if (threadIdx.x == 0) {",
                     "        for (int p = 0; p < RNN_PROF_PHASES; ++p) rnn_prof_acc[p] = 0;",
                     "        rnn_prof_last = clock64();", "    }",
                     "    const long long rnn_prof_c0 = clock64();",
                     "    const unsigned long long rnn_prof_t0 = rnn_prof_ns();"]
            out += [line] + start if line.strip() == "__syncthreads();" else start + [line]   # cluster: before the loop
            continue
        if line.strip() == "rnn_cluster_wait();":                                   # sync="cluster"
            out += [line, f"        rnn_prof_mark({phase('cluster wait')});"]
            continue
        if line.strip() == "grid.sync();":
            out += [line, f"        rnn_prof_mark({phase('grid.sync')});"]
            continue
        if line.strip() == "__syncthreads();" and i > 0 and "rnn_wait_for" in lines[i - 1]:     # sync="layer"
            out += [line, f"        rnn_prof_mark({phase('layer wait')});"]
            continue
        if line.strip().startswith("rnn_arrive("):
            out += [line, f"        rnn_prof_mark({phase('arrive')});"]
            continue
        if line == "}" and out and out[-1].strip() == "}" and any("rnn_prof_c0" in x for x in out[-40:]):
            out += ["    if (threadIdx.x == 0) {",
                    "        long long* row = rnn_prof_table + (long)blockIdx.x * (RNN_PROF_PHASES + 2);",
                    "        for (int p = 0; p < RNN_PROF_PHASES; ++p) row[p] = rnn_prof_acc[p];",
                    "        row[RNN_PROF_PHASES] = clock64() - rnn_prof_c0;",
                    "        row[RNN_PROF_PHASES + 1] = (long long)(rnn_prof_ns() - rnn_prof_t0);",
                    "    }", line]
            continue
        out.append(line)
    text = "\n".join(out)
    first_device = text.index("__device__")
    text = text[:first_device] + PRELUDE + text[first_device:]
    if len(phases) > MAX_PHASES:
        raise SystemExit(f"{len(phases)} phases: raise MAX_PHASES")
    return text, phases


def profile(preset: str, config: str, precision: str, config_tile: TileConfig, inner: bool = False) -> dict:
    import cupy
    cfg = parse_configs([config])[0]
    cell = engine.preset(preset).cell
    network = engine.Network(cell, cfg.input_size, cfg.hidden_size, cfg.num_layers)
    params = engine.init_params(network, seed=0)
    x = cupy.asarray(np.random.default_rng(1).standard_normal((cfg.steps, cfg.batch, cfg.input_size)),
                     dtype=cupy.float32)
    sched = schedule_class("persistent")(network, params, config=config_tile, precision=precision)
    reference = sched.run(x).outputs.copy()
    source, phases = instrument(sched.source_, inner)
    name = sched.kernels[0].name
    # compiled as the engine compiles (engine/codegen/nvrtc.py; clusters are not cooperative launches)
    module = load_module(source, cooperative=not sched.tiling.cluster)
    kernel = module.get_function(name)
    kernel.max_dynamic_shared_size_bytes = sched.tiling.smem_bytes
    if sched.tiling.cluster > 8:
        cupy.cuda.driver.funcSetAttribute(kernel.kernel.ptr, NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    T, L = cfg.steps, cfg.num_layers
    blocks, threads = sched.tiling.blocks, sched.tiling.config.threads
    if blocks > 1024:
        raise SystemExit("more than 1024 blocks: raise the table size")
    sched.kernels = [kernel]                    # run() now launches the instrumented copy
    out = sched.run(x).outputs
    err = float(cupy.abs(out - reference).max())
    table_ptr = module.get_global("rnn_prof_table")
    table = cupy.ndarray((1024, MAX_PHASES + 2), dtype=cupy.int64, memptr=table_ptr)[:blocks].get()
    cycles, ns = table[:, MAX_PHASES].astype(float), table[:, MAX_PHASES + 1].astype(float)
    ghz = float(np.median(cycles / np.maximum(ns, 1)))
    group = sched.tiling.num_layers
    steps = T if sched.tiling.config.sync in ("layer", "head", "cluster") else T + group - 1   # a block's steps a launch
    result = {"preset": preset, "config": config, "precision": precision, "tiling": sched.tiling.describe(),
              "blocks": int(blocks), "threads": int(threads), "launches": L // group, "steps_per_launch": steps,
              "clock_ghz": ghz, "max_abs_diff_vs_uninstrumented": err, "phases": {}}
    per_layer = sched.tiling.blocks_per_layer
    for p, pname in enumerate(phases):
        us = table[:, p] / steps / ghz / 1000.0
        result["phases"][pname] = {"mean_us": float(us.mean()),
                                   "first_block_of_layer_us": [float(us[g * per_layer]) for g in range(group)]}
    result["step_us"] = float((cycles / steps / ghz / 1000.0).mean())
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", action="append", default=None)
    parser.add_argument("--config", action="append", default=None)
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--units", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--layers-per-launch", type=int, default=None)
    parser.add_argument("--sync", default=None, help="grid, layer, head or cluster (TileConfig.sync); default: the tiling's")
    parser.add_argument("--inner", action="store_true", help="marks inside the cluster mode's GEMM helpers too")
    parser.add_argument("--warp", default=None, help="TileConfig.warp_tile as RxC MMA tiles (tensor-core path)")
    parser.add_argument("--no-wgmma", action="store_true", help="cluster mode: mma.sync from shared memory "
                        "(TileConfig.wgmma=False), not wgmma with the weights in registers")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    warp = tuple(int(v) for v in args.warp.split("x")) if args.warp else None
    tile = TileConfig(args.units, threads=args.threads, layers_per_launch=args.layers_per_launch, sync=args.sync,
                      warp_tile=warp, wgmma=False if args.no_wgmma else None)
    results = []
    for preset in args.preset or ["lstm"]:
        for config in args.config or ["lat"]:
            r = profile(preset, config, args.precision, tile, args.inner)
            results.append(r)
            print(f"\n{preset} {config} {args.precision}: {r['tiling']}; {r['blocks']} blocks x {r['threads']}; "
                  f"{r['step_us']:.2f} us a wavefront step at {r['clock_ghz']:.2f} GHz "
                  f"(instrumented output differs by {r['max_abs_diff_vs_uninstrumented']:.1e})")
            for pname, v in r["phases"].items():
                firsts = " ".join(f"{u:7.2f}" for u in v["first_block_of_layer_us"])
                print(f"  {pname:<28}{v['mean_us']:8.2f} us   first block of each layer: {firsts}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
