"""Build FlashRNN's kernels for the benchmark's sizes before the benchmark, on every core at once.

FlashRNN 1.0.8 compiles a kernel for each (cell, dtype, hidden size, heads, batch) at its first call with torch's
extension loader (50-80 s each on the GPU machine's CPU) and keeps it in torch's extension cache, where the next
process finds it. One build is one nvcc process on one core, so building the benchmark's sizes one after another
inside `python -m engine bench` spends its compile budget serially; this script calls FlashRNN once per size in a
pool of processes (two steps a call, so the call itself costs nothing), and the benchmark then only loads them.

    FLASHRNN_PATH=/tmp/fr PATH=/tmp/fr/bin:$PATH python3 benchmarks/flashrnn_prebuild.py \
        --cell lstm --cell gru --dtype float32 --dtype bfloat16 --config mid --config 512,512,1,1024,16 --out $OUT

Prints one line per build (seconds, or why it failed: FlashRNN refuses some sizes, e.g. where R does not fit on
chip) and writes them to OUT/flashrnn_prebuild.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GATES = {"lstm": 4, "gru": 3, "slstm": 4}


def build(function: str, dtype: str, hidden: int, heads: int, batch: int) -> dict:
    """One FlashRNN call of two steps on random inputs of this size: builds (or loads) its kernel."""
    started = time.perf_counter()
    row = {"function": function, "dtype": dtype, "hidden_size": hidden, "heads": heads, "batch": batch}
    try:
        import torch

        from engine.bench.flashrnn import flashrnn_or_reason
        flashrnn, reason = flashrnn_or_reason()
        if reason:
            raise RuntimeError(reason)
        D = hidden // heads
        kind = dict(device="cuda", dtype=getattr(torch, dtype))
        wx = torch.randn(batch, 2, GATES[function], heads, D, **kind)
        R = torch.randn(GATES[function], heads, D, D, **kind) / D ** 0.5
        b = torch.randn(GATES[function], heads, D, **kind)
        states, _ = flashrnn(wx, R, b, states=None, function=function, backend="cuda_fused", dtype=dtype)
        torch.cuda.synchronize()
        row["ok"] = bool(torch.isfinite(states[0]).all())
    except Exception as e:  # noqa: BLE001 - a size FlashRNN cannot build is a row of the report, not a crash
        last = (str(e).strip().splitlines() or [""])[-1]
        row["ok"], row["error"] = False, f"{type(e).__name__}: {last[:300]}"
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def main() -> int:
    from engine.bench.configs import parse_config
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", action="append", choices=sorted(GATES), required=True)
    parser.add_argument("--dtype", action="append", choices=("float32", "float16", "bfloat16"), required=True)
    parser.add_argument("--config", action="append", required=True, help="an anchor name or I,H,L,T,B")
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    sizes = sorted({(c.hidden_size, c.batch) for text in args.config for c in parse_config(text)})
    jobs = [(f, d, h, args.heads, bs) for f in args.cell for d in args.dtype for h, bs in sizes]
    rows = []
    with ProcessPoolExecutor(max_workers=min(args.workers, len(jobs))) as pool:
        for done in as_completed([pool.submit(build, *job) for job in jobs]):
            row = done.result()
            rows.append(row)
            print(f"{row['function']:6s} {row['dtype']:9s} H={row['hidden_size']:5d} heads={row['heads']} "
                  f"B={row['batch']:4d}  {row['seconds']:6.1f} s  {'built' if row['ok'] else row.get('error', 'not finite')}",
                  flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "flashrnn_prebuild.json").write_text(json.dumps(rows, indent=1))
    return 0 if any(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
