"""The fused backend's mode path (engine/schedules/fused_modes.py) on a small case for compute-sanitizer: GRU-Cho
(two stages, so two kernels write operand copies), I = 37, H = 129 (rows of odd length: the projections' chunks start
at addresses that are not 256-byte aligned), three layers on their streams, T = 11 in chunks, B = 5, given initial
states and lengths, a poisoned direct run and then a replayed one, each checked against the reference's emulation of
the mode.

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_fused_modes.py bfloat16
    compute-sanitizer --tool racecheck python3 benchmarks/sanitize_fused_modes.py tf32
    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_fused_modes.py float32x3 48
    compute-sanitizer --tool racecheck python3 benchmarks/sanitize_fused_modes.py bfloat16 wgmma

float32x3 takes the K chunk of its accumulators second (48: H = 129 in chunks of 44, 44 and 41, a strided batch and
a rest; engine/schedules/split_products.py); on sm_90 its step products in fp16 parts run on the wgmma kernel
(engine/schedules/wgmma_products.py: every dimension padded to its tiles here; a grid this small takes the kernel
with two warpgroups a block), and the line printed says which product ran; tf32 holds its step operands as shifted
fp16 (engine/schedules/tf32_fp16.py), as the line says.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.schedules import fused_modes  # noqa: E402


def main() -> int:
    import cupy
    mode = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
    network = engine.Network(engine.preset("gru_cho").cell, 37, 129, 3)
    params = engine.init_params(network, seed=0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((11, 5, 37))
    initial = {"h": rng.uniform(-0.8, 0.8, (3, 5, 129))}
    lengths = np.array([11, 4, 1, 9, 11])
    want = engine.run(network, params, x, initial, backend="reference", dtype=np.float64, precision=mode,
                      lengths=lengths)
    options = {"x3_chunk": int(sys.argv[2])} if mode == "float32x3" and len(sys.argv) > 2 else {}
    if mode != "float32x3" and len(sys.argv) > 2:
        options = {"step_product": sys.argv[2]}        # e.g. wgmma: the engine's kernel for the mode's products
    program = fused_modes.prepare(network, params, precision=mode, **options)
    worst = 0.0
    for poison in (True, False, False):                  # direct (poisoned), direct, then captured and replayed
        got = program.run(x.astype(np.float32), initial, poison=poison, lengths=lengths)
        error = float(np.abs(cupy.asnumpy(got.outputs) - want.outputs).max() / np.abs(want.outputs).max())
        product = f", step_product {got.info['step_product']}" + (
            f", tf32_storage {got.info['tf32_storage']}" if mode == "tf32" else "")
        print(f"fused {mode} ({got.info['replayed']}{product}): max relative error {error:.2e} against the emulation")
        worst = max(worst, error)
    return 0 if worst < 1e-2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
