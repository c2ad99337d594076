"""Runs the persistent schedule once on small configurations, for compute-sanitizer (memcheck, racecheck).

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_persistent.py
    compute-sanitizer --tool racecheck python3 benchmarks/sanitize_persistent.py

Two LSTM networks of two layers, one per GEMM shape of kernels/tile_gemm.cuh: B=3 (the warp GEMV) and
B=16 (register tiles, split K, a cp.async pipeline), plus one layer by layer (TileConfig(layers_per_launch=1)) and
both with per-layer arrival counters instead of grid barriers (TileConfig(sync="layer"));
then the tensor-core MMA of kernels/mma_gemm.cuh in bf16 (B=16 and B=40: split K, and three row tiles with
streamed 16-bit weights) and tf32 (B=16); and the bulk-copy pipeline (sizes in whole chunks of 64 columns: bf16
with resident weights, fp16 with streamed chunked weights; then fed by a warp of its own, also beside three MMA
warps with several passes each; and on wgmma with two feed warps, TileConfig(stream_wgmma=True)); last, 8x8 register tiles at B=64 whose K split sums its
parts through shared memory in four rounds (kernels/tile_gemm.cuh, rnn_store_tile); and the LayerNorm LSTM, whose
reductions cross the blocks through partial sums (engine/codegen/reductions.py: staged in shared memory at B=16,
read from L2 under the warp GEMV at B=3, and in bf16); and the sLSTM, whose blocks read only their own head of
the recurrent weight (engine/schedules/heads.py gemm_heads: the warp GEMV at B=3, the bulk pipeline in bf16 at
B=16), with per-head arrival counters (TileConfig(sync="head")) and as thread-block clusters exchanging h through
distributed shared memory (TileConfig(sync="cluster"): 8 and 16 blocks a cluster, and an LSTM whose cluster is the
layer; on an H100 / H200 the step GEMMs of these run on wgmma with the weights in registers and exchange h by
st.async pushes, a GRU-Cho exchanges by the pull (its r * h is read in the step that writes it), and one LSTM takes
the mma.sync path with TileConfig(wgmma=False)). `python3 benchmarks/sanitize_persistent.py cluster` runs the cluster
cases alone. Each run is checked against the reference (emulating the mode), so a clean report is also a correct one.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.backends import reference  # noqa: E402
from engine.schedules import schedule_class  # noqa: E402
from engine.schedules.tiling import TileConfig  # noqa: E402


def main() -> int:
    worst = 0.0
    small, whole = (24, 40), (64, 64)
    runs = [(3, TileConfig(), "float32", small), (16, TileConfig(), "float32", small),
            (16, TileConfig(layers_per_launch=1), "float32", small), (3, TileConfig(sync="layer"), "float32", small),
            (16, TileConfig(sync="layer"), "float32", small), (16, TileConfig(), "bfloat16", small),
            (40, TileConfig(resident=False), "bfloat16", small), (16, TileConfig(), "tf32", small),
            (16, TileConfig(), "bfloat16", whole), (40, TileConfig(resident=False), "float16", whole),
            (16, TileConfig(feed_warp=True), "bfloat16", whole),       # the bulk pipeline fed by a warp of its own
            (48, TileConfig(8, threads=128, warp_tile=(1, 1), feed_warp=True), "bfloat16", whole),   # several passes
            (16, TileConfig(stream_wgmma=True), "bfloat16", whole),    # the step GEMMs on wgmma, weights streamed
            (40, TileConfig(stream_wgmma=True), "float16", whole),
            (64, TileConfig(16, 8, 8, threads=256), "float32", whole)]
    runs = [("lstm", *run) for run in runs] + [("ln_lstm", 3, TileConfig(), "float32", small),
                                                ("ln_lstm", 16, TileConfig(), "float32", small),
                                                ("ln_lstm", 16, TileConfig(), "bfloat16", whole),
                                                ("slstm", 3, TileConfig(), "float32", (64, 256)),     # heads: GEMV
                                                ("slstm", 16, TileConfig(), "bfloat16", (64, 256)),   # heads: bulk
                                                ("slstm", 16, TileConfig(sync="head"), "bfloat16", (64, 256)),
                                                ("slstm", 16, TileConfig(sync="cluster"), "bfloat16", (64, 256)),
                                                ("slstm", 16, TileConfig(4, sync="cluster"), "bfloat16", (64, 256)),
                                                ("lstm", 16, TileConfig(sync="cluster"), "bfloat16", small),
                                                ("lstm", 16, TileConfig(sync="cluster", wgmma=False), "bfloat16",
                                                 (64, 256)),
                                                ("lstm", 16, TileConfig(sync="cluster"), "bfloat16", (64, 256)),
                                                # r * h read in the step that writes it: the pull exchange
                                                ("gru_cho", 16, TileConfig(16, sync="cluster"), "bfloat16", (64, 256)),
                                                ("lstm", 19, TileConfig(), "float32x3", small),         # split MMAs
                                                ("lstm", 33, TileConfig(resident=False), "float32x3", small)]
    only = sys.argv[1] if len(sys.argv) > 1 else None   # "bfloat16", "ln_lstm", "cluster": a precision's, a cell's
    for name, batch, config, precision, (I, H) in runs:
        if only and only not in (precision, name, config.sync):
            continue
        network = engine.Network(engine.preset(name).cell, I, H, 2)
        params = engine.init_params(network, seed=batch)
        x = np.random.default_rng(batch).standard_normal((5, batch, I))
        ref = reference.run(network, params, x, None, dtype=np.float64, precision=precision).outputs
        out = schedule_class("persistent")(network, params, config=config, precision=precision).run(
            x, poison=True).outputs
        err = float(np.abs(out - ref).max() / np.abs(ref).max())
        worst = max(worst, err / (1e-4 if precision in ("float32", "float32x3") else 2e-3))      # > 1: wrong
        print(f"persistent {name} I={I} H={H} L=2 T=5 B={batch} {config.label()} {precision}: "
              f"max relative error {err:.2e}")
    return 0 if worst < 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
