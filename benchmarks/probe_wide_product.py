"""The fused backend in bf16 / fp16 with its step products on cublasLt against step_product="wgmma", which runs a
weight past the L2 on kernels/mode_wide.cu (engine/schedules/wgmma_products.py goes_wide; issue #34, bf16 / fp16 at
blogA; NOTES 2026-11-28 12:16): blogA's LSTM (52 MB: mode_wide.cu) and GRU (39 MB, which stays in L2:
mode_wgmma.cu). The two are checked against each other first (the same rounded values, the sums in another order),
then timed in three interleaved rounds of CUDA-event medians of replayed calls; cuDNN's layers in the same mode
(TF32 off) from the same run. Whether step_product="auto" should take the wide kernel is what it measures.

    python3 benchmarks/probe_wide_product.py --out /tmp/probe [--precision bfloat16]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_fused_ahead import compare, write_rows  # noqa: E402
from probe_fused_programmatic import CONFIGS  # noqa: E402

from engine.bench.timing import time_runs, torch_timer  # noqa: E402


def cudnn_rows(precision: str, configs) -> list[dict]:
    """cuDNN's LSTM and GRU (torch, TF32 off, inputs and weights in the mode) at each config: median ms."""
    try:
        import torch
    except ImportError:
        return []
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[precision]
    rows = []
    for config, I, H, L, T, B in configs:
        for cell, module in (("lstm", torch.nn.LSTM), ("gru", torch.nn.GRU)):
            layer = module(I, H, L).cuda().to(dtype)
            layer.flatten_parameters()
            x = torch.randn(T, B, I, device="cuda", dtype=dtype)
            with torch.no_grad():
                ms = time_runs(lambda _: layer(x), torch_timer, buffers=1, warmup=3, reps=11).median_ms
            rows.append({"cell": cell, "config": config, "precision": precision, "case": "cuDNN", "ms": ms})
            print(f"{cell:4s} {config:6s} {precision:9s} cuDNN {ms:7.3f} ms (TF32 off)", flush=True)
    return rows


def main() -> None:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--precision", action="append", default=None, help="bfloat16, float16 (default: bfloat16)")
    ap.add_argument("--config", action="append", default=None, help="of probe_fused_programmatic.CONFIGS (blogA)")
    args = ap.parse_args()
    configs = [c for c in CONFIGS if c[0] in (args.config or ["blogA"])]
    variants = {"cublasLt": dict(step_product="cublaslt"), "wgmma": dict(step_product="wgmma")}
    rows = []
    for precision in args.precision or ["bfloat16"]:
        rows += compare(cp, variants, [precision], configs, lambda precision: 3e-2)
        rows += cudnn_rows(precision, configs)
    write_rows(cp, args.out, "probe_wide_product.json", rows)


if __name__ == "__main__":
    main()
