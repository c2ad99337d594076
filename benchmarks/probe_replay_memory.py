"""Whether a program replayed from CUDA graphs gives its device memory back when it is dropped (engine/chunk_replay.py:
CuPy 14.2 keeps the cached blocks of a MemoryPool that is dropped; NOTES 2026-11-28 06:18).

    python3 benchmarks/probe_replay_memory.py [--steps 1000] [--rounds 3]

A GRU of 4 layers, I = H = 512, B = 64 (`mid`'s) at T steps: per mode (the fused backend in tf32 and float32x3, the
strict fused backend), `rounds` times: prepare, run three times (the second and third are replays), drop the
program, collect, free CuPy's default pool; the device's free memory printed after each. A leak shows as free
memory that falls round after round; the last line says whether it fell by more than 1 % of the device.
"""
from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import engine  # noqa: E402
from engine.backends import fused  # noqa: E402
from engine.params import init_params  # noqa: E402
from engine.schedules import fused_modes  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import cupy

    def free_gib() -> float:
        gc.collect()
        cupy.get_default_memory_pool().free_all_blocks()
        return cupy.cuda.runtime.memGetInfo()[0] / 2 ** 30

    network = engine.Network(engine.preset("gru").cell, 512, 512, 4)
    params = init_params(network, seed=0)
    x = cupy.asarray(np.random.default_rng(0).standard_normal((args.steps, 64, 512)), dtype=cupy.float32)
    makers = {"fused tf32": lambda: fused_modes.prepare(network, params, precision="tf32"),
              "fused float32x3": lambda: fused_modes.prepare(network, params, precision="float32x3"),
              "fused fp32": lambda: fused.prepare(network, params)}
    start = free_gib()
    print(f"free at the start: {start:.2f} GiB", flush=True)
    for label, make in makers.items():
        for round_ in range(args.rounds):
            program = make()
            for _ in range(3):
                program.run(x)
            cupy.cuda.Device().synchronize()
            replayed = str(getattr(program, "replayed", ""))[:60]
            del program
            print(f"{label}, round {round_ + 1}: {free_gib():.2f} GiB free after the program is dropped ({replayed})",
                  flush=True)
    end = free_gib()
    total = cupy.cuda.runtime.memGetInfo()[1] / 2 ** 30
    verdict = "LEAKS" if start - end > 0.01 * total else "gives its memory back"
    print(f"free at the end: {end:.2f} GiB (start {start:.2f}): {verdict}")


if __name__ == "__main__":
    main()
