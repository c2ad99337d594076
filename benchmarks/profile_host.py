"""The host (Python) time of one schedule run, and where it goes: cProfile over many runs of a prepared program.

    python benchmarks/profile_host.py [--preset lstm] [--schedule persistent|graph|scan] [-I 512] [-H 512] [-L 4]
                                      [-T 32] [-B 64] [--states]

A pipelined net (engine/multigpu) runs each GPU's layers chunk by chunk, with the states carried over: when the
host takes longer to issue a chunk than the GPU takes to run it, the GPUs wait on Python. This prints the host time
of a run (time.perf_counter around the call, nothing synchronised: what the caller waits for before it can issue the
next thing), the GPU time of a run (CUDA events, median), and the top of cProfile's tables by cumulative and by
own time.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.schedules import scan, schedule_class  # noqa: E402


def main(argv=None) -> int:
    import cupy
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="lstm")
    parser.add_argument("--schedule", default="persistent")
    parser.add_argument("-I", type=int, default=512)
    parser.add_argument("-H", type=int, default=512)
    parser.add_argument("-L", type=int, default=4)
    parser.add_argument("-T", type=int, default=32)
    parser.add_argument("-B", type=int, default=64)
    parser.add_argument("--states", action="store_true", help="pass the previous run's final states (as a pipeline)")
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args(argv)
    network = engine.Network(engine.preset(args.preset).cell, args.I, args.H, args.L)
    params = engine.init_params(network, seed=0)
    program = (scan.prepare(network, params) if args.schedule == "scan"       # a cell whose recurrence is linear
               else schedule_class(args.schedule)(network, params))
    x = cupy.asarray(np.random.default_rng(1).standard_normal((args.T, args.B, args.I)), dtype=cupy.float32)
    states = program.run(x).final_states if args.states else None
    for _ in range(5):
        program.run(x, states)
    cupy.cuda.get_current_stream().synchronize()
    host, gpu = [], []
    for _ in range(args.runs // 4):
        start_event, end_event = cupy.cuda.Event(), cupy.cuda.Event()
        start_event.record()
        start = time.perf_counter()
        program.run(x, states)
        host.append((time.perf_counter() - start) * 1e3)
        end_event.record()
        end_event.synchronize()
        gpu.append(cupy.cuda.get_elapsed_time(start_event, end_event))
    print(f"{args.schedule} {args.preset} I={args.I} H={args.H} L={args.L} T={args.T} B={args.B} "
          f"states={'carried' if args.states else 'zero'}: host {statistics.median(host):.3f} ms a run, "
          f"run on the GPU {statistics.median(gpu):.3f} ms (medians)")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.runs):
        program.run(x, states)
    profile.disable()
    cupy.cuda.get_current_stream().synchronize()
    pstats.Stats(profile).sort_stats("cumulative").print_stats(28)
    pstats.Stats(profile).sort_stats("tottime").print_stats(16)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
