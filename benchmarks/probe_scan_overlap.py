"""Probe: two ways to take time off the minGRU scan's forward (issue #33's 10x), which is 88 % one strict-fp32 GEMM
(32768 x 1024 x 512) and 12 % the walk over its output.

1. cublasLt's algorithms for that GEMM: those of the heuristic's first 16 it offers, each timed (CUDA events,
   medians) and checked against float64.
2. The GEMM and the walk overlapped: the sequence cut into C chunks of whole tiles; chunk k's GEMM on the caller's
   stream, chunk k's walk on a side stream once its GEMM is done and the walk of chunk k - 1 has handed over its
   final state; the side stream at the default priority or the greatest. Each form's output is checked bit for bit
   against the one-GEMM-one-walk call (the walk's tiles are the same, so the sums are too).

One layer, I = H = 512, B = 8, T = 4096, float32 (TF32 off). Times are CUDA-event medians of the whole call after
warm-up (engine.bench.timing), each form timed in interleaved rounds.

    python3 benchmarks/probe_scan_overlap.py [--out DIR]
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("CUPY_TF32", "0")

from probe_scan_forward import median_ms, mingru_case  # noqa: E402

from engine.codegen.cublas_enums import CUBLAS_COMPUTE_32F, CUDA_R_32F  # noqa: E402
from engine.schedules import scan  # noqa: E402
from engine.schedules.cublaslt import LtProjection  # noqa: E402

ROUNDS = 3


class Overlapped:
    """One layer's forward as C chunks: GEMM k on the caller's stream, walk k on a side stream."""

    def __init__(self, cupy, call: scan.WalkCall, x, chunks: int, priority: int | None):
        T, B, _ = x.shape
        self.cupy, self.x, self.B, self.n = cupy, x, B, call.n
        weight, self.inputs, self.walk = call.layers[0]
        product = cupy.empty((T * B, weight.shape[0]), dtype=cupy.float32)
        lt = LtProjection.on_current_device(cupy)
        step = -(-T // chunks)
        self.spans = [(t, min(t + step, T)) for t in range(0, T, step)]
        self.gemms = [(product[t0 * B:t1 * B], lt.bind(weight, product[t0 * B:t1 * B], CUDA_R_32F, CUBLAS_COMPUTE_32F))
                      for t0, t1 in self.spans]
        self.side = cupy.cuda.Stream(non_blocking=True, priority=priority)
        self.carry = cupy.empty((len(self.spans) + 1, B, call.n), dtype=cupy.float32)
        self.carry[0] = 0
        self.product = product

    def __call__(self):
        cupy, x, B, n = self.cupy, self.x, self.B, self.n
        main = cupy.cuda.get_current_stream()
        out = cupy.empty((x.shape[0], B, n), dtype=cupy.float32)
        for k, ((t0, t1), (view, gemm)) in enumerate(zip(self.spans, self.gemms)):
            gemm(x[t0].data.ptr, main.ptr)
            made = main.record()
            self.side.wait_event(made)
            with self.side:
                scan.walk_launch(self.walk, tuple(view if isinstance(v, int) else v for v in self.inputs),
                                 self.carry[k], out[t0:t1], self.carry[k + 1], t1 - t0, B, n)
        main.wait_event(self.side.record())
        return out


def main() -> int:
    import cupy
    out_dir = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else None
    T, B, H = 4096, 8, 512
    network, x, program = mingru_case(T, B, H)
    device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print("device", device)
    results: dict = {"device": device, "T": T, "B": B, "H": H}

    # 1. the GEMM's algorithms
    call = scan.WalkCall(program)
    weight = call.layers[0][0]
    product = cupy.empty((T * B, weight.shape[0]), dtype=cupy.float32)
    lt = LtProjection.on_current_device(cupy)
    bound = lt.bind(weight, product, CUDA_R_32F, CUBLAS_COMPUTE_32F, count=16)
    rows_x = x.reshape(T * B, H)
    want = cupy.matmul(rows_x.astype(cupy.float64), weight.T.astype(cupy.float64))
    firsts = []
    for algo in bound.plan.candidates:
        bound.use(algo)
        product[...] = np.nan
        bound(rows_x.data.ptr, cupy.cuda.get_current_stream().ptr)
        err = float(cupy.abs(product - want).max() / cupy.abs(want).max())
        firsts.append({"ms": median_ms(lambda: bound(rows_x.data.ptr, cupy.cuda.get_current_stream().ptr)),
                       "rel_err_vs_float64": err})
    results["algorithms"] = firsts
    print(f"{'algo':>5s} {'ms':>8s} {'rel err':>9s}   (cublasLt's heuristic order)")
    for k, r in enumerate(firsts):
        print(f"{k:5d} {r['ms']:8.3f} {r['rel_err_vs_float64']:9.2e}", flush=True)

    # 2. overlapped
    reference = cupy.asnumpy(program.run(x).outputs)
    forms = {"one GEMM, one walk (WalkCall)": lambda: program.run(x).outputs}
    for chunks in (2, 4, 8, 16):
        for priority, tag in ((None, "default"), (-5, "high")):
            forms[f"{chunks} chunks, side stream {tag}"] = Overlapped(cupy, call, x, chunks, priority)
    checked = {}
    for name, run in forms.items():
        got = cupy.asnumpy(run())
        cupy.cuda.Device().synchronize()
        checked[name] = bool((got == reference).all())
    rounds: dict = {name: [] for name in forms}
    for _ in range(ROUNDS):
        for name, run in forms.items():
            rounds[name].append(median_ms(run))
    results["overlap"] = [{"form": name, "ms": float(np.median(rounds[name])), "rounds_ms": rounds[name],
                           "bit_identical": checked[name]} for name in forms]
    print(f"{'form':>36s} {'ms':>8s} {'bit-identical':>14s}")
    for r in results["overlap"]:
        print(f"{r['form']:>36s} {r['ms']:8.3f} {str(r['bit_identical']):>14s}", flush=True)
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "probe_scan_overlap.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
