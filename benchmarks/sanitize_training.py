"""One fused training step of each named preset under compute-sanitizer (memcheck, racecheck, initcheck), small
sizes, B = 1 and 2 (the fused stages) and B = 3 (cuBLAS with the split-K sums):

    compute-sanitizer --tool memcheck python benchmarks/sanitize_training.py lstm_fgr gru_cho
    compute-sanitizer --tool racecheck python benchmarks/sanitize_training.py --persistent lstm_proj   # + B = 6

--persistent: the forward as persistent launches (engine/autodiff/persistent.py), B = 6 too (its GEMM for more than
4 rows). Exits non-zero if a gradient is off the float64 reference (the sanitizer reports its own findings)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import cupy  # noqa: E402
import numpy as np  # noqa: E402

import engine  # noqa: E402
from engine.autodiff import bptt, fused_tape, persistent  # noqa: E402


def main(args: list[str]) -> int:
    persistent.PERSISTENT = "--persistent" in args
    names = [a for a in args if not a.startswith("--")]
    bad = 0
    for name in names or ["lstm_fgr"]:
        cell = engine.preset(name).cell
        for B in (1, 2, 3) + ((6,) if persistent.PERSISTENT else ()):
            network = engine.Network(cell, 8, 16, 2, proj_size=8 if cell.uses_projection else None)
            params = engine.init_params(network, seed=B)
            rng = np.random.default_rng(B)
            x = rng.standard_normal((4, B, 8))
            d_out = rng.standard_normal((4, B, network.output_size))
            want = bptt(network, params, x, None, d_out)
            tape = fused_tape.record(network, params, cupy.asarray(x, dtype=cupy.float32), None, poison=True)
            if persistent.PERSISTENT and tape.program.persistent is None:
                print(f"{name} B={B}: the forward did not run persistent")
                bad += 1
            got = tape.backward(cupy.asarray(d_out, dtype=cupy.float32))
            for p, value in want.params[0].items():
                error = np.linalg.norm(got.params[0][p].get() - value) / max(np.linalg.norm(value), 1e-2)
                if not error < 2e-4:
                    print(f"{name} B={B} {p}: relative error {error:.2e}")
                    bad += 1
            print(f"{name} B={B}: step done")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
