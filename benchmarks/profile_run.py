"""One schedule, one configuration, launched a few times: a target for ncu or nsys on the GPU machine.

    ncu --clock-control none -k regex:_persistent --launch-skip 1 --launch-count 1 --set full \
        python benchmarks/profile_run.py --preset lstm --config large --precision bfloat16

The first run compiles, uploads and checks the schedule against the fused backend (poisoned buffers); then
the schedule's own launch (`_launch`, no host-side copies) runs --launches more times.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.bench.configs import parse_configs  # noqa: E402
from engine.schedules import schedule_class  # noqa: E402
from engine.schedules.tiling import TileConfig  # noqa: E402


def case(cupy, preset: str, config: str, seed: int):
    """(network, params, x on the GPU) of a preset at a named configuration; params of seed 0, x normal of `seed`."""
    cfg = parse_configs([config])[0]
    network = engine.Network(engine.preset(preset).cell, cfg.input_size, cfg.hidden_size, cfg.num_layers)
    x = cupy.asarray(np.random.default_rng(seed).standard_normal((cfg.steps, cfg.batch, cfg.input_size)),
                     dtype=cupy.float32)
    return network, engine.init_params(network, seed=0), x


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="lstm")
    parser.add_argument("--config", default="mid")
    parser.add_argument("--schedule", default="persistent")
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--layers-per-launch", type=int, default=None)
    parser.add_argument("--launches", type=int, default=2)
    parser.add_argument("--sync", default=None, help="grid or layer (TileConfig.sync); default: the tiling's")
    parser.add_argument("--units", type=int, default=None, help="hidden units a block (TileConfig.units_per_block)")
    args = parser.parse_args(argv)
    import cupy

    from engine.backends import fused
    network, params, x = case(cupy, args.preset, args.config, seed=1)
    config = TileConfig(layers_per_launch=args.layers_per_launch, sync=args.sync, units_per_block=args.units)
    sched = schedule_class(args.schedule)(network, params, config=config, precision=args.precision)
    out = sched.run(x, poison=True).outputs
    ref = fused.prepare(network, params).run(x).outputs
    print(f"{sched.tiling.describe()}\nmax error / max |ref|: {float(cupy.abs(out - ref).max() / cupy.abs(ref).max()):.3g}")
    for _ in range(args.launches):
        for first in range(0, network.num_layers, sched.tiling.num_layers):
            sched._launch(x.shape[0], x.shape[1], first)
    cupy.cuda.Device().synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
