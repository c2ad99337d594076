"""A fused-mode step (the cublasLt product, then the generated cell kernel) chained over T steps in one CUDA graph,
with the cell kernel launched normally or as a programmatic dependent launch (PDL) of the product (issue #34).

The question: in a graph of `large`'s bf16 LSTM steps a cell kernel costs ~3.5 us against ~1.2 us for a copy
kernel (benchmarks/probe_cell_kernel.py, H200, 2026-11-28), and a step's two kernels are serialized with a launch
gap between them. With PDL (CUDA programming guide, "Programmatic Dependent Launch and Synchronization";
cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) the cell kernel's blocks may start
before the product has finished; `griddepcontrol.wait` (PTX ISA 7.8, sm_90) holds each thread until the product has
completed and its memory is visible. The loads that do not read the product (the projection's row, the state c)
can be issued before the wait.

Variants (the cell kernel's body is the generator's; only where the wait sits differs):
- `plain`: a normal launch (as engine.run(backend="fused", precision="bfloat16") launches it);
- `pdl, wait first`: PDL, the wait before any load;
- `pdl, loads first`: PDL, the loads of the projection and c before the wait, the product's after it.
Each step's product reads the h copy (bf16) that the step before wrote, so the chain is the real dependency. The
variants' h after the chain must be bit-identical. Medians of CUDA-event intervals after warm-up.

    python3 benchmarks/probe_step_pdl.py --out /tmp/probe
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_cell_kernel import HEADER, ROWS_IN_Y  # noqa: E402
from step_chain import graph_ms  # noqa: E402

CASES = [("large (a layer)", 1024, 128, 100), ("blogA", 2560, 64, 200), ("B=16 H=512", 512, 16, 1024)]
WAIT = '        asm volatile("griddepcontrol.wait;" ::: "memory");\n'
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


def variants():
    """{variant: the cell kernel's module source} and the kernel's name."""
    from engine import gallery
    from engine.codegen import GENERATOR_VERSION
    from engine.codegen.operand_copies import operand_copies, render_copies_module
    from engine.compiler import make_plan
    from engine.network import Network

    network = Network(gallery.get("lstm").cell, input_size=64, hidden_size=64)
    program = make_plan(network, 4, 4).program
    source = render_copies_module(program, "bfloat16", operand_copies(program, "bfloat16"), GENERATOR_VERSION)
    name = program.kernels[0].name
    body = source.replace(HEADER, ROWS_IN_Y)
    start, end = body.index("        // load\n"), body.index("        // compute\n")
    loads = body[start:end].splitlines(keepends=True)
    early = [line for line in loads if "h_gemm_out" not in line]
    late = [line for line in loads if "h_gemm_out" in line]
    return name, {"plain": body,
                  "pdl, wait first": body[:start] + WAIT + body[start:],
                  "pdl, loads first": body[:start] + "".join(early) + WAIT + "".join(late) + body[end:]}


def main() -> None:
    import cupy

    from engine.codegen.nvrtc import load_module
    from engine.schedules.cublaslt import LtProjection
    from engine.schedules.project import LT_OPERANDS, operand_dtype, round_into

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--reps", type=int, default=11)
    args = ap.parse_args()
    driver = ctypes.CDLL("libcuda.so.1")
    name, sources = variants()
    functions = {v: load_module(s, cell=f"probe_pdl_{k}").get_function(name)
                 for k, (v, s) in enumerate(sources.items())}
    attribute = LaunchAttribute()
    attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    ctypes.memmove(attribute.value, ctypes.byref(ctypes.c_int(1)), 4)
    lt = LtProjection.on_current_device(cupy)
    stream = cupy.cuda.Stream(non_blocking=True)
    rows = []
    for case, H, B, T in CASES:
        rng = np.random.default_rng(0)
        mode = "bfloat16"
        w32 = cupy.asarray(rng.standard_normal((4 * H, H), dtype=np.float32) / H ** 0.5)
        weight = round_into(cupy, w32, cupy.empty(w32.shape, operand_dtype(cupy, mode)), mode)
        x_proj = cupy.asarray(rng.standard_normal((T * B, 4 * H), dtype=np.float32))
        gates = cupy.empty((B, 4 * H), dtype=cupy.float32)
        c0 = cupy.asarray(rng.standard_normal((B, H), dtype=np.float32))
        h0 = cupy.asarray(rng.standard_normal((B, H), dtype=np.float32))
        c = [cupy.empty((B, H), dtype=cupy.float32) for _ in range(2)]
        h = cupy.empty((B, H), dtype=cupy.float32)
        seq = cupy.empty((T * B, H), dtype=cupy.float32)
        hm = [cupy.empty((B, H), dtype=cupy.uint16) for _ in range(2)]
        product = lt.bind(weight, gates, *LT_OPERANDS[mode])
        cupy.cuda.Device().synchronize()
        grid, block = (-(-H // 256), min(B, 65535), 1), (256, 1, 1)

        def launch(variant: str, t: int):
            args = (c[t % 2], gates, x_proj, c[1 - t % 2], h, seq, hm[1 - t % 2], np.int32(t), np.int32(B),
                    np.int32(H), np.int32(H))
            if variant == "plain":
                functions[variant](grid[:2], block[:1], args)
                return
            values = [ctypes.c_void_p(a.data.ptr) if isinstance(a, cupy.ndarray) else ctypes.c_int32(int(a)) for a in args]
            params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
            config = LaunchConfig(*grid, *block, 0, ctypes.c_void_p(stream.ptr), ctypes.pointer(attribute), 1)
            status = driver.cuLaunchKernelEx(ctypes.byref(config), ctypes.c_void_p(functions[variant].kernel.ptr), params,
                                             None)
            if status != 0:
                raise RuntimeError(f"cuLaunchKernelEx returned CUresult {status}")

        def capture(variant: str):
            with stream:
                stream.begin_capture()
                for t in range(T):
                    product(hm[t % 2].data.ptr, stream.ptr)
                    launch(variant, t)
                return stream.end_capture()

        def reset():
            with stream:
                c[0][...] = c0
                round_into(cupy, h0, hm[0], mode)

        finals = {}
        for variant in sources:
            graph = capture(variant)
            reset()
            graph.launch(stream)
            stream.synchronize()
            finals[variant] = cupy.asnumpy(h)
            ms = graph_ms(cupy, stream, graph, args.reps)
            same = bool(np.array_equal(finals[variant], finals["plain"]))
            finite = bool(np.isfinite(finals[variant]).all())
            rows.append({"case": case, "H": H, "B": B, "T": T, "variant": variant, "ms": ms,
                         "us_per_step": 1e3 * ms / T, "identical_to_plain": same, "finite": finite})
            print(f"{case:16s} {variant:18s} {1e3 * ms / T:6.2f} us a step  identical {same} finite {finite}",
                  flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "probe_step_pdl.json").write_text(json.dumps(
            {"device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
