"""A 16-bit LSTM layer whose weight outgrows the chip, all its steps in one launch (kernels/mode_persist.cu; issue #34,
bf16 / fp16 at blogA; NOTES 2026-11-28 12:16), against cuDNN in the same mode and the pieces the engine's fused
backend spends a step on.

For one LSTM layer (blogA: I = H = 2560, B = 64, T = 200; and H = 640, B = 16, T = 64 as a second check), in each
of the kernel's entries (32 units a block, also with the hardware's exp and tanh; 20 units a block): the
kernel's outputs against a float64 run of the same rounded values (weights and each step's h in the mode, the gates'
input from a random projection, c and the math in float64), poisoned first; then its time (the counter and h's first
version zeroed before each launch, inside the timing; median of 11 after warm-up, CUDA events), the projection's
time on cublasLt (the engine's: x (T B, I) by W_x, fp32 out), and cuDNN's whole layer through torch (TF32 off;
bf16 / fp16 inputs). sm_90 only.

    python3 benchmarks/probe_mode_persist.py --out /tmp/probe [--precision bfloat16]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_fused_ahead import write_rows  # noqa: E402
from step_chain import graph_ms  # noqa: E402

from engine.bench.timing import time_runs, torch_timer  # noqa: E402
from engine.schedules import wgmma_products  # noqa: E402
from engine.schedules.base import chunked  # noqa: E402
from engine.schedules.cublaslt import LtProjection, Product  # noqa: E402
from engine.schedules.project import LT_OPERANDS, operand_dtype, round_into  # noqa: E402

CASES = (("blogA", 2560, 64, 200), ("check", 640, 16, 64))
# mode_persist.cu's entries: (units a block, slots, the hardware approximations of exp and tanh)
KERNELS = {"bfloat16": ((32, 8, False), (32, 8, True), (20, 10, False)), "float16": ((32, 8, False), (20, 10, False))}


def permutation(H: int, UB: int) -> np.ndarray:
    """Row p of the permuted (4H, .) weight is row perm[p] of the gate-major one: block b's row r is gate r % 4 of unit
    UB b + r // 4 (kernels/mode_persist.cu)."""
    p = np.arange(4 * H)
    block, rest = p // (4 * UB), p % (4 * UB)
    return (rest % 4) * H + block * UB + rest // 4


def values(cupy, bits, precision: str):
    """The mode's 16-bit values as float64."""
    if precision == "float16":
        return bits.view(cupy.float16).astype(cupy.float64)
    return (bits.astype(cupy.uint32) << 16).view(cupy.float32).astype(cupy.float64)


def reference(cupy, xp, wr, H: int, precision: str):
    """float64 LSTM over the rounded weight (gate-major values wr), h rounded to the mode as it enters each product."""
    T, B, _ = xp.shape
    c, hr, out = cupy.zeros((B, H)), cupy.zeros((B, H)), cupy.empty((T, B, H))
    dtype = operand_dtype(cupy, precision)
    for t in range(T):
        g = xp[t].astype(cupy.float64) + hr @ wr.T
        i, f, z, o = (g[:, k * H:(k + 1) * H] for k in range(4))
        sig = lambda v: 1.0 / (1.0 + cupy.exp(-v))      # noqa: E731
        c = sig(f) * c + sig(i) * cupy.tanh(z)
        h = sig(o) * cupy.tanh(c)
        out[t] = h
        hr = values(cupy, round_into(cupy, h.astype(cupy.float32), cupy.empty((B, H), dtype=dtype), precision),
                    precision)
    return out


class Launch:
    """One launch of the kernel, its counter and h's first version zeroed first (graph_ms's .launch)."""

    def __init__(self, function, grid, smem, args, counter, hbuf):
        self.function, self.grid, self.smem, self.args = function, grid, smem, args
        self.counter, self.hbuf = counter, hbuf

    def launch(self, stream):
        with stream:
            self.counter.fill(0)
            self.hbuf[0].fill(0)
            self.function(self.grid, (288,), self.args, shared_mem=self.smem)     # two warpgroups, the producer


def phases(cupy, run, stream, T: int) -> dict:
    """One launch with the kernel's trace on: block 0's median time (us) in each part of a step (steps 1 .. T - 2),
    and the median spread of the blocks' arrivals a step."""
    blocks = run.grid[0]
    trace = cupy.zeros(6 * T + T * blocks, dtype=cupy.uint64)
    run.args = run.args[:-2] + (trace, run.args[-1])
    run.launch(stream)
    stream.synchronize()
    run.args = run.args[:-2] + (np.uint64(0), run.args[-1])
    raw = cupy.asnumpy(trace).astype(np.int64)
    t = raw[:6 * T].reshape(T, 6)[1:-1]
    arrivals = raw[6 * T:].reshape(T, blocks)[1:-1]
    parts = {"counter to first chunk": t[:, 1] - t[:, 0], "product": t[:, 2] - t[:, 1],
             "math": t[:, 3] - t[:, 2], "stores": t[:, 4] - t[:, 3], "fence": t[:, 5] - t[:, 4],
             "arrival to counter": t[1:, 0] - t[:-1, 5], "arrivals' spread": arrivals.max(1) - arrivals.min(1),
             "last arrival to counter": t[1:, 0] - arrivals[:-1].max(1), "step": t[1:, 5] - t[:-1, 5]}
    return {k: float(np.median(v)) / 1e3 for k, v in parts.items()}


def cudnn_ms(precision: str, H: int, B: int, T: int) -> float | None:
    """cuDNN's LSTM layer (torch, TF32 off, inputs and weights in the mode): median ms, None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[precision]
    lstm = torch.nn.LSTM(H, H).cuda().to(dtype)
    x = torch.randn(T, B, H, device="cuda", dtype=dtype)
    lstm.flatten_parameters()
    with torch.no_grad():
        return time_runs(lambda _: lstm(x), torch_timer, buffers=1, warmup=3, reps=11).median_ms


class Case:
    """One layer's operands: the rounded weight, the projection's rows, h's two versions, the outputs, the counter,
    and the float64 run; launch() permutes the weight and projection as a kernel of UB units a block takes them."""

    def __init__(self, cupy, precision: str, H: int, B: int, T: int):
        rng = np.random.default_rng(0)
        self.H, self.B, self.T = H, B, T
        self.w = cupy.asarray((rng.standard_normal((4 * H, H)) / H ** 0.5).astype(np.float32))
        self.xp = cupy.asarray((0.5 * rng.standard_normal((T, B, 4 * H))).astype(np.float32))
        self.dtype = operand_dtype(cupy, precision)
        self.bits = round_into(cupy, self.w, cupy.empty((4 * H, H), dtype=self.dtype), precision)
        self.hbuf = wgmma_products.tiled_buffer(cupy, 2, B, H, cupy.uint16, poison=False)
        self.out = cupy.full((T, B, H), cupy.nan, dtype=cupy.float32)
        self.counter = cupy.zeros(1, dtype=cupy.uint32)
        self.expected = reference(cupy, self.xp, values(cupy, self.bits, precision), H, precision)
        self.layouts: dict = {}

    def layout(self, cupy, UB: int):
        """(weight, projection) for UB units a block: rows permuted (permutation), the weight chunked in blocks of
        4 UB rows (base.chunked, as kernels/mode_persist.cu reads a chunk: one copy)."""
        if UB not in self.layouts:
            perm = cupy.asarray(permutation(self.H, UB))
            self.layouts[UB] = (chunked(cupy, self.bits[perm], 4 * UB, 64),
                                cupy.ascontiguousarray(self.xp[:, :, perm]))
        return self.layouts[UB]

    def launch(self, cupy, precision: str, kernel: tuple, primary: int) -> Launch:
        UB, stages, fast = kernel
        name = f"mode_persist_{precision}_{UB}_{stages}{'_fast' if fast else ''}"
        weight, xperm = self.layout(cupy, UB)
        slot = 4 * UB * 128 + wgmma_products.TILE_BYTES                 # a chunk's weight rows, then h's tile
        smem = 1024 + stages * slot + 16 * stages + 1024 * UB             # the sums' exchange (it stages h too)
        function = wgmma_products.ring_kernel(cupy, "mode_persist.cu", name, smem)
        args = (xperm, weight, self.hbuf, self.out, self.counter, np.int32(self.B), np.int32(self.H),
                np.int32(self.T), np.uint32(primary), np.uint32(weight.nbytes), np.uint64(0), np.int32(0))
        return Launch(function, (self.H // UB,), smem, args, self.counter, self.hbuf)

    def error(self, cupy, run: Launch, stream) -> float:
        """The outputs of one launch (poisoned first) against the float64 run: the max absolute difference."""
        self.out.fill(cupy.nan)
        run.launch(stream)
        stream.synchronize()
        return float(cupy.max(cupy.abs(self.out.astype(cupy.float64) - self.expected)))


def timed(cupy, stream, run: Launch, T: int, floors: bool) -> list[dict]:
    """The launch's median ms and block 0's phases; with floors, the same without the copies of h, of the weight, of
    both after step 0 (times only: the results are then wrong)."""
    rows = []
    for skip, what in ((0, None),) + (((1, "no h copies"), (2, "no weight copies"), (3, "neither")) if floors else ()):
        run.args = run.args[:-1] + (np.int32(skip),)
        ms = graph_ms(cupy, stream, run)
        rows.append({"skip": what, "ms": ms, "us_step": 1e3 * ms / T, "phases_us": phases(cupy, run, stream, T)})
    run.args = run.args[:-1] + (np.int32(0),)
    return rows


def baselines(cupy, lt, stream, case: Case, precision: str) -> tuple[float, float | None]:
    """The projection's ms on cublasLt (x (T B, I) by W_x, fp32 out, as the engine's fused backend makes it) and
    cuDNN's whole layer (None without torch)."""
    T, B, H = case.T, case.B, case.H
    data, compute = LT_OPERANDS[precision]
    rng = np.random.default_rng(1)
    x = round_into(cupy, cupy.asarray(rng.uniform(-1, 1, (T * B, H)).astype(np.float32)),
                   cupy.empty((T * B, H), dtype=case.dtype), precision)
    wx = round_into(cupy, case.w, cupy.empty((4 * H, H), dtype=case.dtype), precision)
    proj = cupy.empty((T * B, 4 * H), dtype=cupy.float32)

    class Projection:
        def launch(self, s):
            with s:
                if not lt.product(Product.dense(T * B, 4 * H, H), x.data.ptr, wx.data.ptr, proj.data.ptr, data,
                                  compute):
                    raise SystemExit("cublasLt offered no algorithm for the projection")
    return graph_ms(cupy, stream, Projection()), cudnn_ms(precision, H, B, T)


def main() -> None:
    import cupy  # deferred: CuPy is optional (no GPU in CI)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--share", type=float, action="append", default=None,
                    help="also each block's weight rows this share evict_last (default 0.7)")
    ap.add_argument("--sanitize", action="store_true",
                    help="H = 640, B = 16, T = 8, each kernel checked once, nothing timed: for compute-sanitizer")
    ap.add_argument("--floors", action="store_true",
                    help="also each run without the copies of h, of the weight, of both (times only: results wrong)")
    ap.add_argument("--precision", action="append", default=None, help="bfloat16, float16 (default: both)")
    args = ap.parse_args()
    if not wgmma_products.wgmma_capable(cupy):
        raise SystemExit("kernels/mode_persist.cu runs on sm_90 (H100, H200) only")
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    lt, stream, rows = LtProjection.on_current_device(cupy), cupy.cuda.Stream(non_blocking=True), []
    for precision in args.precision or ["bfloat16", "float16"]:
        for config, H, B, T in (("sanitize", 640, 16, 8),) if args.sanitize else CASES:
            case = Case(cupy, precision, H, B, T)
            for kernel in KERNELS[precision]:
                UB = kernel[0]
                if H % UB or H // UB > sms or (H // 64) % 2:
                    raise SystemExit(f"H = {H}: {UB} units a block in at most {sms} blocks, an even number of chunks")
                region = 4 * UB * 2 * H                                  # each block's rows: its evict_last share
                entry = f"{UB} units, {kernel[1]} slots{', fast' if kernel[2] else ''}"
                for primary in sorted({0} | {int(f * region) // 1024 * 1024 for f in args.share or [0.7]}):
                    run = case.launch(cupy, precision, kernel, primary)
                    error = case.error(cupy, run, stream)
                    label = f"{precision:8s} {config:6s} {entry:22s} evict_last {primary / 1024:4.0f} KB a block"
                    if not error <= 2e-2:
                        raise SystemExit(f"{label}: max error {error:.3g} against float64: wrong")
                    if args.sanitize:
                        print(f"{label}  max error {error:.2e}", flush=True)
                        continue
                    for row in timed(cupy, stream, run, T, args.floors):
                        rows.append({"precision": precision, "config": config, "H": H, "B": B, "T": T,
                                     "kernel": entry, "primary_kb": primary / 1024, "error": error, **row})
                        head = (f"{label}  {row['ms']:7.3f} ms ({row['us_step']:6.2f} us a step)  max error "
                                f"{error:.2e}" if row["skip"] is None else
                                f"    what if {row['skip']} after step 0 (results wrong): {row['us_step']:6.2f} us")
                        print(head + "\n    block 0, median us a step: " + ", ".join(
                            f"{k} {v:.2f}" for k, v in row["phases_us"].items()), flush=True)
            if not args.sanitize:
                projection, cudnn = baselines(cupy, lt, stream, case, precision)
                rows.append({"precision": precision, "config": config, "projection_ms": projection, "cudnn_ms": cudnn})
                print(f"{precision:8s} {config:6s} projection (cublasLt) {projection:.3f} ms, cuDNN layer "
                      f"{cudnn if cudnn is None else round(cudnn, 3)} ms (TF32 off)", flush=True)
    write_rows(cupy, args.out, "probe_mode_persist.json", rows)


if __name__ == "__main__":
    main()
