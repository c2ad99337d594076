"""The persistent training step (engine/autodiff/persistent.py) against the fused one: forward and step ms (CUDA events
around record() and record().backward(), medians), layer by layer and as the wavefront.

    python benchmarks/experiments/probe_persistent.py --preset lstm --config blogB --config mid
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: probe_fused_training

import numpy as np  # noqa: E402
from probe_fused_training import probe_case, timed  # noqa: E402

from engine.autodiff.bptt import record  # noqa: E402
from engine.bench.configs import parse_configs  # noqa: E402


def main(argv=None) -> int:
    import cupy

    from engine.autodiff import fused_cache, fused_tape, persistent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", action="append", default=None)
    parser.add_argument("--config", action="append", default=None)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    print("| cell | config | order | launches | forward ms | step ms |\n|---|---|---|---|---|---|")
    for name in args.preset or ["lstm"]:
        for config in parse_configs(args.config or ["blogB"]):
            network, params, x, w = probe_case(cupy, name, config)
            for wavefront in (True, False):
                fused_tape.WAVEFRONT = wavefront
                order = "wavefront" if wavefront else "layers"
                for label in ("fused", "persistent"):
                    persistent.PERSISTENT = label == "persistent"
                    try:
                        ms, _ = timed(cupy, lambda: record(network, params, x, dtype=np.float32, backend="fused"),
                                      args.repeats)
                        step, _ = timed(cupy, lambda: record(network, params, x, dtype=np.float32,
                                                             backend="fused").backward(w), args.repeats)
                        print(f"| {name} | {config.name} | {order} | {label} | {ms:.2f} | {step:.2f} |", flush=True)
                    except Exception as e:  # noqa: BLE001 - a shape the GEMM refuses: say so, go on
                        print(f"| {name} | {config.name} | {order} | {label} | {type(e).__name__}: "
                              f"{str(e).splitlines()[0][:80]} |", flush=True)
                    fused_cache.clear_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
