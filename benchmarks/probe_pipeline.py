"""Layers pipelined over the GPUs of one host (issue #11): the engine on N GPUs against the engine on one.

    python benchmarks/probe_pipeline.py [--gpus 2] [--backend persistent] [--json out.json]

Two nets: the issue's 16-layer LSTM stack (hidden 1024, batch 128, 200 steps; target 1.6x on 2 GPUs) and the
DeepSpeech block (target: faster on 2 GPUs than on 1). For each: the plan (engine/pipeline.py: split, chunk,
predicted time and bubble), then the one-GPU run (engine.prepare_net) and the pipelined run (PipelineProgram), each
timed with CUDA events around a whole forward after warm-up (the median of --repeats; events on the last GPU, all
GPUs synchronised before the end event is read), the pipelined output checked against the one-GPU output first.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.blocks import Layers, Net, Pool  # noqa: E402
from engine.pipeline import PipelineProgram, plan_pipeline  # noqa: E402


def timed_ms(fn, gpus: int, warmup: int, repeats: int) -> float:
    import cupy

    def sync_all():
        for d in range(gpus):
            with cupy.cuda.Device(d):
                cupy.cuda.Device().synchronize()
    for _ in range(warmup):
        fn()
    sync_all()
    samples = []
    for _ in range(repeats):
        with cupy.cuda.Device(0):
            start = cupy.cuda.Event()
            start.record()
        fn()
        sync_all()
        with cupy.cuda.Device(0):
            end = cupy.cuda.Event()
            end.record()
            end.synchronize()
            samples.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(samples)


def main(argv=None) -> int:
    import cupy
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--backend", action="append", default=None,
                        help="engine backend for both runs (repeatable; default persistent and graph)")
    parser.add_argument("--chunk", type=int, action="append", default=None,
                        help="steps per chunk to try besides the planner's choice (repeatable)")
    parser.add_argument("--net", action="append", default=None, help="lstm16 and/or deepspeech (default both)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    backends = args.backend or ["persistent", "graph"]
    present = cupy.cuda.runtime.getDeviceCount()
    nets = {"lstm16": (Net(1024, (Layers("lstm", 1024, 16),), name="lstm16"), 200, 128),
            "deepspeech": (engine.net_preset("deepspeech"), 100, 64)}
    rows = []
    for name in args.net or list(nets):
        net, steps, batch = nets[name]
        params = engine.init_net_params(net, seed=0)
        with cupy.cuda.Device(0):
            x = cupy.asarray(np.random.default_rng(1).standard_normal((steps, batch, net.input_size)),
                             dtype=cupy.float32)
        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        planned = plan_pipeline(net, args.gpus, steps, batch, available=present)
        print(planned.describe(), flush=True)
        chunks = [planned.chunk] + [c for c in (args.chunk or [10, 20, 25, 50]) if c != planned.chunk]
        one_gpu = {}
        reference = None
        for backend in backends:
            for fuse_pools in ((False, True) if any(isinstance(b, Pool) for b in net.blocks) else (False,)):
                label = backend + ("+fused-pools" if fuse_pools else "")
                with cupy.cuda.Device(0):
                    one = engine.prepare_net(net, params, backend, fuse_pools=fuse_pools)
                    out = one.run(x).outputs
                    if reference is None:
                        reference = cupy.asnumpy(out)
                    one_gpu[label] = timed_ms(lambda: one.run(x), 1, args.warmup, args.repeats)
                    one = None
                print(json.dumps({"net": name, "one_gpu": label, "ms": one_gpu[label]}), flush=True)
        best_label = min(one_gpu, key=one_gpu.get)
        for backend in backends:
            for chunk in chunks:
                plan = plan_pipeline(net, args.gpus, steps, batch, chunk=chunk, available=present)
                row = {"net": name, "gpus": args.gpus, "backend": backend, "device": device, "chunk": plan.chunk,
                       "planner_chunk": planned.chunk, "plan": plan.as_dict(), "one_gpu_ms": one_gpu,
                       "one_gpu_best": best_label}
                many = PipelineProgram(net, params, plan, backend=backend)
                with cupy.cuda.Device(many.devices[-1]):
                    got = cupy.asnumpy(many.run(x).outputs)      # on the host: the runs sit on different GPUs
                row["max_rel_diff"] = float(np.abs(got - reference).max() / np.abs(reference).max())
                row["pipelined_ms"] = timed_ms(lambda: many.run(x), args.gpus, args.warmup, args.repeats)
                row["speedup_vs_same_backend"] = one_gpu[backend] / row["pipelined_ms"]
                row["speedup_vs_best_one_gpu"] = one_gpu[best_label] / row["pipelined_ms"]
                row["predicted_ms"] = plan.predicted_ms
                many = None
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k not in ("plan", "one_gpu_ms")}), flush=True)
    print()
    print("| net | backend | chunk | 1 GPU best (ms) | 2 GPUs (ms) | speedup vs best 1 GPU | vs same backend | max rel diff |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['net']} | {r['backend']} | {r['chunk']}{' (planner)' if r['chunk'] == r['planner_chunk'] else ''}"
              f" | {r['one_gpu_ms'][r['one_gpu_best']]:.2f} ({r['one_gpu_best']}) | {r['pipelined_ms']:.2f}"
              f" | {r['speedup_vs_best_one_gpu']:.2f}x | {r['speedup_vs_same_backend']:.2f}x | {r['max_rel_diff']:.1e} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
