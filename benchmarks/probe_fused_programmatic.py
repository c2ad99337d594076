"""The fused backend's mode path with and without programmatic dependent launches of its cell kernels
(engine/codegen/programmatic.py; issue #34): `large`, blogA and one layer at B = 16, the LSTM and GRU, bf16 and tf32.
Both ways are checked bit-identical first (inputs random normal), then timed in three interleaved rounds, each the
median of CUDA-event timed calls (replayed from CUDA graphs) after warm-up.

    python3 benchmarks/probe_fused_programmatic.py --out /tmp/probe
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

CONFIGS = [("large", 1024, 1024, 2, 100, 128), ("blogA", 2560, 2560, 1, 200, 64), ("B=16", 512, 512, 1, 1024, 16)]


def main() -> None:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--precision", action="append", default=None)
    args = ap.parse_args()
    rows = []
    for precision in args.precision or ["bfloat16", "tf32"]:
        for config, I, H, L, T, B in CONFIGS:
            x = cp.asarray(np.random.default_rng(1).standard_normal((T, B, I)), dtype=cp.float32)
            for cell in ("lstm", "gru"):
                network = engine.Network(engine.preset(cell).cell, I, H, L)
                params = engine.init_params(network, seed=0)
                programs = {label: fused_modes.prepare(network, params, precision=precision, programmatic=on)
                            for label, on in (("programmatic", True), ("plain", False))}
                outputs = [p.run(x).outputs for p in programs.values()]
                assert bool(cp.array_equal(*outputs)), f"{cell} {config}: programmatic launches changed the result"
                times: dict = {label: [] for label in programs}
                for _ in range(3):
                    for label, program in programs.items():
                        times[label].append(median_ms(cp, lambda p=program: p.run(x)))
                for label, values in times.items():
                    rows.append({"cell": cell, "config": config, "precision": precision, "case": label,
                                 "ms_rounds": values, "ms": float(np.median(values))})
                on, off = (float(np.median(times[k])) for k in ("programmatic", "plain"))
                print(f"{cell:4s} {config:6s} {precision:9s} plain {off:7.3f} ms  programmatic {on:7.3f} ms  "
                      f"({(off - on) / off * 100:+.1f} %)", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_fused_programmatic.json").write_text(json.dumps(
            {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
