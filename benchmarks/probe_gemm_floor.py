"""The GEMM floor of a training step: the step's matrix products alone, timed through cuBLAS (fp32, TF32 off), with no
elementwise kernel, no dependency between steps and no host work in between. A lower bound for any schedule that
computes the same products in fp32, to compare cells by their arithmetic.

    CUPY_TF32=0 python benchmarks/probe_gemm_floor.py --preset lstm --preset lstm_fgr --config mid --out /tmp/floor

Per (cell, config) the products of one layer are read from the training plan's sizes (see `products`):
  - per step, forward and backward, the recurrent GEMM (M = B rows), timed with the L layers' products side by side on
    L streams (a wavefront diagonal with every layer busy), then T of them in a row: T + L - 1 diagonals a direction,
    counted as T full ones plus L - 1 of one product alone;
  - hoisted, once a layer: the input projection, the input adjoint and the weight gradients (M = T x B rows).
The floor is their sum. Inputs are random normal (never zeros); one product of each shape is checked against float64
on a slice of rows before timing; times are medians of CUDA-event intervals after warm-up.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from engine.bench.configs import parse_configs  # noqa: E402

# Recurrent blocks (H x H units) a layer-step reads, and the states side by side in its stacked operand (K = states x H).
# lstm: R_{i,f,z,o} h -> 4 blocks, K = H. lstm_fgr (Greff et al. 2017, "LSTM: A Search Space Odyssey", FGR): the
# gates also read the previous i, f, o: K = 4H; 13 of the grid's 16 blocks are nonzero (engine/autodiff stack grid).
CELLS = {
    "lstm": {"gates": 4, "states": 1, "blocks": 4},
    "lstm_fgr": {"gates": 4, "states": 4, "blocks": 13},
    "gru_cho": {"gates": 3, "states": 1, "blocks": 3},
}


def products(cell: str, cfg) -> dict:
    """(M, N, K) of each product a layer does in a training step, by phase."""
    c = CELLS[cell]
    B, H, T = cfg.batch, cfg.hidden_size, cfg.steps
    gates, k_state = c["gates"] * H, c["states"] * H
    rows = T * B
    return {
        "step_forward": (B, gates, k_state),        # the stacked states x the weight grid
        "step_backward": (B, k_state, gates),       # d(gates) x grid^T: the states' adjoints
        "input_projection": (rows, gates, cfg.input_size),
        "input_adjoint": (rows, cfg.input_size, gates),
        "grad_input_weights": (cfg.input_size, gates, rows),
        "grad_recurrent_weights": (k_state, gates, rows),
    }


def time_streams(cp, shape, streams: int, repeats: int, warmup: int = 3, samples: int = 7) -> float:
    """Median ms of `repeats` rounds, each round one product on every one of `streams` streams side by side, the
    rounds captured into one CUDA graph (no host time between products). Each product is the faster of cuBLAS's
    plain SGEMM and the engine's K split (cublas.split_k parts, strided batch; the sum is left out: the engine's
    kernel after the GEMM does it)."""
    from engine.autodiff.cublas import Sgemm, split_k
    M, N, K = shape
    rng = cp.random.default_rng(1)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    splits = split_k(M, N, K, sms)
    a = [rng.standard_normal((M, K), dtype=cp.float32) for _ in range(streams)]
    b = [rng.standard_normal((K, N), dtype=cp.float32) for _ in range(streams)]
    c = [cp.full((splits, M, N), cp.nan, dtype=cp.float32) for _ in range(streams)]
    sgemms = [Sgemm(cp) for _ in range(streams)]

    def product(i: int, split: bool) -> None:
        if split:
            sgemms[i].split(a[i].data.ptr, K, b[i].data.ptr, N, c[i].data.ptr, M, N, K, splits, False)
        else:
            sgemms[i](a[i].data.ptr, K, b[i].data.ptr, N, c[i].data.ptr, N, M, N, K, False, False)

    rows = min(M, 8)
    want = a[0][:rows].get().astype(np.float64) @ b[0].get().astype(np.float64)
    for split in (False, True) if splits > 1 else (False,):
        c[0].fill(cp.nan)
        sgemms[0].bind(cp.cuda.get_current_stream().ptr)
        product(0, split)
        got = c[0][:, :rows].sum(axis=0) if split else c[0][0, :rows]
        err = float(np.max(np.abs(got.get() - want)) / (np.max(np.abs(want)) + 1e-30))
        if not err < 1e-4:
            raise SystemExit(f"product {shape} (split {split}): relative error {err:.2e} against float64")
    best = None
    for split in (False, True) if splits > 1 else (False,):
        main = cp.cuda.Stream(non_blocking=True)
        side = [cp.cuda.Stream(non_blocking=True) for _ in range(streams)]
        with main:
            main.begin_capture()
            try:
                fork = cp.cuda.Event(disable_timing=True)
                fork.record(main)
                for s in side:
                    s.wait_event(fork)
                for r in range(repeats):
                    for i, s in enumerate(side):
                        sgemms[i].bind(s.ptr)
                        product(i, split)
                for s in side:
                    done = cp.cuda.Event(disable_timing=True)
                    done.record(s)
                    main.wait_event(done)
            finally:
                graph = main.end_capture()
        times = []
        for sample in range(warmup + samples):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(main)
            graph.launch(main)
            end.record(main)
            end.synchronize()
            if sample >= warmup:
                times.append(cp.cuda.get_elapsed_time(start, end))
        ms = float(np.median(times))
        best = ms if best is None else min(best, ms)
    return best


def floor(cp, cell: str, cfg) -> dict:
    L, T = cfg.num_layers, cfg.steps
    p = products(cell, cfg)
    out = {"cell": cell, "config": cfg.name, "products": {k: list(v) for k, v in p.items()}, "ms": {}}
    for phase in ("step_forward", "step_backward"):
        diag = time_streams(cp, p[phase], L, T) / T         # one diagonal, every layer busy
        alone = time_streams(cp, p[phase], 1, T) / T
        out["ms"][phase + "_diagonal"] = diag
        out["ms"][phase + "_alone"] = alone
        out["ms"][phase] = T * diag + (L - 1) * alone
    hoisted = 0.0
    for phase in ("input_projection", "input_adjoint", "grad_input_weights", "grad_recurrent_weights"):
        ms = time_streams(cp, p[phase], 1, 1)
        out["ms"][phase] = ms * L
        hoisted += ms * L
    out["ms"]["hoisted"] = hoisted
    out["ms"]["floor"] = out["ms"]["step_forward"] + out["ms"]["step_backward"] + hoisted
    # A schedule that skipped the grid's zero blocks would do this share of the recurrent products (dense here).
    c = CELLS[cell]
    dense_share = c["blocks"] / (c["gates"] * c["states"])
    recurrent = out["ms"]["step_forward"] + out["ms"]["step_backward"] + out["ms"]["grad_recurrent_weights"]
    out["ms"]["floor_without_zero_blocks"] = out["ms"]["floor"] - (1 - dense_share) * recurrent
    flops = 0
    for phase, (M, N, K) in p.items():
        count = T * L if phase.startswith("step") else L
        dense = 2 * M * N * K * count
        flops += dense
    out["gflop_computed"] = flops / 1e9
    out["tflops_at_floor"] = flops / (out["ms"]["floor"] * 1e-3) / 1e12
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", action="append", choices=sorted(CELLS), help="cell (repeatable; default lstm, lstm_fgr)")
    ap.add_argument("--config", action="append", help="anchor name (repeatable; default mid, blogB)")
    ap.add_argument("--out", help="folder for floor.json")
    args = ap.parse_args(argv)
    if os.environ.get("CUPY_TF32", "0") != "0":
        raise SystemExit("CUPY_TF32 is set: the floor is for fp32 products; run with CUPY_TF32=0")
    import cupy as cp
    cells = args.preset or ["lstm", "lstm_fgr"]
    configs = parse_configs(args.config or ["mid", "blogB"])
    square = time_streams(cp, (8192, 8192, 8192), 1, 1)
    peak = 2 * 8192 ** 3 / (square * 1e-3) / 1e12
    rows = [floor(cp, cell, cfg) for cfg in configs for cell in cells]
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"device {name}; cuBLAS fp32 (TF32 off) 8192^3: {square:.2f} ms = {peak:.1f} TFLOP/s")
    print("| cell | config | step fwd ms | step bwd ms | hoisted ms | floor ms | without zero blocks ms | GFLOP | TFLOP/s at floor |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ms = r["ms"]
        print(f"| {r['cell']} | {r['config']} | {ms['step_forward']:.2f} | {ms['step_backward']:.2f} | "
              f"{ms['hoisted']:.2f} | {ms['floor']:.2f} | {ms['floor_without_zero_blocks']:.2f} | {r['gflop_computed']:.0f} | {r['tflops_at_floor']:.1f} |")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "floor.json").write_text(json.dumps(
            {"device": name, "square_8192_ms": square, "square_tflops": peak, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
