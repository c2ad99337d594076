"""IndRNN's pre-activations whose sign differs between the fused training forward (fp32, GPU) and a float64 forward
of the same inputs, layer by layer, in both wavefront modes: one flipped ReLU derivative moves every gradient below it
by ~1 / sqrt(B x T x H) (6e-4 at `mid`), which is what benchmarks/experiments/probe_training_error.py showed for IndRNN
at `mid` in the wavefront (benchmarks/NOTES.md, 2026-11-25 02:13).

    python benchmarks/experiments/probe_relu_flips.py [config]        # default mid
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cupy  # noqa: E402
import numpy as np  # noqa: E402

import engine  # noqa: E402
from engine.autodiff import fused_cache, fused_tape  # noqa: E402
from engine.bench.configs import parse_configs  # noqa: E402
from engine.bench.training import make_case  # noqa: E402

cfg = parse_configs([sys.argv[1] if len(sys.argv) > 1 else "mid"])[0]
p = engine.preset("indrnn")
case = make_case("indrnn", p, p.cell, cfg, xp=cupy, device="cuda")
x = cupy.asnumpy(case.inputs[0]).astype(np.float64)
T, B, _ = x.shape
for wave in (True, False):
    fused_cache.clear_cache()
    tape = fused_tape.record(case.network, case.params, case.inputs[0], None, poison=True, wavefront=wave)
    below = x.reshape(T * B, -1)
    flips = []
    for l, layer in enumerate(tape.program.layers):
        prm = {k: np.asarray(v, dtype=np.float64) for k, v in case.params.layers[l].items()}
        proj = below @ prm["W"].T
        h = np.zeros((B, prm["u"].shape[0]))
        outs = []
        for t in range(T):
            pre = proj[t * B:(t + 1) * B] + prm["u"] * h + prm["b"]
            h = np.maximum(pre, 0.0)
            outs.append(pre)
        pre64 = np.concatenate(outs)
        got = cupy.asnumpy(layer.output()).astype(np.float64)
        flip = ((got > 0) != (pre64 > 0))
        flips.append((int(flip.sum()), float(np.abs(pre64[flip]).max()) if flip.any() else 0.0))
        below = np.maximum(pre64, 0.0)
    tape.program.release()
    print("wavefront" if wave else "layers", "sign flips per layer (count, largest |pre| of a flip):", flips, flush=True)
