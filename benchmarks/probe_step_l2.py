"""A step's product on cublasLt over T chained steps, with part of the weight kept in L2 across steps, and with each
of cublasLt's ranked algorithms (issue #34: blogA in bf16 reads its 52 MB recurrent weight from DRAM every step).

Two questions, each answered by timing one CUDA graph of T steps (a product, then one elementwise kernel that makes
the next step's operand from its output, so the chain is a real dependency):
1. L2 persistence. The context's set-aside for persisting lines (CU_LIMIT_PERSISTING_L2_CACHE_SIZE, a limit of this
   process's context, not a setting of the card) and an access-policy window over the weight on the capturing
   stream (hitRatio = set-aside / window bytes). Does a captured kernel take the stream's window? Are persisting
   lines kept for a later graph launched without a window ("sticky")? Each variant is measured after
   cuCtxResetPersistingL2Cache.
2. Algorithms. cublasLt's heuristic ranks candidates; the engine takes its first. The first eight are timed here.

Inputs are random normal (no zeros); one product is checked against float64 first. Medians of CUDA-event
intervals after warm-up.

    python3 benchmarks/probe_step_l2.py --out /tmp/probe
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_chain import StepChain  # noqa: E402

CASES = [  # name, H, B, T, gates, mode
    ("lstm blogA", 2560, 64, 200, 4, "bfloat16"),
    ("gru blogA", 2560, 64, 200, 3, "bfloat16"),
    ("lstm blogA", 2560, 64, 200, 4, "tf32"),
    ("lstm large (a layer)", 1024, 128, 100, 4, "bfloat16"),
    ("lstm large (a layer)", 1024, 128, 100, 4, "tf32"),
]
CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06
CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38
CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE = 108
CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE = 109
CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW = 1
NORMAL, STREAMING, PERSISTING = 0, 1, 2


class AccessPolicyWindow(ctypes.Structure):
    _fields_ = [("base_ptr", ctypes.c_void_p), ("num_bytes", ctypes.c_size_t), ("hitRatio", ctypes.c_float),
                ("hitProp", ctypes.c_int), ("missProp", ctypes.c_int)]


class LaunchAttributeValue(ctypes.Union):
    _fields_ = [("window", AccessPolicyWindow), ("pad", ctypes.c_char * 64)]


class Driver:
    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")

    def check(self, status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} returned CUresult {status}")

    def attribute(self, attr: int) -> int:
        value = ctypes.c_int(0)
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(value), ctypes.c_int(attr), ctypes.c_int(0)),
                   "cuDeviceGetAttribute")
        return value.value

    def set_persisting(self, size: int) -> int:
        self.check(self.lib.cuCtxSetLimit(ctypes.c_int(CU_LIMIT_PERSISTING_L2_CACHE_SIZE), ctypes.c_size_t(size)),
                   "cuCtxSetLimit")
        got = ctypes.c_size_t(0)
        self.check(self.lib.cuCtxGetLimit(ctypes.byref(got), ctypes.c_int(CU_LIMIT_PERSISTING_L2_CACHE_SIZE)),
                   "cuCtxGetLimit")
        return got.value

    def reset(self) -> None:
        self.check(self.lib.cuCtxResetPersistingL2Cache(), "cuCtxResetPersistingL2Cache")

    def window(self, stream_ptr: int, base: int, num_bytes: int, hit_ratio: float, hit=PERSISTING) -> None:
        value = LaunchAttributeValue()
        value.window = AccessPolicyWindow(base, num_bytes, hit_ratio, hit, STREAMING if hit == PERSISTING else NORMAL)
        self.check(self.lib.cuStreamSetAttribute(ctypes.c_void_p(stream_ptr),
                                                 ctypes.c_int(CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW),
                                                 ctypes.byref(value)), "cuStreamSetAttribute")

    def clear(self, stream_ptr: int) -> None:
        self.window(stream_ptr, 0, 0, 0.0, NORMAL)


def main() -> None:
    import cupy

    from engine.schedules.cublaslt import LtProjection
    from engine.schedules.project import LT_OPERANDS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--algos", type=int, default=8)
    args = ap.parse_args()
    drv = Driver()
    cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(1))          # a context
    l2 = drv.attribute(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
    max_persist = drv.attribute(CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE)
    max_window = drv.attribute(CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE)
    print(f"L2 {l2 / 1e6:.1f} MB, max persisting {max_persist / 1e6:.1f} MB, max window {max_window / 1e6:.1f} MB",
          flush=True)
    lt = LtProjection.on_current_device(cupy)
    rows = []
    for name, H, B, T, G, mode in CASES:
        N = G * H
        chain = StepChain(cupy, mode, H, B, N, T, args.reps)
        w, stream = chain.w, chain.stream
        bound = lt.bind(w, chain.out, *LT_OPERANDS[mode], count=args.algos)
        candidates = list(bound.plan.candidates)
        err = chain.error(bound)
        weight_bytes = w.nbytes

        def capture():
            return chain.capture(bound)

        timed = chain.time

        def record(variant: str, ms: float, **extra):
            row = {"case": name, "mode": mode, "H": H, "B": B, "T": T, "gates": G, "variant": variant, "ms": ms,
                   "us_per_step": 1e3 * ms / T, "weight_MB": weight_bytes / 1e6,
                   "weight_GB_per_s": weight_bytes / (ms / T * 1e-3) / 1e9, "step_rel_err": err, **extra}
            rows.append(row)
            print(f"{name:22s} {mode:9s} {variant:34s} {row['us_per_step']:7.2f} us/step "
                  f"{row['weight_GB_per_s']:6.0f} GB/s", flush=True)

        # 1. algorithms, no window
        drv.set_persisting(0)
        drv.reset()
        best = (None, float("inf"))
        for k, algo in enumerate(candidates):
            bound.use(algo)
            try:
                ms = timed(capture())
            except Exception as exc:          # an algorithm that cannot run this product
                print(f"  algo {k}: {exc}")
                continue
            record(f"algo {k}, no window", ms, algo=k)
            if ms < best[1]:
                best = (k, ms)
        bound.use(candidates[0])
        # 2. persistence with the heuristic's first algorithm
        for frac_name, persist in (("max", max_persist), ("3/4 max", max_persist * 3 // 4)):
            got = drv.set_persisting(persist)
            for hit_name, nbytes, ratio in (("ratio window", min(weight_bytes, max_window),
                                             min(1.0, got / min(weight_bytes, max_window))),
                                            ("first-part window", min(got, weight_bytes, max_window), 1.0)):
                drv.reset()
                drv.window(stream.ptr, w.data.ptr, nbytes, ratio)
                graph = capture()
                drv.clear(stream.ptr)
                ms = timed(graph)
                record(f"{hit_name}, set-aside {frac_name}", ms, persist=got, window=nbytes, hit_ratio=ratio)
        # 3. sticky: lines marked by an eager run with the window, then a graph captured without one
        got = drv.set_persisting(max_persist)
        drv.reset()
        drv.clear(stream.ptr)
        plain = capture()
        ms_before = timed(plain)
        drv.window(stream.ptr, w.data.ptr, min(weight_bytes, max_window), min(1.0, got / min(weight_bytes, max_window)))
        with stream:
            for _ in range(3):
                bound(chain.h0.data.ptr, stream.ptr)
        drv.clear(stream.ptr)
        stream.synchronize()
        record("no window after reset (set-aside max)", ms_before)
        record("no window, lines marked before", timed(plain))
        if best[0] is not None and best[0] != 0:
            bound.use(candidates[best[0]])
            drv.reset()
            drv.window(stream.ptr, w.data.ptr, min(weight_bytes, max_window),
                       min(1.0, got / min(weight_bytes, max_window)))
            graph = capture()
            drv.clear(stream.ptr)
            record(f"algo {best[0]} + ratio window, set-aside max", timed(graph), algo=best[0])
        # 4. eager (no graph): does the window work where no capture is involved?
        class Eager:
            def launch(self, _stream):
                chain.steps(bound)
        bound.use(candidates[0])
        for variant, persist in (("eager, no set-aside", 0), ("eager, ratio window, set-aside max", max_persist),
                                 ("eager, ratio window, set-aside 3/4 max", max_persist * 3 // 4)):
            got = drv.set_persisting(persist)
            drv.reset()
            if persist:
                drv.window(stream.ptr, w.data.ptr, min(weight_bytes, max_window),
                           min(1.0, got / min(weight_bytes, max_window)))
            record(variant, timed(Eager()))
            drv.clear(stream.ptr)
        drv.reset()
        drv.set_persisting(0)
        del graph, plain
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_step_l2.json").write_text(json.dumps(
            {"device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "cupy": cupy.__version__,
             "l2_bytes": l2, "max_persisting_bytes": max_persist, "max_window_bytes": max_window, "rows": rows},
            indent=1))


if __name__ == "__main__":
    main()
