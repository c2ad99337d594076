"""The fused backend's mode path at `large` (two layers) with its layers on their own streams and on one, and one
layer alone: whether the layers' steps overlap (issue #34). Three interleaved rounds, each a median of CUDA-event
timed replays after warm-up; both ways checked equal first.

    python3 benchmarks/probe_fused_streams.py --out /tmp/probe [--precision bfloat16]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from probe_fused_modes import median_ms  # noqa: E402

import engine  # noqa: E402
from engine.schedules import fused_modes  # noqa: E402


def main() -> None:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--precision", default="bfloat16")
    args = ap.parse_args()
    rows = []
    for cell in ("lstm", "gru"):
        x = cp.asarray(np.random.default_rng(1).standard_normal((100, 128, 1024)), dtype=cp.float32)
        programs = {}
        for label, layers, streams in (("2 layers, streams", 2, True), ("2 layers, one stream", 2, False),
                                       ("1 layer", 1, True)):
            network = engine.Network(engine.preset(cell).cell, 1024, 1024, layers)
            programs[label] = fused_modes.prepare(network, engine.init_params(network, seed=0),
                                                  precision=args.precision, layer_streams=streams)
        a = programs["2 layers, streams"].run(x).outputs
        b = programs["2 layers, one stream"].run(x).outputs
        assert bool(cp.array_equal(a, b)), "the streams changed the result"
        times: dict = {label: [] for label in programs}
        for _ in range(3):
            for label, program in programs.items():
                times[label].append(median_ms(cp, lambda p=program: p.run(x)))
        for label, values in times.items():
            rows.append({"cell": cell, "case": label, "precision": args.precision, "ms_rounds": values})
            print(f"{cell} large {args.precision} {label:22s} " + " ".join(f"{v:.3f}" for v in values) + " ms")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"probe_fused_streams_{args.precision}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
