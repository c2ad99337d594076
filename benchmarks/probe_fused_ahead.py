"""Layer 0's projection in pieces ahead of the steps, on a stream of its own (Executor._project_ahead;
issue #34): the fused modes with it off, on with every piece planned for the whole GPU, and on with the pieces after
the first planned for part of the SMs (cublasLt's SM_COUNT_TARGET), at `large`, blogA, `mid` and one layer at
B = 16, the LSTM and GRU, bf16 and tf32. Every variant is checked against the first (the pieces' products may sum in
another order, which can move an operand by a unit of the mode: within 2e-2 relative in bf16, 2e-3 in tf32), then
timed in three interleaved rounds, each the median of
CUDA-event timed calls (replayed from CUDA graphs) after warm-up.

    python3 benchmarks/probe_fused_ahead.py --out /tmp/probe
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

CONFIGS = [("large", 1024, 1024, 2, 100, 128), ("blogA", 2560, 2560, 1, 200, 64), ("mid", 512, 512, 4, 100, 64),
           ("B=16", 512, 512, 1, 1024, 16)]


def compare(cp, variants: dict, precisions, configs, bound) -> list[dict]:
    """Per precision, config and cell (LSTM, GRU): fused_modes.prepare(..., **options) for each variant, every one
    checked against the first (relative max error under bound(precision); 0: bit-identical), then three interleaved
    rounds of median_ms. Rows of {cell, config, precision, case, ms_rounds, ms}; a line a case printed as it goes."""
    rows = []
    for precision in precisions:
        for config, I, H, L, T, B in configs:
            x = cp.asarray(np.random.default_rng(1).standard_normal((T, B, I)), dtype=cp.float32)
            for cell in ("lstm", "gru"):
                network = engine.Network(engine.preset(cell).cell, I, H, L)
                params = engine.init_params(network, seed=0)
                programs = {label: fused_modes.prepare(network, params, precision=precision, **options)
                            for label, options in variants.items()}
                first, *others = programs
                want = programs[first].run(x).outputs
                for label in others:
                    got = programs[label].run(x).outputs
                    if bound(precision) == 0:
                        assert bool(cp.array_equal(got, want)), f"{cell} {config} {label}: not bit-identical"
                    else:
                        error = float(cp.abs(got - want).max() / cp.abs(want).max())
                        assert error < bound(precision), f"{cell} {config} {label}: {error:.1e} from {first}"
                times: dict = {label: [] for label in programs}
                for _ in range(3):
                    for label, program in programs.items():
                        times[label].append(median_ms(cp, lambda p=program: p.run(x)))
                base = float(np.median(times[first]))
                line = f"{cell:4s} {config:6s} {precision:9s} {first} {base:7.3f} ms"
                for label, values in times.items():
                    ms = float(np.median(values))
                    rows.append({"cell": cell, "config": config, "precision": precision, "case": label,
                                 "ms_rounds": values, "ms": ms})
                    if label != first:
                        line += f" | {label} {ms:7.3f} ({(base - ms) / base * 100:+.1f} %)"
                print(line, flush=True)
    return rows


def write_rows(cp, out: Path | None, name: str, rows: list[dict]) -> None:
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(json.dumps(
            {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": rows}, indent=1))


def main() -> None:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--precision", action="append", default=None)
    ap.add_argument("--config", action="append", default=None)
    args = ap.parse_args()
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    variants = {"off": dict(projection_ahead=False), "ahead": dict(projection_ahead=True),
                f"ahead, {sms // 2} SMs": dict(projection_ahead=True, projection_sms=sms // 2),
                f"ahead, {sms // 4} SMs": dict(projection_ahead=True, projection_sms=sms // 4)}
    configs = [c for c in CONFIGS if not args.config or c[0] in args.config]
    # a unit of the mode, which a product summed in another order can move an operand by
    rows = compare(cp, variants, args.precision or ["bfloat16", "tf32"], configs,
                   lambda precision: 2e-2 if precision == "bfloat16" else 2e-3)
    write_rows(cp, args.out, "probe_fused_ahead.json", rows)


if __name__ == "__main__":
    main()
