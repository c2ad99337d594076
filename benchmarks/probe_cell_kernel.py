"""The fused backend's generated cell kernel alone, T launches chained in one CUDA graph, in variants of its index
scheme (issue #34: under ncu on an H100, 2026-11-28, the LSTM's cell kernel at `large` took 5.5 us of a ~14 us
step, moving 4.7 MB at ~0.9 TB/s with the SMs 17 % busy; NOTES 2026-11-28 00:40).

Variants of the generated LSTM kernel (bf16 operand copies, as engine.run(backend="fused", precision="bfloat16")
builds it), made by editing its loop header only, so the body is the generator's:
- `generated`: one thread per (b, j) over a 1-D grid-stride loop, b = idx / H (a 64-bit division by a runtime H);
- `rows in y`: blockIdx.y walks the batch rows and x the units, no division;
- `rows in y, 2 a thread`: as above, each thread two units blockDim.x apart (more loads in flight a thread);
- `rows in y, 128 threads`: as `rows in y` with blocks of 128;
- `no math` (a question, not a candidate: its outputs differ): the loads and stores with the gates' sigmoid and
  tanh taken out, to see what the math's latency costs;
- `fast math` (the same question): sigmoid and tanh from __expf and __fdividef.
And `copy`: a kernel that reads and writes one (B, H) float array, the floor of one launch in a chain.

Inputs are random normal; each variant's outputs after one launch are compared with the generated kernel's
(they must be bit-identical: same math, same order). Medians of CUDA-event intervals after warm-up.

    python3 benchmarks/probe_cell_kernel.py --out /tmp/probe
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_chain import graph_ms  # noqa: E402

CASES = [("large", 1024, 128, 100), ("blogA", 2560, 64, 200), ("B=16 H=512", 512, 16, 1024)]
HEADER = """    const long total = (long)B * H;
    for (long idx = (long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (long)gridDim.x * blockDim.x) {
        const long b = idx / H;
        const int j = (int)(idx - b * H);
"""
ROWS_IN_Y = """    for (long b = blockIdx.y; b < B; b += gridDim.y)
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < H; j += gridDim.x * blockDim.x) {
"""
TWO_A_THREAD = """    for (long b = blockIdx.y; b < B; b += gridDim.y)
    for (int j0 = blockIdx.x * blockDim.x * 2 + threadIdx.x; j0 < H; j0 += gridDim.x * blockDim.x * 2)
    #pragma unroll
    for (int u = 0; u < 2; ++u) {
        const int j = j0 + u * blockDim.x;
        if (j >= H) continue;
"""
FAST = """__device__ __forceinline__ float fast_sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }
__device__ __forceinline__ float fast_tanh(float x) { return 1.0f - __fdividef(2.0f, __expf(2.0f * x) + 1.0f); }
"""
COPY = r"""
extern "C" __global__ void probe_copy(const float* __restrict__ a, float* __restrict__ b, const int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) b[i] = a[i] + 1.0f;
}
"""


def sources():
    from engine import gallery
    from engine.codegen import GENERATOR_VERSION
    from engine.codegen.operand_copies import operand_copies, render_copies_module
    from engine.compiler import make_plan
    from engine.network import Network

    network = Network(gallery.get("lstm").cell, input_size=64, hidden_size=64)
    program = make_plan(network, 4, 4).program
    source = render_copies_module(program, "bfloat16", operand_copies(program, "bfloat16"), GENERATOR_VERSION)
    name = program.kernels[0].name
    if source.count(HEADER) != 1:
        raise SystemExit("the generated kernel's loop header changed; update this probe")
    name = program.kernels[0].name
    body = source.replace(HEADER, ROWS_IN_Y)
    at = body.index(f'extern "C" __global__ void {name}(')          # the kernel, after the inlined helpers
    helpers, kernel = body[:at], body[at:]
    plain = helpers + kernel.replace("sigmoidf_(", "(").replace("tanhf(", "(")
    fast = helpers + FAST + kernel.replace("sigmoidf_(", "fast_sigmoid(").replace("tanhf(", "fast_tanh(")
    return name, {"generated": source, "rows in y": source.replace(HEADER, ROWS_IN_Y),
                  "rows in y, 2 a thread": source.replace(HEADER, TWO_A_THREAD),
                  "rows in y, 128 threads": body, "no math": plain, "fast math": fast}


def main() -> None:
    import cupy

    from engine.codegen.nvrtc import load_module

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--reps", type=int, default=11)
    args = ap.parse_args()
    name, variants = sources()
    functions = {v: load_module(s, cell=f"probe_{k}").get_function(name) for k, (v, s) in enumerate(variants.items())}
    copy = cupy.RawModule(code=COPY).get_function("probe_copy")
    stream = cupy.cuda.Stream(non_blocking=True)
    rows = []
    for case, H, B, T in CASES:
        rng = np.random.default_rng(0)
        x_proj = cupy.asarray(rng.standard_normal((T * B, 4 * H), dtype=np.float32))
        gates = cupy.asarray(rng.standard_normal((B, 4 * H), dtype=np.float32))
        c = [cupy.asarray(rng.standard_normal((B, H), dtype=np.float32)) for _ in range(2)]
        h = cupy.empty((B, H), dtype=cupy.float32)
        seq = cupy.empty((T * B, H), dtype=cupy.float32)
        mode = cupy.empty((B, H), dtype=cupy.uint16)
        sizes = (np.int32(B), np.int32(64), np.int32(H))
        cupy.cuda.Device().synchronize()          # the arrays above were made on the null stream

        def launcher(variant: str):
            function = functions.get(variant)
            if variant == "copy":
                return lambda t: copy((max(1, -(-B * H // 256)),), (256,), (c[t % 2], c[1 - t % 2], np.int32(B * H)))
            if variant == "generated":
                grid, block = (max(1, min(-(-B * H // 256), 65535)),), (256,)
            elif variant == "rows in y, 2 a thread":
                grid, block = (-(-H // 512), min(B, 65535)), (256,)
            elif variant == "rows in y, 128 threads":
                grid, block = (-(-H // 128), min(B, 65535)), (128,)
            else:
                grid, block = (-(-H // 256), min(B, 65535)), (256,)
            return lambda t: function(grid, block, (c[t % 2], gates, x_proj, c[1 - t % 2], h, seq, mode,
                                                    np.int32(t)) + sizes)

        reference = None
        with stream:                        # every copy on the timed stream (it does not wait for the null stream)
            c_start = [a.copy() for a in c]
        for variant in [*variants, "copy"]:
            launch = launcher(variant)
            if variant != "copy":
                with stream:
                    for a, start in zip(c, c_start):
                        a[...] = start
                    launch(3)
                stream.synchronize()
                got = (cupy.asnumpy(c[0]), cupy.asnumpy(h), cupy.asnumpy(mode))
                if reference is None:
                    reference = got
                elif variant not in ("no math", "fast math") and not all(
                        np.array_equal(a, b) for a, b in zip(got, reference)):
                    raise SystemExit(f"{case}: variant {variant!r} differs from the generated kernel")
            with stream:
                stream.begin_capture()
                for t in range(T):
                    launch(t)
                graph = stream.end_capture()
            ms = graph_ms(cupy, stream, graph, args.reps)
            rows.append({"case": case, "H": H, "B": B, "T": T, "variant": variant, "ms": ms,
                         "us_per_launch": 1e3 * ms / T})
            print(f"{case:12s} {variant:24s} {1e3 * ms / T:6.2f} us a launch", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_cell_kernel.json").write_text(json.dumps(
            {"device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
