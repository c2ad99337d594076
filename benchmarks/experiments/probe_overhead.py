"""Where a schedule's run spends the time outside its kernel: each host-side piece of `run` timed alone.

    python benchmarks/experiments/probe_overhead.py --preset lstm --config mid [--schedule persistent]

`probe_schedules.py` shows the whole run against the kernel alone (`_launch`); at `mid` the two differ by more
than the copies of x and the outputs should cost. This times, with CUDA events after warm-up (medians), the run,
the launch, and the pieces of the run one at a time: the input checks, the copy of x, the state initialisation,
the output copy and the final states; and the host time of one run (time.perf_counter around it, synchronised).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: probe_schedules

from probe_schedules import time_ms  # noqa: E402  (benchmarks/: CUDA events, median after warm-up)

import engine  # noqa: E402
from engine.backends.common import check_gpu_run_inputs  # noqa: E402
from engine.bench.configs import parse_configs  # noqa: E402
from engine.schedules import schedule_class  # noqa: E402


def host_ms(cupy, fn, repeats: int = 9) -> float:
    samples = []
    for _ in range(repeats):
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    cupy.cuda.Device().synchronize()
    return statistics.median(samples)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="lstm")
    parser.add_argument("--config", action="append", default=None)
    parser.add_argument("--schedule", default="persistent")
    args = parser.parse_args(argv)
    import cupy
    for cfg in parse_configs(args.config or ["mid"]):
        network = engine.Network(engine.preset(args.preset).cell, cfg.input_size, cfg.hidden_size, cfg.num_layers)
        params = engine.init_params(network, seed=0)
        x = cupy.asarray(np.random.default_rng(1).standard_normal((cfg.steps, cfg.batch, cfg.input_size)),
                         dtype=cupy.float32)
        sched = schedule_class(args.schedule)(network, params)
        sched.run(x)
        T, B = cfg.steps, cfg.batch
        out = sched.buffers[-1][sched.plan_.program.output_buffer]
        pieces = {
            "run": lambda: sched.run(x),
            "launch(es)": lambda: [sched._launch(T, B, f) for f in range(0, cfg.num_layers, sched.tiling.num_layers)],
            "input checks": lambda: check_gpu_run_inputs("probe", cupy, network, x, None),
            "copy of x": lambda: sched.x_device.__setitem__(Ellipsis, x.reshape(T * B, cfg.input_size)),
            "state init": lambda: sched._init_states(None),
            "output copy": lambda: out.reshape(T, B, network.output_size).copy(),
        }
        print(f"{args.preset} {cfg.name} {args.schedule}: {sched.tiling.describe()}")
        for name, fn in pieces.items():
            print(f"  {name:14s} GPU {time_ms(fn, 2, 9):8.3f} ms   host {host_ms(cupy, fn):8.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
