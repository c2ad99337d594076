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
from engine.blocks import Layers, Net  # noqa: E402
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
    parser.add_argument("--backend", default="persistent")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    present = cupy.cuda.runtime.getDeviceCount()
    nets = {"lstm16": (Net(1024, (Layers("lstm", 1024, 16),), name="lstm16"), 200, 128),
            "deepspeech": (engine.net_preset("deepspeech"), 100, 64)}
    rows = []
    for name, (net, steps, batch) in nets.items():
        params = engine.init_net_params(net, seed=0)
        with cupy.cuda.Device(0):
            x = cupy.asarray(np.random.default_rng(1).standard_normal((steps, batch, net.input_size)),
                             dtype=cupy.float32)
        plan = plan_pipeline(net, args.gpus, steps, batch, available=present)
        print(plan.describe(), flush=True)
        row = {"net": name, "gpus": args.gpus, "backend": args.backend, "plan": plan.as_dict(),
               "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()}
        with cupy.cuda.Device(0):
            one = engine.prepare_net(net, params, args.backend)
            reference = one.run(x).outputs
            row["one_gpu_ms"] = timed_ms(lambda: one.run(x), 1, args.warmup, args.repeats)
        many = PipelineProgram(net, params, plan, backend=args.backend)
        out = many.run(x).outputs
        got, want = cupy.asnumpy(out), cupy.asnumpy(reference)          # on the host: they sit on different GPUs
        row["max_rel_diff"] = float(np.abs(got - want).max() / np.abs(want).max())
        row["pipelined_ms"] = timed_ms(lambda: many.run(x), args.gpus, args.warmup, args.repeats)
        row["speedup"] = row["one_gpu_ms"] / row["pipelined_ms"]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "plan"}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
