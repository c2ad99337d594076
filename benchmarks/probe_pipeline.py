"""Layers pipelined over the GPUs of one host (issue #11): the engine on N GPUs against the engine on one.

    python benchmarks/probe_pipeline.py [--gpus 2] [--backend persistent] [--net lstm16] [--chunk 8]
        [--split 4,4] [--fuse-pools] [--no-replay] [--json out.json]

Two nets: the issue's 16-layer LSTM stack (hidden 1024, batch 128, 200 steps; target 1.6x on 2 GPUs) and the
DeepSpeech block (target: faster on 2 GPUs than on 1). For each: the one-GPU runs (engine.prepare_net, each backend,
pools folded in or not), timed as a whole forward after warm-up (median of --repeats, all GPUs synchronised before
and after); then, per backend, the planner's plan (engine/multigpu) and the tuner's (tune_pipeline: chunks and
splits measured), each pipelined output checked against the one-GPU output, each timed by PipelineProgram.measure
(the same wall time, and each GPU's busy time from CUDA events: the measured bubble). --chunk / --split replace the
tuner's candidates.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.multigpu import PipelineProgram, plan_pipeline, tune_pipeline, wall_ms  # noqa: E402
from engine.nets.data import Pool  # noqa: E402


def main(argv=None) -> int:
    import cupy
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--backend", action="append", default=None,
                        help="engine backend for both runs (repeatable; default persistent and graph)")
    parser.add_argument("--chunk", type=int, action="append", default=None,
                        help="steps per chunk to try besides the planner's choice (repeatable)")
    parser.add_argument("--split", action="append", default=None,
                        help="layers per GPU to try besides the planner's split, e.g. 4,4 (repeatable)")
    parser.add_argument("--net", action="append", default=None, help="lstm16 and/or deepspeech (default both)")
    parser.add_argument("--fuse-pools", action="store_true",
                        help="each GPU's pieces as one wavefront program, pools folded in (PipelineProgram)")
    parser.add_argument("--no-replay", action="store_true",
                        help="issue every chunk's schedule runs directly instead of replaying CUDA graphs of them")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    backends = args.backend or ["persistent", "graph"]
    present = cupy.cuda.runtime.getDeviceCount()
    nets = {"lstm16": (engine.net_preset("stack"), 200, 128),
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
                    one_gpu[label] = wall_ms(lambda: one.run(x), warmup=args.warmup, repeats=args.repeats)
                    one = None
                print(json.dumps({"net": name, "one_gpu": label, "ms": one_gpu[label]}), flush=True)
        best_label = min(one_gpu, key=one_gpu.get)
        splits = None if not args.split else [[len(g) for g in planned.split]] + [
            [int(n) for n in text.split(",")] for text in args.split
            if sum(int(n) for n in text.split(",")) == len(planned.units)]
        chunks = None if not args.chunk else [planned.chunk] + args.chunk
        for backend in backends:
            # The planner's plan as it is, then the tuner (engine.multigpu.tune_pipeline) over chunks and splits.
            replay = not args.no_replay
            program = PipelineProgram(net, params, planned, backend=backend, fuse_pools=args.fuse_pools, replay=replay)
            with cupy.cuda.Device(program.devices[-1]):
                got = cupy.asnumpy(program.run(x).outputs)      # on the host: the runs sit on different GPUs
            for g in range(args.gpus):
                print(f"{name} GPU {g}: {program.fused.get(g, 'pools not fused')}; {program.replayed[g]}", flush=True)
            diff = float(np.abs(got - reference).max() / np.abs(reference).max())
            as_planned = program.measure(x, warmup=args.warmup, repeats=args.repeats)
            program = None
            tuned, tried = tune_pipeline(net, params, args.gpus, steps, batch, backend=backend, x=x, chunks=chunks,
                                         splits=splits, warmup=args.warmup, repeats=args.repeats,
                                         fuse_pools=args.fuse_pools, replay=replay, use_cache=replay)
            program = PipelineProgram(net, params, tuned, backend=backend, fuse_pools=args.fuse_pools, replay=replay)
            with cupy.cuda.Device(program.devices[-1]):
                tuned_diff = float(np.abs(cupy.asnumpy(program.run(x).outputs) - reference).max()
                                   / np.abs(reference).max())
            program = None
            for label, plan, measured, rel in (("planner", planned, as_planned, diff),
                                               ("tuned", tuned, tuned.measured, tuned_diff)):
                row = {"net": name, "gpus": args.gpus, "backend": backend, "device": device, "choice": label,
                       "fuse_pools": args.fuse_pools, "replay": replay,
                       "split": [len(g) for g in plan.split], "chunk": plan.chunk, "predicted_ms": plan.predicted_ms,
                       "predicted_bubble": plan.bubble, "ms": measured.ms, "busy_ms": measured.busy_ms,
                       "measured_bubble": measured.bubble, "max_rel_diff": rel, "one_gpu_ms": one_gpu,
                       "one_gpu_best": best_label, "speedup_vs_best_one_gpu": one_gpu[best_label] / measured.ms,
                       "speedup_vs_same_backend": one_gpu[backend] / measured.ms,
                       "tried": tried if label == "tuned" else None}
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k not in ("one_gpu_ms", "tried")}), flush=True)
            for t in tried:
                print(json.dumps({"net": name, "backend": backend, "tried": t}), flush=True)
    print()
    print("| net | backend | plan | split | chunk | 1 GPU best (ms) | N GPUs (ms) | vs best 1 GPU "
          "| bubble measured / predicted | max rel diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['net']} | {r['backend']} | {r['choice']} | {r['split']} | {r['chunk']} | "
              f"{r['one_gpu_ms'][r['one_gpu_best']]:.2f} ({r['one_gpu_best']}) | {r['ms']:.2f} | "
              f"{r['speedup_vs_best_one_gpu']:.2f}x | {100 * r['measured_bubble']:.0f}% / "
              f"{100 * r['predicted_bubble']:.0f}% | {r['max_rel_diff']:.1e} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
