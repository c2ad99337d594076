"""The fused backend's mode path with and without programmatic dependent launches of its cell kernels
(engine/codegen/programmatic.py; issue #34): `large`, blogA and one layer at B = 16, the LSTM and GRU, bf16 and tf32.
Both ways are checked bit-identical first (inputs random normal), then timed in three interleaved rounds, each the
median of CUDA-event timed calls (replayed from CUDA graphs) after warm-up.

    python3 benchmarks/probe_fused_programmatic.py --out /tmp/probe
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probe_fused_ahead import compare, write_rows  # noqa: E402

CONFIGS = [("large", 1024, 1024, 2, 100, 128), ("blogA", 2560, 2560, 1, 200, 64), ("B=16", 512, 512, 1, 1024, 16)]


def main() -> None:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--precision", action="append", default=None)
    args = ap.parse_args()
    rows = compare(cp, {"plain": dict(programmatic=False), "programmatic": dict(programmatic=True)},
                   args.precision or ["bfloat16", "tf32"], CONFIGS, lambda precision: 0)     # bit-identical
    write_rows(cp, args.out, "probe_fused_programmatic.json", rows)


if __name__ == "__main__":
    main()
