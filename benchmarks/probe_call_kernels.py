"""Where one call's time goes outside its step kernel (issue #34, the FlashRNN row at B = 16): the autotuner's choice
for a preset, config and precision, as `engine bench`'s auto row runs it, timed whole (CUDA events, median after
warm-up) and then profiled with torch.profiler (CUPTI sees CuPy's launches too): every kernel and copy of one call,
with its start relative to the call's first kernel and its duration, so the gaps and the work before and after the
recurrence are visible.

    python3 benchmarks/probe_call_kernels.py --preset lstm --config 512,512,1,1024,16 --precision bfloat16
    python3 benchmarks/probe_call_kernels.py --train --preset slstm ...    # a training step (bptt "fused") instead
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("CUPY_TF32", "0")

import engine  # noqa: E402
from engine.bench.configs import parse_configs  # noqa: E402
from engine.bench.timing import cupy_timer, time_runs  # noqa: E402
from engine.schedules import autotune  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="lstm")
    parser.add_argument("--config", default="512,512,1,1024,16")
    parser.add_argument("--precision", default="bfloat16")
    parser.add_argument("--json", default=None)
    parser.add_argument("--train", action="store_true",
                        help="profile one training step (forward + backward, bptt backend 'fused') in the mode")
    args = parser.parse_args()
    import cupy
    import torch
    from torch.profiler import ProfilerActivity, profile

    (config,) = parse_configs([args.config])
    network = engine.Network(engine.preset(args.preset).cell, config.input_size, config.hidden_size, config.num_layers)
    params = engine.init_params(network, seed=0)
    x = cupy.asarray(np.random.default_rng(1).standard_normal((config.steps, config.batch, config.input_size)),
                     dtype=cupy.float32)
    if args.train:
        from engine.autodiff import record
        w = cupy.asarray(np.random.default_rng(2).standard_normal((config.steps, config.batch, network.output_size)),
                         dtype=cupy.float32)

        def run():
            return record(network, params, x, dtype=np.float32, backend="fused", precision=args.precision).backward(w)
        what = "training step (bptt fused)"
    else:
        choice = autotune.tune(network, params, config.steps, config.batch, precision=args.precision)
        program = autotune.prepare(choice.candidate, network, params, precision=args.precision)

        def run():
            return program.run(x)
        what = f"{choice.schedule} ({choice.config.label() if choice.config else '-'})"
    whole = time_runs(lambda k: run(), cupy_timer, buffers=1, warmup=5, reps=30).median_ms
    print(f"{cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}: {args.preset} {args.config} "
          f"{args.precision}: {what}, whole call {whole:.3f} ms (median of 30)")
    cupy.cuda.Device().synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            run()
            cupy.cuda.Device().synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    calls, current = [], []
    for e in kernels:                                       # a call: kernels closer than 1 ms to the one before
        if current and e.time_range.start - current[-1].time_range.end > (5000 if args.train else 1000):
            calls.append(current)
            current = []
        current.append(e)
    calls.append(current)
    last = calls[-1]
    t0 = last[0].time_range.start
    rows = []
    for e in last:
        rows.append({"name": e.name[:90], "start_us": e.time_range.start - t0,
                     "us": e.time_range.end - e.time_range.start})
        print(f"  +{rows[-1]['start_us']:9.1f} us {rows[-1]['us']:9.1f} us  {rows[-1]['name']}")
    span = last[-1].time_range.end - t0
    busy = sum(r["us"] for r in rows)
    longest = max(rows, key=lambda r: r["us"])
    print(f"last call: {len(rows)} kernels/copies over {span:.1f} us of GPU time, {busy:.1f} us busy; "
          f"longest {longest['us']:.1f} us ({longest['name'][:50]}), the rest {busy - longest['us']:.1f} us busy")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"whole_ms": whole, "what": what, "kernels": rows},
                                              indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
