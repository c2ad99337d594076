"""A quick probe of the wavefront schedules against cuDNN, for iterating on kernels on the GPU machine.

    python benchmarks/probe_schedules.py --preset lstm --config lat --config mid [--tile 8x4] [--json out.json]

For each anchor configuration: cuDNN (torch.nn.LSTM/GRU, fp32, TF32 off, when the preset has a cuDNN
form), the fused backend, and each schedule, timed the same way as the benchmark harness (CUDA
events around one whole run after warm-up, median of --repeats), plus the schedule's kernel alone
(`_launch`) so that host overhead shows. Every schedule's output is first checked against the fused
backend on the same input (poisoned buffers). The official figures come from `python -m engine bench`;
this is the fast loop while a kernel changes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.bench.configs import parse_configs  # noqa: E402
from engine.schedules import schedule_class  # noqa: E402
from engine.schedules.tiling import TileConfig  # noqa: E402


def time_ms(fn, warmup: int, repeats: int) -> float:
    import cupy
    for _ in range(warmup):
        fn()
    samples = []
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(samples)


def step_probe_args(doc: str):
    """The command line of the step-GEMM probes (probe_cluster_gemm.py, probe_tf32_cluster_gemm.py): steps a launch,
    timed launches, and where to write the JSON."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--json")
    return parser.parse_args()


def checked(label: str, result: dict, digits: int = 3, note: str = "") -> bool:
    """Print one probe kernel's line (its label, us a step with `digits` decimals, `note`, its largest relative error
    against NumPy) and return whether the error is within 1e-5."""
    ok = result["max_rel_error"] <= 1e-5
    print(f"{label}: {result['us_per_step']:.{digits}f} us a step{note}, max rel error {result['max_rel_error']:.2g}"
          f"{'' if ok else '  WRONG'}")
    return ok


def finish(rows: list, json_path: str | None, failed: bool) -> int:
    """The step probes' end: their rows into `json_path` (where given), and the exit status."""
    if json_path:
        Path(json_path).write_text(json.dumps({"rows": rows}, indent=1))
    return 1 if failed else 0


def cudnn_ms(preset: str, cfg, x, warmup: int, repeats: int, precision: str = "float32"):
    """cuDNN in the same mode: TF32 allowed only for tf32; fp16/bf16 modules and inputs for those."""
    import torch
    kinds = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}
    if preset not in kinds:
        return None
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(precision, torch.float32)
    module = kinds[preset](cfg.input_size, cfg.hidden_size, cfg.num_layers).cuda().to(dtype)
    xt = torch.from_dlpack(x).to(dtype)
    with torch.no_grad():
        def fn():
            module(xt)
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        samples = []
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            samples.append(a.elapsed_time(b))
    return statistics.median(samples)


def main(argv=None) -> int:
    import cupy
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", action="append", default=None)
    parser.add_argument("--config", action="append", default=None)
    parser.add_argument("--schedule", action="append", default=None)
    parser.add_argument("--tile", default=None, help="RBxRC, e.g. 8x4 (default: the tiling's own)")
    parser.add_argument("--units", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--layers-per-launch", type=int, default=None)
    parser.add_argument("--sync", default=None, help="persistent: grid (barriers) or layer (arrival counters); default: the tiling's (TileConfig.sync)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--no-fused", action="store_true", help="skip timing the fused backend")
    parser.add_argument("--warp-tile", default=None, help="tensor-core path: MxN MMA tiles per warp, e.g. 2x4")
    parser.add_argument("--precision", default="float32", help="float32, tf32, float16 or bfloat16 (cuDNN in the same mode)")
    parser.add_argument("--pipeline", default=None, help="tiled GEMMs: KCxSTAGES, e.g. 64x3 (TileConfig.pipeline)")
    parser.add_argument("--feed-warp", action="store_true",
                        help="the bulk pipeline fed by a warp of its own (TileConfig(feed_warp=True))")
    parser.add_argument("--stream-wgmma", action="store_true",
                        help="the step GEMMs on wgmma, weights streamed (TileConfig(stream_wgmma=True))")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    pipeline = tuple(int(v) for v in args.pipeline.split("x")) if args.pipeline else None
    rb, rc = (int(v) for v in args.tile.split("x")) if args.tile else (None, None)     # None: the tiling's default
    warp = tuple(int(v) for v in args.warp_tile.split("x")) if args.warp_tile else None
    config = TileConfig(args.units, rb, rc, args.threads, warp_tile=warp, layers_per_launch=args.layers_per_launch,
                        sync=args.sync, pipeline=pipeline, feed_warp=args.feed_warp, stream_wgmma=args.stream_wgmma)
    rows = []
    for preset in args.preset or ["lstm"]:
        cell = engine.preset(preset).cell
        for cfg in parse_configs(args.config or ["lat", "blogB", "mid", "large", "blogA"]):
            network = engine.Network(cell, cfg.input_size, cfg.hidden_size, cfg.num_layers)
            params = engine.init_params(network, seed=0)
            rng = np.random.default_rng(1)
            x = cupy.asarray(rng.standard_normal((cfg.steps, cfg.batch, cfg.input_size)), dtype=cupy.float32)
            row = {"preset": preset, "config": cfg.name, "sizes": [cfg.input_size, cfg.hidden_size, cfg.num_layers,
                                                                   cfg.steps, cfg.batch]}
            row["precision"] = args.precision
            row["cudnn_ms"] = cudnn_ms(preset, cfg, x, args.warmup, args.repeats, args.precision)
            from engine.backends import fused
            ref_prog = fused.prepare(network, params)
            ref = ref_prog.run(x).outputs
            if not args.no_fused:
                row["fused_ms"] = time_ms(lambda: ref_prog.run(x), args.warmup, args.repeats)
            for name in args.schedule or ["persistent", "graph"]:
                try:
                    cfg_for = config if name == "persistent" else TileConfig(args.units, rb, rc, args.threads, warp_tile=warp,
                                                                             feed_warp=args.feed_warp,
                                                                             stream_wgmma=args.stream_wgmma)
                    sched = schedule_class(name)(network, params, config=cfg_for, precision=args.precision)
                    out = sched.run(x, poison=True).outputs
                    err = float(cupy.abs(out - ref).max() / cupy.abs(ref).max())
                    row[f"{name}_err"] = err
                    row[f"{name}_ms"] = time_ms(lambda: sched.run(x), args.warmup, args.repeats)
                    T, B = cfg.steps, cfg.batch
                    row[f"{name}_kernel_ms"] = time_ms(lambda: [sched._launch(T, B, first) for first in range(
                        0, cfg.num_layers, sched.tiling.num_layers)], args.warmup, args.repeats)
                    row[f"{name}_tiling"] = sched.tiling.describe()
                except Exception as e:  # noqa: BLE001 - a probe reports and goes on
                    row[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print()
    print(f"{'preset':<14}{'config':<8}{'cudnn':>8}{'fused':>8}{'persist':>9}{'kernel':>8}{'graph':>8}{'ratio':>7}  err")
    for r in rows:
        def f(key):
            v = r.get(key)
            return f"{v:8.3f}" if isinstance(v, float) else f"{'-':>8}"
        p = r.get("persistent_ms")
        ratio = f"{r['cudnn_ms'] / p:7.2f}" if p and r.get("cudnn_ms") else f"{'-':>7}"
        print(f"{r['preset']:<14}{r['config']:<8}{f('cudnn_ms')}{f('fused_ms')} {f('persistent_ms')}"
              f"{f('persistent_kernel_ms')}{f('graph_ms')}{ratio}  {r.get('persistent_err', r.get('persistent_error'))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
