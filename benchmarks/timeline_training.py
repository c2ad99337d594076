"""Where a training step's GPU time goes, kernel by kernel: one step traced through CUPTI (torch.profiler), for the
engine's fused step (layer by layer and as a wavefront) and for cuDNN's (torch.nn.LSTM / GRU, fp32, TF32 off).

    python benchmarks/timeline_training.py --preset lstm --config mid --out /tmp/timeline

CUPTI records every kernel of the process, the ones inside CUDA graphs and the ones CuPy and our ctypes cuBLAS
launch included. Per run it prints the step's span (first GPU activity to last), the busy time (union of the
kernels' and copies' intervals, so overlapping streams count once), the idle rest, the kernels grouped by name
(count, total, mean) and the longest idle gaps with what came before and after; the Chrome trace goes to --out.
The profiler adds a little time a launch; the harness (bench --train) times without it.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import engine  # noqa: E402
from engine.bench.configs import parse_configs  # noqa: E402
from engine.bench.training import CudnnTrain, EngineTrain, make_case  # noqa: E402

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def short(name: str, width: int = 70) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def summarize(events: list[dict], title: str, gaps: int = 8) -> list[str]:
    """The lines of one run's summary from its trace events (Chrome trace format, microseconds)."""
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATEGORIES), key=lambda e: e["ts"])
    if not gpu:
        return [f"## {title}: no GPU activity recorded"]
    start, end = gpu[0]["ts"], max(e["ts"] + e["dur"] for e in gpu)
    busy, cursor, idle = 0.0, start, []
    previous = None
    for e in gpu:
        s, f = e["ts"], e["ts"] + e["dur"]
        if s > cursor:
            idle.append((s - cursor, previous["name"] if previous else "-", e["name"]))
        if f > cursor:
            busy += f - max(s, cursor)
            cursor, previous = f, e
    streams = {e.get("args", {}).get("stream") for e in gpu}
    lines = [f"## {title}",
             f"span {(end - start) / 1e3:.2f} ms, GPU busy {busy / 1e3:.2f} ms, idle {(end - start - busy) / 1e3:.2f} "
             f"ms; {len(gpu)} GPU activities on {len(streams)} streams; kernel time summed "
             f"{sum(e['dur'] for e in gpu) / 1e3:.2f} ms",
             "", "| kernel | count | total ms | mean us |", "|---|---|---|---|"]
    groups = collections.defaultdict(list)
    for e in gpu:
        groups[e["name"]].append(e["dur"])
    for name, durs in sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:14]:
        lines.append(f"| {short(name)} | {len(durs)} | {sum(durs) / 1e3:.2f} | {np.mean(durs):.1f} |")
    gap_sizes = [g[0] for g in idle]
    if gap_sizes:
        lines += ["", f"idle gaps: {len(gap_sizes)}, median {np.median(gap_sizes):.2f} us, "
                      f"sum {sum(gap_sizes) / 1e3:.2f} ms; the longest:"]
        for size, before, after in sorted(idle, reverse=True)[:gaps]:
            lines.append(f"- {size:.0f} us after {short(before, 50)} before {short(after, 50)}")
    host = collections.Counter()
    host_us = collections.Counter()
    for e in events:
        if e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver":
            host[e["name"]] += 1
            host_us[e["name"]] += e.get("dur", 0)
    if host:
        lines += ["", "host API calls: " + ", ".join(f"{n} x{c} ({host_us[n] / 1e3:.2f} ms)"
                                                    for n, c in host.most_common(8))]
    return lines


def trace_step(impl, case, path: Path, warmup: int = 3) -> list[dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile
    impl.setup(case)
    try:
        for k in range(warmup):
            impl.step(k % len(case.inputs))
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            impl.step(0)
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(path))
    finally:
        impl.teardown()
    return json.loads(path.read_text())["traceEvents"]


def main(argv=None) -> int:
    import cupy
    import torch
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", action="append", default=None)
    parser.add_argument("--config", action="append", default=None)
    parser.add_argument("--out", default="benchmarks/results/timeline")
    parser.add_argument("--no-cudnn", action="store_true")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from engine.autodiff import fused_tape
    from engine.bench.implementation import tf32_flags
    for name in args.preset or ["lstm"]:
        preset = engine.preset(name)
        for config in parse_configs(args.config or ["mid"]):
            case = make_case(name, preset, preset.cell, config, xp=cupy, device="cuda")
            runs = [("fused-layers", EngineTrain("fused"), False), ("fused-wavefront", EngineTrain("fused"), True)]
            if not args.no_cudnn and preset.cudnn:
                runs.append(("cudnn-fp32", CudnnTrain(), None))
            for label, impl, wave in runs:
                if wave is not None:
                    fused_tape.WAVEFRONT = wave
                with tf32_flags(False):
                    events = trace_step(impl, case, out / f"{name}-{config.name}-{label}.json")
                print("\n".join(summarize(events, f"{name} {config.name} {label}")), "\n", flush=True)
                del events
            fused_tape.WAVEFRONT = True
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
