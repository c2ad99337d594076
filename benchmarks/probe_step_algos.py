"""A step's product on cublasLt with every algorithm configuration its heuristic offers, and split-K variants of
them (issue #34: at `large` a layer's bf16 step product (128 x 1024 by 1024 x 4096) took 7.9 us on an H200 with
each of the heuristic's first eight, 1.1 TB/s of an 8.4 MB weight that fits in L2; 2026-11-28,
benchmarks/probe_step_l2.py).

For each case: the heuristic's first `--algos` candidates, each described (algorithm id, tile, split-K, reduction
scheme, stages, custom option, the heuristic's waves); then, for the candidates whose capabilities allow split-K,
the same algorithm with SPLITK_NUM in SPLITS and each reduction scheme it supports, kept where cublasLtMatmulAlgoCheck
accepts it. Every configuration is checked against float64 on one product (random normal inputs) and timed as a
chain of T steps in one CUDA graph (a product, then a tanh that makes the next step's operand from its output):
medians of CUDA-event intervals after warm-up.

    python3 benchmarks/probe_step_algos.py --out /tmp/probe
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
    ("lstm large (a layer)", 1024, 128, 100, 4, "bfloat16"),
    ("gru large (a layer)", 1024, 128, 100, 3, "bfloat16"),
    ("lstm large (a layer)", 1024, 128, 100, 4, "tf32"),
    ("lstm blogA", 2560, 64, 200, 4, "bfloat16"),
    ("gru blogA", 2560, 64, 200, 3, "bfloat16"),
    ("lstm blogA", 2560, 64, 200, 4, "tf32"),
]
SPLITS = (2, 3, 4, 6, 8, 16)
CONFIG = {"id": (0, ctypes.c_int32), "tile": (1, ctypes.c_uint32), "splitk": (2, ctypes.c_uint32),
          "reduction": (3, ctypes.c_uint32), "swizzle": (4, ctypes.c_uint32), "custom": (5, ctypes.c_uint32),
          "stages": (6, ctypes.c_uint32), "inner": (7, ctypes.c_uint16), "cluster": (8, ctypes.c_uint16)}
CAP_SPLITK_SUPPORT, CAP_REDUCTION_MASK = 0, 1
REDUCTIONS = {1: "inplace", 2: "compute-type", 4: "output-type"}


def describe(lib, algo) -> dict:
    found = {}
    for name, (attr, ctype) in CONFIG.items():
        value, written = ctype(0), ctypes.c_size_t(0)
        status = lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), ctypes.c_int(attr), ctypes.byref(value),
                                                          ctypes.c_size_t(ctypes.sizeof(value)),
                                                          ctypes.byref(written))
        found[name] = int(value.value) if status == 0 else None
    return found


def capability(lib, algo, attr: int) -> int:
    value, written = ctypes.c_uint32(0), ctypes.c_size_t(0)
    status = lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), ctypes.c_int(attr), ctypes.byref(value),
                                                   ctypes.c_size_t(4), ctypes.byref(written))
    return int(value.value) if status == 0 else 0


def configured(lib, algo, **values):
    copy = type(algo).from_buffer_copy(bytes(algo))
    for name, value in values.items():
        attr, ctype = CONFIG[name]
        v = ctype(value)
        if lib.cublasLtMatmulAlgoConfigSetAttribute(ctypes.byref(copy), ctypes.c_int(attr), ctypes.byref(v),
                                                    ctypes.c_size_t(ctypes.sizeof(v))) != 0:
            return None
    return copy


def main() -> None:
    import cupy

    from engine.codegen.cublas_enums import LT_HEURISTIC_RESULT_BYTES
    from engine.schedules.cublaslt import WORKSPACE, LtProjection
    from engine.schedules.project import LT_OPERANDS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--algos", type=int, default=24)
    args = ap.parse_args()
    lt = LtProjection.on_current_device(cupy)
    rows = []
    for name, H, B, T, G, mode in CASES:
        chain = StepChain(cupy, mode, H, B, G * H, T, args.reps)
        data_type, compute = LT_OPERANDS[mode]
        bound = lt.bind(chain.w, chain.out, data_type, compute, count=args.algos)
        plan = bound.plan
        w_layout, a_layout, c_layout = plan.layouts
        seen = set()

        def run(label: str, algo, source: str):
            config = describe(lt.lib, algo)
            key = tuple(sorted(config.items()))
            if key in seen:
                return
            seen.add(key)
            check = (ctypes.c_uint8 * LT_HEURISTIC_RESULT_BYTES)()
            if lt.lib.cublasLtMatmulAlgoCheck(lt.handle, plan.desc, w_layout, a_layout, c_layout, c_layout,
                                              ctypes.byref(algo), check) != 0:
                return
            workspace = int.from_bytes(bytes(check)[64:72], "little")
            waves = ctypes.c_float.from_buffer_copy(bytes(check)[76:80]).value
            if workspace > WORKSPACE:
                return
            bound.use(algo)
            try:
                err = chain.error(bound)
                ms = chain.time(chain.capture(bound))
            except Exception as exc:                 # a configuration that cannot run this product
                print(f"{name} {mode} {label}: {type(exc).__name__}: {exc}", flush=True)
                return
            weight = chain.w.nbytes
            row = {"case": name, "mode": mode, "H": H, "B": B, "T": T, "gates": G, "label": label, "source": source,
                   **config, "waves": waves, "workspace": workspace, "ms": ms, "us_per_step": 1e3 * ms / T,
                   "weight_GB_per_s": weight / (ms / T * 1e-3) / 1e9, "rel_err": err}
            rows.append(row)
            print(f"{name:20s} {mode:9s} {label:24s} id {config['id']:3} tile {config['tile']} split "
                  f"{config['splitk']} red {config['reduction']} stages {config['stages']} custom {config['custom']} "
                  f"cluster {config['cluster']} waves {waves:5.2f}  {row['us_per_step']:6.2f} us/step "
                  f"{row['weight_GB_per_s']:5.0f} GB/s err {err:.1e}", flush=True)

        for k, algo in enumerate(plan.candidates):
            run(f"heuristic {k}", algo, "heuristic")
        for k, algo in enumerate(plan.candidates[:8]):
            if not capability(lt.lib, algo, CAP_SPLITK_SUPPORT):
                continue
            mask = capability(lt.lib, algo, CAP_REDUCTION_MASK)
            for split in SPLITS:
                for scheme, scheme_name in REDUCTIONS.items():
                    if mask & scheme:
                        variant = configured(lt.lib, algo, splitk=split, reduction=scheme)
                        if variant is not None:
                            run(f"h{k} split {split} {scheme_name}", variant, "split-K")
        best = min((r for r in rows if r["case"] == name and r["mode"] == mode), key=lambda r: r["ms"], default=None)
        first = next((r for r in rows if r["case"] == name and r["mode"] == mode and r["label"] == "heuristic 0"),
                     None)
        if best and first:
            print(f"== {name} {mode}: heuristic's first {first['us_per_step']:.2f} us/step, best "
                  f"{best['us_per_step']:.2f} ({best['label']})", flush=True)

    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_step_algos.json").write_text(json.dumps(
            {"device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "cupy": cupy.__version__,
             "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
