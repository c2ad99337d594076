"""The GEMM floor of a training step: the step's matrix products alone, as the fused training plan
(engine/autodiff/fused_plan.py) issues them, timed through cuBLAS (fp32, TF32 off) with no elementwise kernel and no
host work in between. A cell's step cannot be faster than its products on cuBLAS unless its GEMMs beat cuBLAS: the
floor says how far a cell's step is from its arithmetic, and compares cells by it.

    CUPY_TF32=0 python benchmarks/probe_gemm_floor.py --preset lstm --preset lstm_fgr --config mid --out /tmp/floor

The products of each layer (engine.bench.flops.training_products, from the training plan at the layer's sizes):
  - each step, forward and backward, the step's GEMMs in order (M = B rows; several where a step has several
    stages, one after another); the L layers side by side on L streams (a wavefront diagonal with every layer busy),
    T rounds in a row: T + L - 1 diagonals a direction, counted as T full ones plus L - 1 of one layer alone;
  - once a layer: the hoisted GEMMs (the input projection, the input adjoint, M = T x B) and the weight and bias
    gradients (plan.grad_gemms: M = the operand's width, N = the gradients' rows, K = T x B).
Each phase is captured into one CUDA graph and replayed; a phase's time is the faster of cuBLAS's plain SGEMMs and
the engine's K split (cublas.split_k, a strided batch; the sum of the parts is left out: the engine's kernel after
the GEMM does it). Inputs are random normal (never zeros); every product shape is checked against float64 on a few
rows first; times are medians of CUDA-event intervals after warm-up.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import engine  # noqa: E402
from engine.bench.configs import parse_configs  # noqa: E402
from engine.bench.flops import training_product_flops, training_products  # noqa: E402


class Products:
    """Operands and outputs of a set of products on the GPU, the engine's cuBLAS handle a stream."""

    def __init__(self, cp, lanes: list[list[tuple]], streams: int):
        from engine.autodiff.cublas import Sgemm, split_k
        rng = cp.random.default_rng(1)
        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        self.cp, self.lanes = cp, lanes
        self.splits = [[split_k(M, N, K, sms) for M, N, K in lane] for lane in lanes]
        self.a = [[rng.standard_normal((M, K), dtype=cp.float32) for M, N, K in lane] for lane in lanes]
        self.b = [[rng.standard_normal((K, N), dtype=cp.float32) for M, N, K in lane] for lane in lanes]
        self.c = [[cp.full((s, M, N), cp.nan, dtype=cp.float32) for s, (M, N, K) in zip(sp, lane)]
                  for sp, lane in zip(self.splits, lanes)]
        self.sgemms = [Sgemm(cp) for _ in range(streams)]

    def issue(self, lane: int, j: int, split: bool, sgemm) -> None:
        M, N, K = self.lanes[lane][j]
        a, b, c, s = self.a[lane][j], self.b[lane][j], self.c[lane][j], self.splits[lane][j]
        if split and s > 1:
            sgemm.split(a.data.ptr, K, b.data.ptr, N, c.data.ptr, M, N, K, s, False)
        else:
            sgemm(a.data.ptr, K, b.data.ptr, N, c.data.ptr, N, M, N, K, False, False)

    def check(self) -> None:
        """Every product, both ways, against float64 on its first rows (a NaN-filled output that stayed shows)."""
        cp = self.cp
        sgemm = self.sgemms[0]
        sgemm.bind(cp.cuda.get_current_stream().ptr)
        for lane, shapes in enumerate(self.lanes):
            for j, (M, N, K) in enumerate(shapes):
                rows = min(M, 4)
                want = self.a[lane][j][:rows].get().astype(np.float64) @ self.b[lane][j].get().astype(np.float64)
                for split in (False, True):
                    c = self.c[lane][j]
                    c.fill(cp.nan)
                    self.issue(lane, j, split, sgemm)
                    got = (c[:, :rows].sum(axis=0) if split and self.splits[lane][j] > 1 else c[0, :rows]).get()
                    err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))
                    if not err < 1e-4:
                        raise SystemExit(f"product {(M, N, K)} (split {split}): relative error {err:.2e} "
                                         "against float64; refusing to time it")


def time_lanes(cp, lanes: list[list[tuple]], rounds: int, warmup: int = 3, samples: int = 7) -> float:
    """Median ms of `rounds` rounds; each round, lane i's products in order on stream i, the lanes side by side;
    the faster of plain and split GEMMs, all rounds captured into one CUDA graph."""
    work = Products(cp, lanes, len(lanes))
    work.check()
    best = None
    for split in (False, True):
        main = cp.cuda.Stream(non_blocking=True)
        side = [cp.cuda.Stream(non_blocking=True) for _ in lanes]
        with main:
            main.begin_capture()
            try:
                fork = cp.cuda.Event(disable_timing=True)
                fork.record(main)
                for s in side:
                    s.wait_event(fork)
                for _ in range(rounds):
                    for i, s in enumerate(side):
                        work.sgemms[i].bind(s.ptr)
                        for j in range(len(lanes[i])):
                            work.issue(i, j, split, work.sgemms[i])
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


def floor(cp, name: str, cfg) -> dict:
    L, T = cfg.num_layers, cfg.steps
    network = engine.Network(engine.preset(name).cell, cfg.input_size, cfg.hidden_size, L)
    p = training_products(network, T, cfg.batch)
    out = {"cell": name, "config": cfg.name, "products": p, "ms": {}}
    for phase in ("step_forward", "step_backward"):
        diagonal = time_lanes(cp, p[phase], T) / T            # every layer busy
        alone = time_lanes(cp, p[phase][:1], T) / T
        out["ms"][phase] = T * diagonal + (L - 1) * alone
    for phase in ("hoisted", "gradients"):                    # once a layer, one after another
        out["ms"][phase] = time_lanes(cp, [[shape for layer in p[phase] for shape in layer]], 1)
    out["ms"]["floor"] = sum(out["ms"][phase] for phase in ("step_forward", "step_backward", "hoisted", "gradients"))
    flops = training_product_flops(p, T)
    out["gflop"] = flops / 1e9
    out["tflops_at_floor"] = flops / (out["ms"]["floor"] * 1e-3) / 1e12
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", action="append", help="preset (repeatable; default lstm, lstm_fgr; 'all': every one)")
    ap.add_argument("--config", action="append", help="anchor name (repeatable; default mid, blogB)")
    ap.add_argument("--out", help="folder for floor.json")
    args = ap.parse_args(argv)
    if os.environ.get("CUPY_TF32", "0") != "0":
        raise SystemExit("CUPY_TF32 is set: the floor is for fp32 products; run with CUPY_TF32=0")
    import cupy as cp
    names = args.preset or ["lstm", "lstm_fgr"]
    if names == ["all"]:
        names = sorted(engine.presets())
    configs = parse_configs(args.config or ["mid", "blogB"])
    square = time_lanes(cp, [[(8192, 8192, 8192)]], 1)
    peak = 2 * 8192 ** 3 / (square * 1e-3) / 1e12
    rows = [floor(cp, name, cfg) for cfg in configs for name in names]
    device = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"device {device}; cuBLAS fp32 (TF32 off) 8192^3: {square:.2f} ms = {peak:.1f} TFLOP/s")
    print("| cell | config | step fwd ms | step bwd ms | hoisted ms | gradients ms | floor ms | GFLOP | TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ms = r["ms"]
        print(f"| {r['cell']} | {r['config']} | {ms['step_forward']:.2f} | {ms['step_backward']:.2f} | "
              f"{ms['hoisted']:.2f} | {ms['gradients']:.2f} | {ms['floor']:.2f} | {r['gflop']:.0f} | "
              f"{r['tflops_at_floor']:.1f} |")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "floor.json").write_text(json.dumps(
            {"device": device, "square_8192_ms": square, "square_tflops": peak, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
