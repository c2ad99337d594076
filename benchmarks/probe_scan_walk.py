"""Probe: the minGRU scan in one pass (scan_kernel's scan_walk: a block per 32 chains walks the whole sequence in
tiles, the GEMM output read once) against the three passes (the GEMM output read twice), for issue #33's 10x target;
the walk through run_arrays's general path and through scan.WalkCall (the GEMM and the walk issued alone).
One layer, I = H = 512, T = 4096, B = 1, 2, 4, 8, 16 (512-8192 chains), float32 (TF32 off); CUDA-event medians of
the whole call after warm-up; each output checked against the float64 reference (poisoned first) and rerun for
bit-identity. Then, at B = 8, where the call's time goes: each piece timed as the call sees it and on the GPU
alone (the events recorded behind a 2 ms spin kernel, so that the host has issued everything before the first
event runs): the whole call, the GEMM, the walk and the three passes on the GEMM's output. Last, the gradients'
walk back (scan_walk_back) in four shapes, forward + backward timed whole.

    python3 benchmarks/probe_scan_walk.py [--out DIR]
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))           # benchmarks/: the scan probe's case
os.environ.setdefault("CUPY_TF32", "0")

from probe_scan_forward import median_ms, mingru_case  # noqa: E402

import engine  # noqa: E402
from engine.schedules import scan, scan_kernel, scan_values  # noqa: E402

SHAPES = ((16, 8), (16, 16))


def main() -> int:
    import cupy
    out_dir = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else None
    T, H = 4096, 512
    rows = []
    print("device", cupy.cuda.runtime.getDeviceProperties(0)["name"].decode())
    print(f"{'B':>3s} {'form':>17s} {'call ms':>9s} {'rel err':>9s} {'rerun':>6s}")
    for B in (1, 2, 4, 8, 16):
        network, x, program = mingru_case(T, B, H)
        params = engine.init_params(network, seed=0)
        want = engine.run(network, params, cupy.asnumpy(x).astype(np.float64), backend="reference",
                          dtype=np.float64).outputs
        scale = float(np.abs(want).max())
        forms = [("passes", False, (16, 16), False)] + [(f"walk {w}x{u}{' call' if call else ''}", True, (w, u), call)
                                                        for w, u in SHAPES for call in (False, True)]
        for name, force, shape, call in forms:
            scan.FORCE_WALK, scan_kernel.WALK = force, shape
            program.walk = scan.WalkCall(program) if call else None      # made with this shape's kernel
            first = program.run(x, poison=True).outputs
            error = float(np.abs(cupy.asnumpy(first) - want).max()) / scale
            same = bool((program.run(x, poison=True).outputs == first).all())
            ms = median_ms(lambda: program.run(x))
            rows.append({"B": B, "form": name, "ms": ms, "rel_err": error, "bit_identical": same})
            print(f"{B:3d} {name:>17s} {ms:9.3f} {error:9.2e} {str(same):>6s}", flush=True)
    scan.FORCE_WALK, scan_kernel.WALK = None, (16, 16)
    rows.extend(pieces(cupy, 4096, 8, 512))
    rows.extend(backward_shapes(cupy, 4096, 8, 512))
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "probe_scan_walk.json").write_text(json.dumps(rows, indent=1))
    return 0


SPIN = r"""extern "C" __global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {}
}"""


def pieces(cupy, T, B, H) -> list[dict]:
    """The B = 8 call in pieces, each timed as called and behind the spin kernel (GPU time alone)."""
    spin = cupy.RawKernel(SPIN, "spin")
    network, x, program = mingru_case(T, B, H)
    cell, plan, p0 = network.cell, program.plan, program.params[0]
    rows_x = x.reshape(T * B, H)

    def env_blocks():
        env = {n.name: rows_x for n in cell.nodes if n.op == "input"}
        return env, scan_values.grouped_matmuls(cell, plan.found.free, env, p0, cupy, plan.groups)
    env, blocks = env_blocks()
    initial = cupy.zeros((B, H), dtype=cupy.float32)

    def inline():
        scan._inline_scan(plan, cell, env, blocks, p0, T, B, H, initial, np.float32, cupy, False)
    parts = (("call", None, lambda: program.run(x)), ("GEMM", None, env_blocks), ("walk", True, inline),
             ("passes", False, inline))
    out = []
    print(f"B = {B}: {'piece':>8s} {'as called':>10s} {'GPU alone':>10s} (ms)")
    for name, walk, run in parts:
        scan.FORCE_WALK = walk
        called = median_ms(run)

        def behind_spin(run=run):
            spin((1,), (1,), (np.int64(3_500_000),))          # ~2 ms at 1.75-1.98 GHz
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            run()
            end.record()
            end.synchronize()
            return cupy.cuda.get_elapsed_time(start, end)
        for _ in range(3):
            behind_spin()
        alone = float(np.median([behind_spin() for _ in range(20)]))
        out.append({"B": B, "piece": name, "as_called_ms": called, "gpu_alone_ms": alone})
        print(f"{'':7s}{name:>8s} {called:10.3f} {alone:10.3f}", flush=True)
    scan.FORCE_WALK = None
    return out


def backward_shapes(cupy, T, B, H) -> list[dict]:
    """The gradients' walks (scan_grad.walk_gradients) at B = 8 with scan_walk_back in several shapes: forward +
    backward timed whole (parameters on the GPU), the parameters' gradients checked against the first shape's."""
    from engine.schedules import scan_backward_kernel, scan_grad
    network, x, _ = mingru_case(T, B, H)
    params = engine.init_params(network, seed=0)
    params = engine.Params([{k: cupy.asarray(v, dtype=cupy.float32) for k, v in layer.items()} for layer in params.layers])
    d_out = cupy.asarray(np.random.default_rng(2).standard_normal((T, B, H)), dtype=cupy.float32)
    out, first = [], None
    print(f"B = {B}, forward + backward: {'walk back':>10s} {'ms':>8s} {'max diff':>9s}")
    for shape in ((16, 8), (32, 4), (8, 16), (16, 16)):
        scan_backward_kernel.BACK = scan_grad.BACK = shape
        scan_backward_kernel.walk_back_source.cache_clear()

        def run():
            return scan_grad.scan_gradients(network, params, x, None, d_out, dtype=np.float32, xp=cupy)
        got = cupy.asnumpy(run().params[0]["W_z"])
        first = got if first is None else first
        diff = float(np.abs(got - first).max() / np.abs(first).max())
        ms = median_ms(run)
        out.append({"B": B, "walk_back": list(shape), "forward_backward_ms": ms, "rel_diff_W_z": diff})
        print(f"{'':30s} {shape[0]:>4d} x {shape[1]:<3d} {ms:8.3f} {diff:9.2e}", flush=True)
    scan_backward_kernel.BACK = scan_grad.BACK = (16, 8)
    scan_backward_kernel.walk_back_source.cache_clear()
    return out


if __name__ == "__main__":
    raise SystemExit(main())
