"""Host time of a fused training step's phases (engine/autodiff/fused_tape.py), without a profiler: each phase's
function wrapped with time.perf_counter, medians over --steps steps after warm-up. The GPU runs behind the host; a
phase's time is the host's alone (the launches it queues, not their GPU time).

    python benchmarks/probe_host_phases.py --preset lstm --config lat --config blogB
    python benchmarks/probe_host_phases.py --preset lstm --config lat --cprofile 25   # + cProfile's top 25 by own time
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import importlib  # noqa: E402

import numpy as np  # noqa: E402
from probe_fused_training import probe_case  # noqa: E402  (benchmarks/, the script's folder)

from engine.autodiff import fused_layer, fused_program, fused_runner, fused_tape  # noqa: E402
from engine.bench.configs import parse_configs  # noqa: E402

bptt_module = importlib.import_module("engine.autodiff.bptt")

PHASES = [(bptt_module, "record", "bptt.record (all of the forward call)"),
          (bptt_module, "check_network", "  check_network"),
          (bptt_module, "check_params", "  check_params"),
          (bptt_module, "check_inputs", "  check_inputs"),
          (bptt_module, "inputs_named", "  inputs_named"),
          (bptt_module, "FiniteCheck", "  FiniteCheck (launch)"),
          (bptt_module, "derived", "  derived (the backward split, cached)"),
          (bptt_module, "check_bptt_memory", "  check_bptt_memory"),
          (fused_tape, "record", "fused_tape.record (after the checks)"),
          (fused_tape, "acquire", "acquire (program cache)"),
          (fused_program.Program, "load", "Program.load (copies, layouts)"),
          (fused_runner.Runner, "copy", "Runner.copy (table, upload, launch)"),
          (fused_layer.Layer, "lay_out_weights", "Layer.lay_out_weights"),
          (fused_program.Program, "forward", "Program.forward (graph launches)"),
          (fused_tape.FusedTape, "backward", "FusedTape.backward (all of it)"),
          (fused_tape, "start_backward", "  start_backward (checks, FiniteCheck)"),
          (fused_tape.FusedTape, "_seed_states", "  FusedTape._seed_states"),
          (fused_tape, "gradient_views", "  gradient_views"),
          (fused_program.Program, "backward", "Program.backward (graph launches)"),
          (fused_tape.FusedTape, "_after", "FusedTape._after (gradient GEMMs, a layer)"),
          (fused_program.Program, "after", "Program.after (the captured after part)"),
          (fused_tape, "zero_gradients", "zero_gradients")]
ORIGINALS: dict = {}         # (owner, attribute) -> the function before main wrapped it


def main(argv=None) -> int:
    import cupy
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", action="append", default=None)
    parser.add_argument("--config", action="append", default=None)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--cprofile", type=int, default=0, metavar="N",
                        help="also run --steps steps under cProfile (without the phase timers' wrappers) and print "
                             "its top N functions by own time and by cumulative time")
    args = parser.parse_args(argv)
    times: dict = defaultdict(list)
    for owner, attr, label in PHASES:
        original = ORIGINALS[(owner, attr)] = getattr(owner, attr)

        def timed(*a, __original=original, __label=label, **k):
            t0 = time.perf_counter()
            try:
                return __original(*a, **k)
            finally:
                times[__label].append((time.perf_counter() - t0) * 1e3)
        setattr(owner, attr, timed)
    for name in args.preset or ["lstm"]:
        for config in parse_configs(args.config or ["lat"]):
            network, gpu_params, x, w = probe_case(cupy, name, config)
            walls = []
            for step in range(args.steps + 3):
                if step == 3:
                    times.clear()
                cupy.cuda.Device().synchronize()
                t0 = time.perf_counter()
                bptt_module.record(network, gpu_params, x, dtype=np.float32, backend="fused").backward(w)
                host = (time.perf_counter() - t0) * 1e3
                cupy.cuda.Device().synchronize()
                walls.append(((time.perf_counter() - t0) * 1e3, host))
            walls = walls[3:]
            print(f"## {name} {config.name}: step wall {statistics.median(w for w, _ in walls):.2f} ms, host until "
                  f"the call returns {statistics.median(h for _, h in walls):.2f} ms (medians of {args.steps})")
            print("| phase | calls a step | host ms a step (median) |\n|---|---|---|")
            for _, _, label in PHASES:
                values = times.get(label, [])
                if values:
                    per = len(values) // args.steps
                    chunks = [sum(values[i * per:(i + 1) * per]) for i in range(args.steps)] if per else values
                    print(f"| {label} | {per} | {statistics.median(chunks):.3f} |")
            times.clear()
            if args.cprofile:
                profile_steps(cupy, network, gpu_params, x, w, args.steps, args.cprofile)
    return 0


def profile_steps(cupy, network, gpu_params, x, w, steps: int, top: int) -> None:
    """cProfile over `steps` steps, the phase wrappers taken off first (they would show as the callers)."""
    import cProfile
    import io
    import pstats
    wrapped = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in PHASES]
    for owner, attr, _ in PHASES:
        setattr(owner, attr, ORIGINALS[(owner, attr)])
    try:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(steps):
            bptt_module.record(network, gpu_params, x, dtype=np.float32, backend="fused").backward(w)
        cupy.cuda.Device().synchronize()
        profiler.disable()
    finally:
        for owner, attr, fn in wrapped:
            setattr(owner, attr, fn)
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(key).print_stats(top)
        print(f"### cProfile, {steps} steps, by {key}\n```")
        print("\n".join(line for line in out.getvalue().splitlines()[4:] if line.strip()))
        print("```")


if __name__ == "__main__":
    sys.exit(main())
