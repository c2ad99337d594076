"""A recurrent step's GEMM on cuBLAS alone, chained over T steps in one CUDA graph (issue #34: what a schedule that
hands each step's product to cuBLAS could reach at `large` and `blogA`, where the weights do not fit on chip).

Each step multiplies h (B x H) by the recurrent weight (H x G*H, G gates) in the mode's storage and writes the
gates in fp32; the next step's h is a tanh of the first H gate columns (one elementwise kernel, so the chain is a real
dependency and each step pays one kernel launch beside its GEMM, as a two-launch step would). T steps are captured
into one torch CUDA graph and replayed; times are medians of CUDA-event intervals after warm-up. Inputs are random
normal; one step's product is checked against float64 first. The weights of every step are the same tensor, so this
is the best case for L2 (a real layer reads the same weight every step too).

    python3 benchmarks/probe_step_cublas.py --out /tmp/probe
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

CASES = [  # name, H, B, T, gates
    ("lstm blogA", 2560, 64, 200, 4),
    ("gru blogA", 2560, 64, 200, 3),
    ("lstm large (a layer)", 1024, 128, 100, 4),
    ("gru large (a layer)", 1024, 128, 100, 3),
    ("lstm 512 B=16", 512, 16, 1024, 4),
]


def chain(torch, h0, w, steps: int, out_dtype):
    h = h0
    for _ in range(steps):
        g = torch.matmul(h, w, out_dtype=out_dtype) if out_dtype is not None else torch.matmul(h, w)
        h = torch.tanh(g[:, : h0.shape[1]]).to(h0.dtype)
    return h


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for name, H, B, T, G in CASES:
        for mode in ("bf16", "fp16", "tf32", "fp32"):
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode, torch.float32)
            torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            gen = torch.Generator(device="cuda").manual_seed(0)
            w = (torch.randn(H, G * H, device="cuda", generator=gen) / H ** 0.5).to(dtype)
            h0 = torch.randn(B, H, device="cuda", generator=gen).to(dtype)
            out_dtype = torch.float32 if dtype != torch.float32 else None
            try:
                g = torch.matmul(h0, w, out_dtype=out_dtype) if out_dtype is not None else torch.matmul(h0, w)
            except TypeError:
                out_dtype = None
                g = torch.matmul(h0, w).float()
            ref = h0.double() @ w.double()
            err = float(((g.double() - ref).abs().max() / ref.abs().max()).item())
            torch.cuda.synchronize()
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for _ in range(2):
                    chain(torch, h0, w, 3, out_dtype)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                hT = chain(torch, h0, w, T, out_dtype)
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize()
            times = []
            for _ in range(args.reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                graph.replay()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            assert bool(torch.isfinite(hT).all()), "non-finite h"
            ms = statistics.median(times)
            weight_mb = H * G * H * w.element_size() / 1e6
            rows.append({"case": name, "mode": mode, "H": H, "B": B, "T": T, "gates": G, "ms": ms,
                         "us_per_step": 1e3 * ms / T, "weight_MB": weight_mb,
                         "GB_per_s_weight": weight_mb * 1e-3 / (ms / T * 1e-3), "step_rel_err": err})
            del graph
    torch.backends.cuda.matmul.allow_tf32 = False
    print("| case | mode | ms (T steps) | us a step | weight MB | weight GB/s | one step's error |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['mode']} | {r['ms']:.3f} | {r['us_per_step']:.2f} | {r['weight_MB']:.1f} | "
              f"{r['GB_per_s_weight']:.0f} | {r['step_rel_err']:.1e} |")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_step_cublas.json").write_text(json.dumps(
            {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
             "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
