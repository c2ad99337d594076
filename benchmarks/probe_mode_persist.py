"""A 16-bit LSTM or GRU layer whose weight outgrows the chip, all its steps in one launch (kernels/mode_persist.cu;
issue #34, bf16 / fp16 at blogA; NOTES 2026-11-28 12:16, 13:27, 13:51 and 14:51), against cuDNN in the same mode and
the pieces the engine's fused backend spends a step on.

For one layer (blogA: I = H = 2560, B = 64, T = 200; and H = 640, B = 16, T = 64 as a second check), in each of the
kernel's entries (32 units a block; the LSTM's math on the accumulators, also with the hardware's exp and tanh, and
from the step's sums staged in shared memory; the GRU's from staged sums; each fed by one producer thread or by two,
"duo", or three, "trio"): the kernel's outputs against a float64
run of the same rounded values (weights, the layer's input and each step's h in the mode, the gates' input the
projection x W_x^T on cublasLt, the states and the math in float64; the GRU in PyTorch's form, b_hn inside r's
product), poisoned first; then its time (the counter and h's first version zeroed before each launch, inside the
timing; median of 11 after warm-up, CUDA events). Each entry runs with the projection made before the launch, and
with it beside the kernel (Overlapped: pieces on a second stream, on the SMs the kernel leaves, each raising a count
the kernel waits on; that projection's buffer poisoned too; with --first also the whole projection made first on the
kernel's stream, timed with it). Then the projection's time alone on cublasLt (x (T B, I)
by W_x, fp32 out, as the engine's fused backend makes it), and cuDNN's whole layer through torch (TF32 off; bf16 /
fp16 inputs). A wrong entry is reported and not timed, and the probe then exits non-zero. sm_90 only.

    python3 benchmarks/probe_mode_persist.py --out /tmp/probe [--precision bfloat16] [--feed duo] [--plain] [--first]
    [--floors] [--skip 7] [--sanitize]
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
from engine.codegen.cuda import device_attribute  # noqa: E402
from engine.schedules import wgmma_products  # noqa: E402
from engine.schedules.base import chunked  # noqa: E402
from engine.schedules.cublaslt import LtProjection, Product  # noqa: E402
from engine.schedules.project import LT_OPERANDS, operand_dtype, round_into  # noqa: E402

CASES = (("blogA", 2560, 64, 200), ("check", 640, 16, 64))
# mode_persist.cu's entries a cell: (units a block, slots, the hardware approximations of exp and tanh, the cells'
# math from sums staged in shared memory, feed: "" one producer thread, "duo" two (the weight's and h's), "trio"
# three (the weight's even and odd chunks, h's); a warp a producer past the 256 MMA threads)
KERNELS = {("bfloat16", "lstm"): ((32, 8, False, False, ""), (32, 8, False, False, "duo"), (32, 8, False, False, "trio"),
                                  (32, 8, True, False, ""), (32, 8, False, True, ""), (32, 8, False, True, "duo")),
           ("float16", "lstm"): ((32, 8, False, False, ""), (32, 8, False, False, "duo"), (32, 8, False, False, "trio"),
                                 (32, 8, False, True, "")),
           ("bfloat16", "gru"): ((32, 8, False, True, ""), (32, 8, False, True, "duo"), (32, 8, False, True, "trio")),
           ("float16", "gru"): ((32, 8, False, True, ""), (32, 8, False, True, "duo"), (32, 8, False, True, "trio"))}
FEEDS = {"": 1, "duo": 2, "trio": 3}
GATES = {"lstm": 4, "gru": 3}
# --floors: the kernel's skip bits (kernels/mode_persist.cu) after step 0, each a run whose results are wrong
FLOORS = ((1, "no h copies"), (2, "no weight copies"), (3, "neither"), (4, "no wgmma (copies and slot handshakes)"),
          (7, "handshakes alone (no copies, no wgmma)"),
          (8, "wgmma, math and stores alone (no copies, handshakes or counter)"))
# the projection beside the kernel in pieces: (steps of the first, the most a piece), each piece twice the last
PIECES = ((10, 10), (4, 16))


def pieces(T: int, first: int, most: int) -> list[tuple[int, int]]:
    """(first step, steps) of each piece: `first` steps, then twice the last, at most `most`."""
    out, t, size = [], 0, first
    while t < T:
        out.append((t, min(size, T - t)))
        t, size = t + size, min(2 * size, most)
    return out


def permutation(H: int, UB: int, G: int = 4) -> np.ndarray:
    """Row p of the permuted (G H, .) weight is row perm[p] of the gate-major one: block b's row r is gate r % G of
    unit UB b + r // G (kernels/mode_persist.cu)."""
    p = np.arange(G * H)
    block, rest = p // (G * UB), p % (G * UB)
    return (rest % G) * H + block * UB + rest // G


def values(cupy, bits, precision: str):
    """The mode's 16-bit values as float64."""
    if precision == "float16":
        return bits.view(cupy.float16).astype(cupy.float64)
    return (bits.astype(cupy.uint32) << 16).view(cupy.float32).astype(cupy.float64)


def reference(cupy, xp, wr, H: int, precision: str, bias_n=None):
    """float64 LSTM (bias_n None) or GRU (PyTorch's form, bias_n its b_hn) over the rounded weight (gate-major values
    wr), h rounded to the mode as it enters each product."""
    T, B, _ = xp.shape
    c, h, hr, out = cupy.zeros((B, H)), cupy.zeros((B, H)), cupy.zeros((B, H)), cupy.empty((T, B, H))
    dtype = operand_dtype(cupy, precision)
    sig = lambda v: 1.0 / (1.0 + cupy.exp(-v))          # noqa: E731
    for t in range(T):
        x, s = xp[t].astype(cupy.float64), hr @ wr.T
        if bias_n is None:
            i, f, z, o = ((x + s)[:, k * H:(k + 1) * H] for k in range(4))
            c = sig(f) * c + sig(i) * cupy.tanh(z)
            h = sig(o) * cupy.tanh(c)
        else:
            r, z = (sig((x + s)[:, k * H:(k + 1) * H]) for k in range(2))
            n = cupy.tanh(x[:, 2 * H:] + r * (s[:, 2 * H:] + bias_n.astype(cupy.float64)))
            h = (1.0 - z) * n + z * h
        out[t] = h
        hr = values(cupy, round_into(cupy, h.astype(cupy.float32), cupy.empty((B, H), dtype=dtype), precision),
                    precision)
    return out


class Launch:
    """One launch of the kernel, its counter and h's first version zeroed first (graph_ms's .launch)."""

    def __init__(self, function, grid, smem, args, counter, hbuf, threads: int = 288):
        self.function, self.grid, self.smem, self.args = function, grid, smem, args
        self.counter, self.hbuf, self.threads = counter, hbuf, threads

    def launch(self, stream):
        with stream:
            self.counter.fill(0)
            self.hbuf[0].fill(0)
            # two warpgroups, the producer (duo: the weight's and h's)
            self.function(self.grid, (self.threads,), self.args, shared_mem=self.smem)


class Overlapped(Launch):
    """The kernel with the projection beside it: the kernel on `stream`, the projection's pieces (pieces()) on a
    second stream (cublasLt told to plan for the SMs the kernel leaves), each followed by mode_persist_piece_done,
    which raises the count the kernel waits on; the second stream joins `stream` at the end. The whole layer, from x
    to h, between two events on `stream`. Every kernel of the pieces runs once first: under lazy loading (CUDA's
    default) a kernel's first launch may wait for the device's running kernels (CUDA C++ Programming Guide, "Lazy
    Loading": concurrent execution), and the spinning kernel would wait for it in turn. beside=False (for
    compute-sanitizer, which runs one kernel at a time): the pieces before the kernel, on its stream."""

    def __init__(self, cupy, case, function, grid, smem, args, wx, xin, split: tuple, beside: bool = True,
                 threads: int = 288):
        super().__init__(function, grid, smem, args, case.counter, case.hbuf, threads)
        self.cupy, self.case, self.wx, self.xin, self.beside = cupy, case, wx, xin, beside
        self.split = pieces(case.T, *split)
        self.side = cupy.cuda.Stream(non_blocking=True)
        self.done = wgmma_products.ring_kernel(cupy, "mode_persist.cu", "mode_persist_piece_done", 0)
        # the SMs the kernel leaves (made first: all of them, 0)
        self.sms = max(1, device_attribute(cupy, "MultiProcessorCount") - grid[0]) if beside else 0
        with self.side:
            self.pieces()
        self.side.synchronize()

    def pieces(self) -> None:
        """The projection's pieces on the current stream, each followed by the count's raise."""
        case = self.case
        for first, steps in self.split:
            case.project(self.cupy, self.wx, self.xin, first, steps, sms=self.sms)
            self.done((1,), (1,), (case.pieces, np.uint32(steps)))

    def launch(self, stream):
        cupy, case = self.cupy, self.case
        with stream:
            case.pieces.fill(0)
            if not self.beside:
                self.pieces()
        if not self.beside:
            return super().launch(stream)
        fork, join = cupy.cuda.Event(disable_timing=True), cupy.cuda.Event(disable_timing=True)
        fork.record(stream)
        self.side.wait_event(fork)
        super().launch(stream)                        # resident first: the pieces take the SMs it leaves
        with self.side:
            self.pieces()
        join.record(self.side)
        stream.wait_event(join)


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


def cudnn_ms(precision: str, H: int, B: int, T: int, cell: str = "lstm") -> float | None:
    """cuDNN's LSTM or GRU layer (torch, TF32 off, inputs and weights in the mode): median ms, None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[precision]
    lstm = (torch.nn.GRU if cell == "gru" else torch.nn.LSTM)(H, H).cuda().to(dtype)
    x = torch.randn(T, B, H, device="cuda", dtype=dtype)
    lstm.flatten_parameters()
    with torch.no_grad():
        return time_runs(lambda _: lstm(x), torch_timer, buffers=1, warmup=3, reps=11).median_ms


class Case:
    """One layer's operands: the rounded weight, the projection's rows, h's two versions, the outputs, the counter,
    and the float64 run; launch() permutes the weight and projection as a kernel of UB units a block takes them."""

    def __init__(self, cupy, lt, precision: str, H: int, B: int, T: int, cell: str = "lstm"):
        rng = np.random.default_rng(0)
        self.H, self.B, self.T, self.lt, self.precision, self.cell = H, B, T, lt, precision, cell
        self.G = G = GATES[cell]
        self.dtype = operand_dtype(cupy, precision)
        draw = lambda shape, scale: round_into(                          # noqa: E731
            cupy, cupy.asarray((scale * rng.standard_normal(shape)).astype(np.float32)),
            cupy.empty(shape, dtype=self.dtype), precision)
        self.bits, self.wx = draw((G * H, H), H ** -0.5), draw((G * H, H), H ** -0.5)
        self.bias_n = (cupy.asarray((0.1 * rng.standard_normal(H)).astype(np.float32)) if cell == "gru" else None)
        self.x = draw((T * B, H), 1.0)                                   # the layer's input, rows (t, b)
        self.hbuf = wgmma_products.tiled_buffer(cupy, 2, B, H, cupy.uint16, poison=False)
        self.out = cupy.full((T, B, H), cupy.nan, dtype=cupy.float32)
        self.counter, self.pieces = cupy.zeros(1, dtype=cupy.uint32), cupy.zeros(1, dtype=cupy.uint32)
        self.layouts: dict = {}
        self.expected = None

    def project(self, cupy, wx, into, first: int = 0, steps: int | None = None, sms: int = 0) -> None:
        """into's steps [first, first + steps) = x's rows of them by wx (the projection: fp32 out, cublasLt, as the
        engine's fused backend makes it), on the current stream."""
        data, compute = LT_OPERANDS[self.precision]
        steps = self.T - first if steps is None else steps
        rows, N = steps * self.B, self.G * self.H
        a = self.x.data.ptr + first * self.B * self.H * self.x.itemsize
        c = into.data.ptr + first * self.B * N * into.itemsize
        if not self.lt.product(Product.dense(rows, N, self.H), a, wx.data.ptr, c, data, compute, sms=sms):
            raise SystemExit("cublasLt offered no algorithm for the projection")

    def layout(self, cupy, UB: int):
        """(weight, W_x, projection) for UB units a block: rows permuted (permutation), the weight chunked in blocks
        of G UB rows (base.chunked, as kernels/mode_persist.cu reads a chunk: one copy), the projection x W_x^T of the
        permuted W_x. The float64 run is made once, from the first layout's projection put back in gate order."""
        if UB not in self.layouts:
            perm = permutation(self.H, UB, self.G)
            wx = cupy.ascontiguousarray(self.wx[cupy.asarray(perm)])
            xp = cupy.empty((self.T, self.B, self.G * self.H), dtype=cupy.float32)
            self.project(cupy, wx, xp)
            self.layouts[UB] = (chunked(cupy, self.bits[cupy.asarray(perm)], self.G * UB, 64), wx, xp)
            if self.expected is None:
                gate_major = cupy.empty_like(xp)
                gate_major[:, :, cupy.asarray(perm)] = xp
                self.expected = reference(cupy, gate_major, values(cupy, self.bits, self.precision), self.H,
                                          self.precision, self.bias_n)
            cupy.cuda.Device().synchronize()         # made on the current stream, read on the launches'
        return self.layouts[UB]

    def launch(self, cupy, kernel: tuple, primary: int, split: tuple = (), beside: bool = True) -> Launch:
        """The kernel's launch; split (first, most): the projection in pieces (Overlapped, pieces())."""
        UB, stages, fast, staged, feed = kernel
        name = (f"mode_persist_{self.precision}{'_gru' if self.cell == 'gru' else ''}_{UB}_{stages}"
                f"{'_fast' if fast else ''}{'_staged' if staged and self.cell == 'lstm' else ''}"
                f"{'_' + feed if feed else ''}")
        weight, wx, xp = self.layout(cupy, UB)
        rows = self.G * UB
        slot = rows * 128 + wgmma_products.TILE_BYTES                   # a chunk's weight rows, then h's tile
        # the sums' exchange (it stages h too), or the staged sums: 64 rows of rows + 4 floats (the GRU's + 8)
        lead = rows + (8 if self.G == 3 else 4)
        smem = 1024 + stages * slot + 16 * stages + max(1024 * UB, 64 * lead * 4 if staged else 0)
        function = wgmma_products.ring_kernel(cupy, "mode_persist.cu", name, smem)
        xin = cupy.empty_like(xp) if split else xp
        args = (xin, weight, self.hbuf, self.out, self.counter, self.pieces if split else np.uint64(0),
                np.uint64(0) if self.bias_n is None else self.bias_n,
                np.int32(self.B), np.int32(self.H), np.int32(self.T), np.uint32(primary),
                np.uint32(weight.nbytes), np.uint64(0), np.int32(0))
        threads = 256 + 32 * FEEDS[feed]
        if not split:
            return Launch(function, (self.H // UB,), smem, args, self.counter, self.hbuf, threads)
        return Overlapped(cupy, self, function, (self.H // UB,), smem, args, wx, xin, split, beside, threads)

    def error(self, cupy, run: Launch, stream) -> float:
        """The outputs of one launch (poisoned first, and an overlapped launch's projection) against the float64
        run: the max absolute difference."""
        self.out.fill(cupy.nan)
        if isinstance(run, Overlapped):
            run.xin.fill(cupy.nan)
        cupy.cuda.Device().synchronize()             # the fills (current stream) before the launch's streams
        run.launch(stream)
        stream.synchronize()
        return float(cupy.max(cupy.abs(self.out.astype(cupy.float64) - self.expected)))


def timed(cupy, stream, run: Launch, T: int, floors: bool, only: int | None = None) -> list[dict]:
    """The launch's median ms and block 0's phases; with floors, the same for each of FLOORS (times only: the results
    are then wrong); only (skip bits): that floor alone, the launches after the check (for Nsight Compute)."""
    rows = []
    todo = ((0, None),) + (FLOORS if floors else ())
    if only is not None:
        todo = tuple(f for f in todo if f[0] == only) or ((only, f"skip bits {only}"),)
    for skip, what in todo:
        run.args = run.args[:-1] + (np.int32(skip),)
        ms = graph_ms(cupy, stream, run)
        parts = phases(cupy, run, stream, T)
        if skip & 8:                  # nothing waits for the counter: the parts that read it mean nothing
            parts = {k: v for k, v in parts.items() if "counter" not in k and "arrivals" not in k}
        rows.append({"skip": what, "ms": ms, "us_step": 1e3 * ms / T, "phases_us": parts})
    run.args = run.args[:-1] + (np.int32(0),)
    return rows


def baselines(cupy, stream, case: Case) -> tuple[float, float | None]:
    """The projection's ms alone on cublasLt (x (T B, I) by W_x, fp32 out, as the engine's fused backend makes it)
    and cuDNN's whole layer (None without torch)."""
    proj = cupy.empty((case.T, case.B, 4 * case.H), dtype=cupy.float32)

    class Projection:
        def launch(self, s):
            with s:
                case.project(cupy, case.wx, proj)
    return graph_ms(cupy, stream, Projection()), cudnn_ms(case.precision, case.H, case.B, case.T, case.cell)


def run_case(cupy, stream, case: Case, config: str, args, rows: list) -> bool:
    """Every entry of the case's mode and cell: checked against float64 (a wrong one is reported, not timed), then
    timed, made first and with its projection beside it, and each of FLOORS with --floors. False if one was wrong."""
    right, sms = True, device_attribute(cupy, "MultiProcessorCount")
    H, B, T, precision = case.H, case.B, case.T, case.precision
    for kernel in KERNELS[(precision, case.cell)]:
        if args.feed and (kernel[4] or "one") not in args.feed or args.plain and (kernel[2] or kernel[3] and
                                                                                  case.cell == "lstm"):
            continue
        UB = kernel[0]
        if H % UB or H // UB > sms or (H // 64) % 2:
            raise SystemExit(f"H = {H}: {UB} units a block in at most {sms} blocks, an even number of chunks")
        region = case.G * UB * 2 * H                                     # each block's rows: its evict_last share
        entry = f"{case.cell} {UB} units, {kernel[1]} slots{', fast' if kernel[2] else ''}" + \
            (", staged" if kernel[3] else "") + (f", {kernel[4]}" if kernel[4] else "")
        variants = [(primary, ()) for primary in
                    sorted({0} | {int(f * region) // 1024 * 1024 for f in args.share or [0.7]})]
        splits = ((1, 3),) if args.sanitize else PIECES if not kernel[2] and not args.share else ()
        variants = [(primary, split, args.sanitize) for primary, split in variants]
        variants += [(0, split, args.sanitize) for split in splits]
        if args.first and not args.sanitize:     # the whole projection, then the kernel, on one stream
            variants += [(primary, (T, T), True) for primary, _, _ in variants if primary]
        for primary, split, first in variants:
            run = case.launch(cupy, kernel, primary, split, beside=not first)
            error = case.error(cupy, run, stream)
            what = (f"projection {'first' if first else 'beside'}, pieces {split[0]}..{split[1]} steps"
                    if split else f"evict_last {primary / 1024:4.0f} KB a block")
            if split and primary:
                what += f", evict_last {primary / 1024:.0f} KB"
            label = f"{precision:8s} {config:6s} {entry:32s} {what}"
            if not error <= 2e-2:
                print(f"{label}: max error {error:.3g} against float64: WRONG, not timed", flush=True)
                right = False
                continue
            if args.sanitize:
                print(f"{label}  max error {error:.2e}", flush=True)
                continue
            for row in timed(cupy, stream, run, T, args.floors and not split, args.skip):
                rows.append({"precision": precision, "config": config, "cell": case.cell, "H": H, "B": B, "T": T,
                             "kernel": entry, "primary_kb": primary / 1024, "pieces": list(split), "error": error,
                             **row})
                head = (f"{label}  {row['ms']:7.3f} ms ({row['us_step']:6.2f} us a step)  max error "
                        f"{error:.2e}" if row["skip"] is None else
                        f"    what if {row['skip']} after step 0 (results wrong): {row['us_step']:6.2f} us")
                print(head + "\n    block 0, median us a step: " + ", ".join(
                    f"{k} {v:.2f}" for k, v in row["phases_us"].items()), flush=True)
    if not args.sanitize:
        projection, cudnn = baselines(cupy, stream, case)
        rows.append({"precision": precision, "config": config, "cell": case.cell, "projection_ms": projection,
                     "cudnn_ms": cudnn})
        print(f"{precision:8s} {config:6s} {case.cell} projection alone (cublasLt) {projection:.3f} ms, cuDNN layer "
              f"{cudnn if cudnn is None else round(cudnn, 3)} ms (TF32 off)", flush=True)
    return right


def main() -> None:
    import cupy  # deferred: CuPy is optional (no GPU in CI)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--share", type=float, action="append", default=None,
                    help="also each block's weight rows this share evict_last (default 0.7)")
    ap.add_argument("--sanitize", action="store_true",
                    help="H = 640, B = 16, T = 8, each kernel checked once, nothing timed: for compute-sanitizer")
    ap.add_argument("--floors", action="store_true",
                    help="also each run without the copies of h, of the weight, of both, without the wgmmas, with "
                         "the handshakes alone, with the wgmmas alone (FLOORS; times only: results wrong)")
    ap.add_argument("--skip", type=int, default=None,
                    help="time only the floor of these skip bits (e.g. 7: the handshakes alone), every launch after "
                         "the check (for Nsight Compute's source view of a floor)")
    ap.add_argument("--feed", action="append", default=None,
                    help="only the entries of these feeds: one (one producer), duo, trio (default: all)")
    ap.add_argument("--first", action="store_true",
                    help="also the whole layer with the projection made first, on the kernel's stream (with each "
                         "evict_last share)")
    ap.add_argument("--plain", action="store_true",
                    help="leave out the entries with the hardware approximations and the LSTM's staged ones")
    ap.add_argument("--precision", action="append", default=None, help="bfloat16, float16 (default: both)")
    ap.add_argument("--cell", action="append", default=None, help="lstm, gru (default: both)")
    args = ap.parse_args()
    if not wgmma_products.wgmma_capable(cupy):
        raise SystemExit("kernels/mode_persist.cu runs on sm_90 (H100, H200) only")
    lt, stream, rows, right = LtProjection.on_current_device(cupy), cupy.cuda.Stream(non_blocking=True), [], True
    for cell in args.cell or ["lstm", "gru"]:
        for precision in args.precision or ["bfloat16", "float16"]:
            for config, H, B, T in (("sanitize", 640, 16, 8),) if args.sanitize else CASES:
                case = Case(cupy, lt, precision, H, B, T, cell)
                right = run_case(cupy, stream, case, config, args, rows) and right
    write_rows(cupy, args.out, "probe_mode_persist.json", rows)
    if not right:
        raise SystemExit("an entry's results were wrong (above)")


if __name__ == "__main__":
    main()
