"""The persistent schedule with each barrier (TileConfig.sync: grid, head, cluster with 8 and 16 blocks a cluster)
side by side: the sLSTM for issue #33's FlashRNN target (one layer, I = H = 512 and 768, 4 heads, B = 16, T = 1024,
bfloat16; and float32 at B = 3, the warp GEMV, where clusters do not apply), and the LSTM and GRU at I = H = 512,
B = 16 in bfloat16, whose cluster is the layer (issue #34's one-layer FlashRNN configuration). Each row is checked against the grid
barrier's outputs on poisoned buffers (head: bit-identical, only the waiting differs; cluster: the relative
difference, its GEMMs split K differently), then timed with CUDA events after warm-up, medians of alternating
rounds in one process.

    python3 benchmarks/probe_head_sync.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.bench.timing import cupy_timer, time_runs  # noqa: E402
from engine.schedules import schedule_class  # noqa: E402
from engine.schedules.tiling import TileConfig  # noqa: E402

CASES = [("slstm", 512, 16, "bfloat16"), ("slstm", 768, 16, "bfloat16"), ("slstm", 512, 3, "float32"),
         ("lstm", 512, 16, "bfloat16"), ("gru", 512, 16, "bfloat16")]


def configs(preset: str, H: int, B: int) -> dict:
    heads = preset == "slstm"
    out = {"grid": TileConfig(sync="grid")} | ({"head": TileConfig(sync="head")} if heads else {})
    if B > 4 and heads:
        out["cluster8"] = TileConfig(sync="cluster")
        out["cluster16"] = TileConfig(H // 4 // 16, sync="cluster")
    elif B > 4:                                     # a cluster is the layer: 16 blocks of H / 16 units
        out["cluster16"] = TileConfig(H // 16, sync="cluster")
    return out


def main(argv=None) -> int:
    import cupy
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--steps", type=int, default=1024)
    args = parser.parse_args(argv)
    T, rows = args.steps, []
    print("device", cupy.cuda.runtime.getDeviceProperties(0)["name"].decode())
    for preset, H, B, precision in CASES:
        network = engine.Network(engine.preset(preset).cell, H, H, 1)
        params = engine.init_params(network, seed=0)
        x = cupy.asarray(np.random.default_rng(1).standard_normal((T, B, H)).astype(np.float32))
        syncs = configs(preset, H, B)
        programs = {s: schedule_class("persistent")(network, params, precision=precision, config=c)
                    for s, c in syncs.items()}
        want = programs["grid"].run(x, poison=True).outputs.get()
        got = {s: programs[s].run(x, poison=True).outputs.get() for s in syncs}
        same = {s: bool(np.array_equal(got[s], want)) for s in syncs}
        diff = {s: float(np.linalg.norm(got[s] - want) / np.linalg.norm(want)) for s in syncs}
        samples = {s: [] for s in syncs}
        for _ in range(3):                                 # alternating rounds
            for s in syncs:
                samples[s].append(time_runs(lambda k, s=s: programs[s].run(x), cupy_timer, buffers=1, warmup=3,
                                            reps=15).median_ms)
        for s in syncs:
            row = {"preset": preset, "H": H, "B": B, "T": T, "precision": precision, "sync": s, "ms": float(np.median(samples[s])),
                   "rounds_ms": samples[s], "bit_identical_to_grid": same[s], "rel_diff_vs_grid": diff[s],
                   "tiling": programs[s].tiling.describe()}
            rows.append(row)
            print(f"{preset:5s} H={H} B={B} {precision:9s} sync={s:9s} {row['ms']:.3f} ms  identical={same[s]} "
                  f"diff={diff[s]:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
