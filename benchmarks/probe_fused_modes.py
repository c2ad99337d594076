"""Where a step of the fused backend's mode path goes (engine/schedules/fused_modes.py; issue #34 at `large` and
`blogA`), and how far cublasLt's algorithms for the step's product are from each other.

1. The whole call, replayed from its CUDA graph (median of CUDA-event intervals after warm-up).
2. A direct run with a timing event around every launch (engine.backends.fused's trace): median us per item (the
   rounding and the product are one item, "<gemm>"; the cell's kernel another). Events add their own time; the
   replayed call is the figure that counts.
3. The step's product alone, T products chained in one captured graph, for each of cublasLt's first algorithms
   (heuristic order), on random operands checked against float64 once.

    python3 benchmarks/probe_fused_modes.py --out /tmp/probe [--precision bfloat16] [--algos 8]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import engine  # noqa: E402
from engine.bench.configs import parse_configs  # noqa: E402
from engine.schedules import fused_modes  # noqa: E402
from engine.schedules.cublaslt import BoundProduct, LtProjection, Product  # noqa: E402
from engine.schedules.project import LT_OPERANDS, operand_dtype, round_into  # noqa: E402


def median_ms(cp, work, reps: int = 15, warm: int = 3) -> float:
    for _ in range(warm):
        work()
    cp.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        work()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b))
    return statistics.median(times)


def trace_items(cp, program, x) -> dict:
    executor = program.executor(x.shape[0], x.shape[1])
    device = executor.device
    device.trace = []
    executor.run(None, x, None)
    cp.cuda.get_current_stream().synchronize()
    spans: dict = {}
    for name, _layer, _t, start, end in device.trace:
        spans.setdefault(name, []).append(1e3 * cp.cuda.get_elapsed_time(start, end))
    device.trace = None
    return {name: {"count": len(v), "median_us": statistics.median(v)} for name, v in spans.items()}


def algorithms(cp, B: int, N: int, K: int, T: int, precision: str, count: int) -> list[dict]:
    lt = LtProjection.on_current_device(cp)
    rng = cp.random.default_rng(0)
    weight32 = rng.standard_normal((N, K), dtype=cp.float32) / K ** 0.5
    weight = round_into(cp, weight32, cp.empty((N, K), operand_dtype(cp, precision)), precision)
    h32 = rng.standard_normal((B, K), dtype=cp.float32)
    operand = round_into(cp, h32, cp.empty((B, K), operand_dtype(cp, precision)), precision)
    out = cp.full((B, N), cp.nan, dtype=cp.float32)
    data_type, compute = LT_OPERANDS[precision]
    plan = lt._new_plan(Product.dense(B, N, K), data_type, compute, 0, count)
    rows = []
    stream = cp.cuda.Stream(non_blocking=True)
    for index, algo in enumerate(plan.candidates):
        bound = BoundProduct(lt, lt._new_plan(Product.dense(B, N, K), data_type, compute, 0), weight, out)
        bound.use(algo)
        out.fill(cp.nan)
        bound(operand.data.ptr, cp.cuda.get_current_stream().ptr)
        w64 = cp.asnumpy(weight32).astype(np.float64)
        err = float(np.abs(cp.asnumpy(out) - cp.asnumpy(h32).astype(np.float64) @ w64.T).max())
        with stream:
            stream.begin_capture()
            for _ in range(T):
                bound(operand.data.ptr, stream.ptr)
            graph = stream.end_capture()
        ms = median_ms(cp, lambda: graph.launch(cp.cuda.get_current_stream()))
        rows.append({"algorithm": index, "us_per_product": 1e3 * ms / T, "max_abs_err_vs_fp32_operands": err})
    lt._destroy(plan)
    return rows


def main() -> None:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--precision", default="bfloat16")
    ap.add_argument("--algos", type=int, default=8)
    args = ap.parse_args()
    report = []
    for cell in ("lstm", "gru"):
        for config in parse_configs(["large", "blogA"]):
            I, H, L, T, B = config.input_size, config.hidden_size, config.num_layers, config.steps, config.batch
            network = engine.Network(engine.preset(cell).cell, I, H, L)
            params = engine.init_params(network, seed=0)
            x = cp.asarray(np.random.default_rng(1).standard_normal((T, B, I)), dtype=cp.float32)
            program = fused_modes.prepare(network, params, precision=args.precision)
            program.run(x)
            program.run(x)
            call = median_ms(cp, lambda: program.run(x))
            items = trace_items(cp, program, x)
            gates = {"lstm": 4, "gru": 3}[cell]
            algos = algorithms(cp, B, gates * H, H, T, args.precision, args.algos)
            row = {"cell": cell, "config": config.name, "precision": args.precision, "call_ms": call,
                   "items": items, "step_product_algorithms": algos}
            report.append(row)
            print(f"{cell} {config.name} {args.precision}: call {call:.3f} ms")
            for name, v in items.items():
                print(f"   {name:24s} x{v['count']:4d}  {v['median_us']:8.2f} us")
            for a in algos:
                print(f"   algo {a['algorithm']}: {a['us_per_product']:7.2f} us a product (err {a['max_abs_err_vs_fp32_operands']:.1e})")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"probe_fused_modes_{args.precision}.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
