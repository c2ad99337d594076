"""Where a fused training step's time goes (bptt backend "fused", engine/autodiff/fused_tape.py): the forward (record)
alone, the whole step, and the host's share (the time Python takes to issue the launches, measured with the GPU
work already queued behind a long kernel would be another probe: here, GPU time vs wall time of one step).

    python benchmarks/probe_fused_training.py --preset lstm --preset gru --config mid --config blogB

Median of --repeats CUDA-event-timed runs after a warm-up, random normal inputs, fp32 (cuBLAS default math, no TF32).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import engine  # noqa: E402
from engine.autodiff import record  # noqa: E402
from engine.bench.configs import parse_configs  # noqa: E402


def timed(cupy, fn, repeats: int) -> tuple[float, float]:
    """(median GPU ms between events around fn, median wall ms of fn including the final synchronize)."""
    fn()
    cupy.cuda.Device().synchronize()
    gpu, wall = [], []
    for _ in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        t0 = time.perf_counter()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        gpu.append(cupy.cuda.get_elapsed_time(start, stop))
    return statistics.median(gpu), statistics.median(wall)


def main(argv=None) -> int:
    import cupy
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", action="append", default=None)
    parser.add_argument("--config", action="append", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-splits", type=int, default=None,
                        help="cap the split-K parts of the step GEMMs (1: cuBLAS alone; default: the engine's)")
    parser.add_argument("--no-fuse", action="store_true",
                        help="no fused stages: every step GEMM through cuBLAS (stage_fusion.FUSE = False)")
    parser.add_argument("--min-split-depth", type=int, default=None,
                        help="the least K a split part keeps (cublas.MIN_SPLIT_DEPTH; default: the engine's)")
    parser.add_argument("--layers", action="store_true",
                        help="layer by layer instead of the default wavefront (fused_tape.WAVEFRONT = False)")
    parser.add_argument("--no-split-sums", action="store_true",
                        help="a split GEMM's parts summed by their own launch (stage_fusion.SPLIT_SUMS = False)")
    parser.add_argument("--in-place", action="store_true",
                        help="the GEMV reads the weights in place, row m * D + unit (stage_fusion.INTERLEAVED = "
                             "False), instead of a copy with a unit's members interleaved, made each call")
    parser.add_argument("--fuse-width", type=int, default=None,
                        help="every fused stage in this variant (stage_fusion.WIDTH; default: choose_width's)")
    parser.add_argument("--tile", default=None, metavar="RB,RC,KC,STAGES",
                        help="the fused stages' tiled GEMM shape (stage_fusion.TILE_*; B > 2)")
    parser.add_argument("--fuse-max-rows", type=int, default=None,
                        help="fuse stages up to this batch (stage_fusion.FUSE_MAX_ROWS)")
    parser.add_argument("--persistent", choices=("off", "auto", "on"), default=None,
                        help="persistent launches (persistent.PERSISTENT): off, auto (where worthwhile), on (wherever "
                             "a layer qualifies); default: the engine's")
    parser.add_argument("--precision", default="float32",
                        help="the step's GEMM mode (bptt precision=: float32, tf32, float16, bfloat16)")
    parser.add_argument("--min-split", type=int, default=None,
                        help="head-local launches: the fewest blocks a head (persistent_heads.MIN_SPLIT)")
    parser.add_argument("--max-blocks", type=int, default=None,
                        help="head-local launches: the most blocks a launch fills (persistent_heads.MAX_BLOCKS)")
    parser.add_argument("--launches", nargs="*", default=None, metavar="PRESETS CONFIGS",
                        help="GPU time of each launch of one layer-step instead (comma-separated presets and configs; "
                             "default lstm,gru mid,blogB)")
    args = parser.parse_args(argv)
    from engine.autodiff import cublas, fused_tape, persistent, persistent_heads, stage_fusion
    persistent_heads.MIN_SPLIT = args.min_split or persistent_heads.MIN_SPLIT
    persistent_heads.MAX_BLOCKS = args.max_blocks
    if args.persistent is not None:
        persistent.PERSISTENT = {"off": False, "auto": "auto", "on": True}[args.persistent]
    if args.tile:
        (stage_fusion.TILE_RB, stage_fusion.TILE_RC, stage_fusion.TILE_KC,
         stage_fusion.TILE_STAGES) = (int(v) for v in args.tile.split(","))
    stage_fusion.SPLIT_SUMS = not args.no_split_sums
    stage_fusion.FUSE = not args.no_fuse
    stage_fusion.WIDTH = args.fuse_width
    stage_fusion.INTERLEAVED = not args.in_place
    if args.fuse_max_rows is not None:
        stage_fusion.FUSE_MAX_ROWS = args.fuse_max_rows
    if args.layers:
        fused_tape.WAVEFRONT = False
    if args.max_splits is not None:
        cublas.MAX_SPLITS = args.max_splits
    if args.min_split_depth is not None:
        cublas.MIN_SPLIT_DEPTH = args.min_split_depth
    if args.launches is not None:
        profile_main(*([r.split(",") for r in args.launches[:2]] if len(args.launches) >= 2 else []))
        return 0
    print(f"{args.precision}, persistent.PERSISTENT = {persistent.PERSISTENT!r}")
    print("| cell | config | forward ms | step ms | step wall ms | head-local |\n|---|---|---|---|---|---|")
    for name in args.preset or ["lstm"]:
        for config in parse_configs(args.config or ["mid"]):
            network, gpu_params, x, w = probe_case(cupy, name, config)
            def forward():
                return record(network, gpu_params, x, dtype=np.float32, backend="fused", precision=args.precision)
            fwd, _ = timed(cupy, forward, args.repeats)
            step, wall = timed(cupy, lambda: forward().backward(w), args.repeats)
            pairs = forward().program.persistent or []
            heads = [f"{launch.layout.heads}x{launch.layout.split}/{launch.layout.rows}r" if launch is not None
                     else "-" for pair in pairs if pair for launch in pair]
            print(f"| {name} | {config.name} | {fwd:.2f} | {step:.2f} | {wall:.2f} | {heads or 'none'} |")
    return 0




def launch_profile(cupy, name: str, config_name: str, repeats: int = 50) -> list[str]:
    """GPU time of each launch of one layer-step (layer 1, step T/2), each captured `repeats` times in a row into a
    CUDA graph and replayed between two events: which of the step's GEMMs and kernels the time goes to."""
    cell = engine.preset(name).cell
    config = parse_configs([config_name])[0]
    network = engine.Network(cell, config.input_size, config.hidden_size, config.num_layers)
    params = engine.init_params(network, seed=0)
    x = cupy.asarray(np.random.default_rng(0).standard_normal((config.steps, config.batch, config.input_size)),
                     dtype=cupy.float32)
    tape = record(network, params, x, dtype=np.float32, backend="fused")
    runner, layer = tape.program.runner, tape.program.layers[min(1, network.num_layers - 1)]
    runner.bind()
    t = config.steps // 2
    lines = []
    for direction, step in (("forward", runner.plan.forward), ("backward", runner.plan.backward)):
        forward = direction == "forward"
        for launch in runner.launches(step, range(t, t + 2), forward, layer):   # two steps: fused pairs across them
            kind, item = launch[:2]

            def once(launch=launch):
                runner.issue(layer, [launch], forward)
            once()
            graph = runner.capture(lambda: [runner.bind()] + [once() for _ in range(repeats)])   # GPU time
            graph.launch(cupy.cuda.get_current_stream())
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            graph.launch(cupy.cuda.get_current_stream())
            stop.record()
            stop.synchronize()
            us = cupy.cuda.get_elapsed_time(start, stop) * 1e3 / repeats
            extra = f" (split K x{runner.splits(item, layer.sizes, layer.B)})" if kind == "gemm" else ""
            lines.append(f"| {name} | {config_name} | {direction} | {kind} {item.name}{extra} (step {launch[2:]}) "
                         f"| {us:.1f} |")
    tape.backward(cupy.zeros_like(tape.outputs))
    return lines


def profile_main(presets=("lstm", "gru"), configs=("mid", "blogB")) -> None:
    import cupy
    print("| cell | config | direction | launch | us (back to back) |\n|---|---|---|---|---|")
    for name in presets:
        for config in configs:
            print("\n".join(launch_profile(cupy, name, config)))


def probe_case(cupy, name: str, config):
    """(network, its parameters as float32 CuPy arrays, x, the loss weights w) of preset `name` at `config`, seed 0."""
    network = engine.Network(engine.preset(name).cell, config.input_size, config.hidden_size, config.num_layers)
    params = engine.init_params(network, seed=0)
    gpu_params = engine.Params([{k: cupy.asarray(v, dtype=cupy.float32) for k, v in layer.items()}
                                for layer in params.layers])
    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.standard_normal((config.steps, config.batch, config.input_size)), dtype=cupy.float32)
    w = cupy.asarray(rng.standard_normal((config.steps, config.batch, network.output_size)), dtype=cupy.float32)
    return network, gpu_params, x, w


def host_profile(name: str = "lstm", config_name: str = "mid", steps: int = 20) -> None:
    """Where the host's time of a step goes (cProfile of `steps` steps after warm-up, the top 25 by own time): the
    Python before the first launch is GPU idle time."""
    import cProfile
    import pstats

    import cupy
    network, gpu_params, x, w = probe_case(cupy, name, parse_configs([config_name])[0])

    def step():
        record(network, gpu_params, x, dtype=np.float32, backend="fused").backward(w)
        cupy.cuda.Device().synchronize()
    for _ in range(3):
        step()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        step()
    profile.disable()
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    if "--host-profile" in sys.argv:     # --host-profile [config [preset]]
        rest = sys.argv[sys.argv.index("--host-profile") + 1:]
        host_profile(*(rest[1:2] or ["lstm"]), *(rest[:1] or ["mid"]))
        raise SystemExit(0)
    raise SystemExit(main())
