"""The scan that walks (scan_kernel's scan_walk through scan.WalkCall) and its gradients' walk back (scan_walk_back)
on a small case for compute-sanitizer: minGRU, I = 7, H = 300, two layers, T = 300 (the forward's tiles of 256
steps: one and a part; the walk back's of 128: two and a part), B = 5 (47 blocks, the last with 28 live lanes), given
initial states and a final states' adjoint, poisoned output, checked against the float64 reference.

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_scan.py
    compute-sanitizer --tool racecheck python3 benchmarks/sanitize_scan.py
    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_scan.py bfloat16     # a precision mode's GEMMs

In a reduced mode the errors are checked against the reference's emulation of the mode (engine.rounding).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.schedules import scan  # noqa: E402


def main() -> int:
    import cupy
    mode = sys.argv[1] if len(sys.argv) > 1 else "float32"
    scan.FORCE_WALK = True
    network = engine.Network(engine.preset("mingru").cell, 7, 300, 2)
    params = engine.init_params(network, seed=0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 5, 7))
    initial = {"h": rng.uniform(-0.8, 0.8, (2, 5, 300))}
    program = scan.prepare(network, params, precision=mode)
    if program.walk is None:
        raise SystemExit("minGRU did not take scan.WalkCall")
    got = program.run(x.astype(np.float32), initial, poison=True)
    want = engine.run(network, params, x, initial, backend="reference", dtype=np.float64, precision=mode)
    error = float(np.abs(cupy.asnumpy(got.outputs) - want.outputs).max() / np.abs(want.outputs).max())
    print(f"scan_walk through WalkCall ({mode}): max relative error {error:.2e} against float64"
          + (f" in the {mode} emulation" if mode != "float32" else ""))
    from engine.schedules.scan_grad import scan_gradients
    d_out, d_final = rng.standard_normal((300, 5, 300)), {"h": rng.standard_normal((2, 5, 300))}
    grads = scan_gradients(network, params, cupy.asarray(x, dtype=cupy.float32), initial,
                           cupy.asarray(d_out, dtype=cupy.float32), d_final, dtype=np.float32, xp=cupy, precision=mode)
    step = engine.bptt(network, params, x, initial, d_outputs=d_out, d_final_states=d_final, precision=mode)
    worst = max(float(np.abs(cupy.asnumpy(grads.params[layer][name]) - value).max() / np.abs(value).max())
                for layer in range(2) for name, value in step.params[layer].items())
    print(f"scan_walk_back: max relative error of the parameters' gradients {worst:.2e} against float64")
    bound = 1e-5 if mode == "float32" else 2e-3        # the emulation's fp32 sums (tests/gpu/test_scan_modes_gpu.py)
    return 0 if error < bound and worst < 2 * bound else 1


if __name__ == "__main__":
    raise SystemExit(main())
