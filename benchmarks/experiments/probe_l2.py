"""Does the L2's persisting carve-out limit how much of a streamed weight stays on chip? (issue #8;
benchmarks/NOTES.md, 2026-11-24 17:45)

    python benchmarks/experiments/probe_l2.py --preset lstm --preset gru --config blogA --precision bfloat16

Prints the device's persisting-L2 limit (cudaLimitPersistingL2CacheSize) and its maximum, then times the persistent
schedule (whole runs, CUDA events, median) with the limit as found, and again with it raised to the maximum, the
evict_last share of the streamed weights as the tiling sets it (W_KEEP) and, for the raised limit, as large as fits.
Every output is checked against the fused backend first (poisoned buffers). The limit is a setting of this process's
CUDA context (it ends with the process), not of the card.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import engine  # noqa: E402
from engine.bench.configs import parse_configs  # noqa: E402
from engine.schedules import schedule_class  # noqa: E402

PERSISTING_L2 = 0x06                     # cudaLimitPersistingL2CacheSize (CUDA runtime API, cudaLimit)


def time_ms(fn, repeats=15, warmup=3):
    import cupy
    for _ in range(warmup):
        fn()
    start, end, samples = cupy.cuda.Event(), cupy.cuda.Event(), []
    for _ in range(repeats):
        start.record(); fn(); end.record(); end.synchronize()
        samples.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(samples)


def main(argv=None) -> int:
    import cupy
    rt = cupy.cuda.runtime
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", action="append", default=None)
    parser.add_argument("--config", action="append", default=None)
    parser.add_argument("--precision", default="bfloat16")
    parser.add_argument("--pipeline", default=None, help="KCxSTAGES (TileConfig.pipeline)")
    args = parser.parse_args(argv)
    from engine.schedules.tiling import TileConfig
    pipeline = tuple(int(v) for v in args.pipeline.split("x")) if args.pipeline else None
    config = TileConfig(pipeline=pipeline)
    props = rt.getDeviceProperties(0)
    found = rt.deviceGetLimit(PERSISTING_L2)
    most = props["persistingL2CacheMaxSize"]
    print(f"persisting L2 limit: {found / 2**20:.2f} MiB as found, at most {most / 2**20:.2f} MiB; L2 {props['l2CacheSize'] / 2**20:.0f} MiB")
    for preset in args.preset or ["lstm"]:
        for cfg in parse_configs(args.config or ["blogA"]):
            network = engine.Network(engine.preset(preset).cell, cfg.input_size, cfg.hidden_size, cfg.num_layers)
            params = engine.init_params(network, seed=0)
            x = cupy.asarray(np.random.default_rng(1).standard_normal((cfg.steps, cfg.batch, cfg.input_size)),
                             dtype=cupy.float32)
            from engine.backends import fused
            ref = fused.prepare(network, params).run(x).outputs
            sched = schedule_class("persistent")(network, params, config=config, precision=args.precision)
            out = sched.run(x, poison=True).outputs
            err = float(cupy.abs(out - ref).max() / cupy.abs(ref).max())
            keep = sched.tiling.l2_keep
            rows = [("limit as found", found)]
            rows.append(("limit at its maximum", most))
            for label, limit in rows:
                rt.deviceSetLimit(PERSISTING_L2, limit)
                ms = time_ms(lambda: sched.run(x))
                print(f"{preset:6} {cfg.name:6} {args.precision:9} {label:22} keep {keep:.3f}: {ms:8.3f} ms  err {err:.2e}",
                      flush=True)
            # The largest share the raised limit holds, compiled anew (W_KEEP is a constant of the source).
            on_chip = {t.name: t.k_max for t in sched.tiling.gemms if t.resident}
            streamed = sum(g.n(network.layer_sizes(0)) * (g.k(network.layer_sizes(0)) - on_chip.get(g.name, 0))
                           for g in sched.plan_.program.gemms if not g.hoisted
                           ) * (2 if args.precision in ("bfloat16", "float16") else 4)
            print("  tiling:", sched.tiling.describe(), "streamed MB", streamed / 1e6)
            for share in sorted({min(1.0, round(most / streamed, 3)), min(1.0, round(0.9 * most / streamed, 3))}):
                other = schedule_class("persistent")(network, params, config=config, precision=args.precision)
                planned = other.plan

                def plan(T, B, planned=planned, share=share):
                    program_plan, tiling = planned(T, B)
                    return program_plan, dataclasses.replace(tiling, l2_keep=share)
                other.plan = plan                                # W_KEEP is a constant of the source
                out = other.run(x, poison=True).outputs
                err2 = float(cupy.abs(out - ref).max() / cupy.abs(ref).max())
                assert f"W_KEEP = {share}f" in other.source_, "the share did not reach the source"
                ms = time_ms(lambda: other.run(x))
                print(f"{preset:6} {cfg.name:6} {args.precision:9} {'limit at its maximum':22} keep {share:.3f}: "
                      f"{ms:8.3f} ms  err {err2:.2e}", flush=True)
            rt.deviceSetLimit(PERSISTING_L2, found)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
