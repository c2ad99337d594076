"""A target for ncu: the sLSTM's persistent kernel in cluster mode (TileConfig(sync="cluster")), H = 768, B = 16,
bf16, compiled with line info, run three times (the first builds; profile a later launch). Where a step of ~3 us
spends its time beyond the ~0.5 us of MMAs (benchmarks/NOTES.md, 2026-11-26 22:35):

    ncu --kernel-name regex:persistent --launch-skip 1 --launch-count 1 --section WarpStateStats \
        --section SourceCounters --import-source yes python3 benchmarks/experiments/probe_cluster_ncu.py [H] [units]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import engine  # noqa: E402
from engine.codegen import nvrtc  # noqa: E402
from engine.schedules import schedule_class  # noqa: E402
from engine.schedules.tiling import TileConfig  # noqa: E402

nvrtc.OPTIONS = (*nvrtc.OPTIONS, "-lineinfo")       # source lines in ncu's stall sampling (not the engine's build)


def main() -> int:
    import cupy
    H = int(sys.argv[1]) if len(sys.argv) > 1 else 768
    units = int(sys.argv[2]) if len(sys.argv) > 2 else None
    network = engine.Network(engine.preset("slstm").cell, H, H, 1)
    params = engine.init_params(network, seed=0)
    x = cupy.asarray(np.random.default_rng(1).standard_normal((256, 16, H)).astype(np.float32))
    program = schedule_class("persistent")(network, params, precision="bfloat16",
                                           config=TileConfig(units, sync="cluster"))
    for _ in range(3):
        program.run(x, poison=True)
    cupy.cuda.Device().synchronize()
    print(program.tiling.describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
