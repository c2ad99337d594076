"""tf32 on the fused backend with its step products held as shifted fp16 against TF32 values in fp32
(tf32_storage "fp16" / "tf32", engine/schedules/tf32_fp16.py; issue #34's tf32 target): `large`, blogA and one
layer at B = 16, the LSTM and GRU. The two are checked against each other first (the same TF32 values multiplied,
the sums in another order: within 2e-3 relative), then timed in three interleaved rounds, each the median of
CUDA-event timed calls (replayed from CUDA graphs) after warm-up; both run their step products on cublasLt.

    python3 benchmarks/probe_tf32_storage.py --out /tmp/probe
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probe_fused_ahead import compare, write_rows  # noqa: E402
from probe_fused_programmatic import CONFIGS  # noqa: E402


def main() -> None:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--config", action="append", default=None)
    args = ap.parse_args()
    variants = {"tf32 storage": dict(tf32_storage="tf32", step_product="cublaslt"),
                "fp16 storage": dict(tf32_storage="fp16", step_product="cublaslt")}
    configs = [c for c in CONFIGS if not args.config or c[0] in args.config]
    rows = compare(cp, variants, ["tf32"], configs, lambda precision: 2e-3)
    write_rows(cp, args.out, "probe_tf32_storage.json", rows)


if __name__ == "__main__":
    main()
