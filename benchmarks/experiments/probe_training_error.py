"""How far the fused training step's gradients are from float64, gradient by gradient, for the harness's own cases
(engine.bench.training.make_case: seed 0), in both wavefront modes, with the work buffers poisoned or not:

    python benchmarks/experiments/probe_training_error.py indrnn:mid indrnn:blogB lstm:mid

Prints the x gradient's norm-relative error and each parameter gradient's that is over 1e-5 (layer, name)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cupy  # noqa: E402
import numpy as np  # noqa: E402

import engine  # noqa: E402
from engine.autodiff import fused_cache, fused_tape  # noqa: E402
from engine.bench.configs import parse_configs  # noqa: E402
from engine.bench.training import _grad_list, make_case, reference_gradients  # noqa: E402


def relative(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main(cases: list[str]) -> int:
    for item in cases or ["indrnn:mid"]:
        name, config_name = item.split(":")
        config = parse_configs([config_name])[0]
        preset = engine.preset(name)
        case = make_case(name, preset, preset.cell, config, xp=cupy, device="cuda")
        want_x, want = reference_gradients(case)
        want_x, want = cupy.asnumpy(want_x), [cupy.asnumpy(g) for g in want]
        labels = [(l, p.name) for l in range(case.network.num_layers) for p in preset.cell.params]
        for wavefront in (True, False):
            for poison in (True, False):
                fused_cache.clear_cache()
                tape = fused_tape.record(case.network, case.params, case.inputs[0], None, poison=poison,
                                    wavefront=wavefront)
                got = tape.backward(case.weights)
                errors = [relative(cupy.asnumpy(g), w) for g, w in zip(_grad_list(case.network, got.params), want)]
                bad = ", ".join(f"{labels[i]} {e:.1e}" for i, e in enumerate(errors) if e > 1e-5)
                print(f"{name} {config_name} wavefront={wavefront} poison={poison}: x {relative(cupy.asnumpy(got.x), want_x):.1e}; "
                      f"params max {max(errors):.1e}{'; over 1e-5: ' + bad if bad else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
