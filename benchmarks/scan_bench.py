"""minGRU as a scan (issue #33's target): the scan schedule against the engine's sequential schedules for the same
cell and against the paper's log-space parallel scan written in plain PyTorch.

One layer, I = H = 512, B = 8, T = 4096 by default (--steps, --batch, --hidden), float32 (CuPy's and torch's TF32 off).
Every time is a median of CUDA-event intervals after warm-up, on random inputs; every engine output is checked
against the float64 reference first (poisoned where the schedule takes it). The engine's rows are timed in
ROUNDS interleaved rounds and report the median of the rounds' medians (the rounds in the JSON). The PyTorch rows
compute the paper's log-space form (Feng et al. 2024, Sec. 3.1.3 and Appendix: g(h_tilde), log-space coefficients, logcumsumexp), which
is a different function from the sequential minGRU (the g), timed as what a researcher would otherwise run:
forward, and forward + backward of the sum of the outputs. The forward + backward rows take the parameters on the
GPU, as a training loop holds them (all three: the engine's two and PyTorch's); the engine's are timed with x's
gradient and without it (input_gradient=False: x as data, as PyTorch's row takes it, whose x needs no gradient),
in ROUNDS interleaved rounds too.
Last, CellRNN's training step on the same sequence (forward and backward through torch autograd, x data), through
the scan's walks and step by step.

--precision tf32 / float16 / bfloat16 / float32x3 runs every engine row in that mode (the matmuls' operands rounded,
fp32 sums: engine/schedules/scan_modes.py; float32x3 forward only, as it trains nowhere; the fused backend's
forward is strict fp32 only, so its row is left out) and PyTorch's rows under torch.autocast in the 16-bit modes
(TF32 allowed in tf32 and float32x3). The relative error against float64 is reported, not gated: the GPU suite holds
each mode to the reference's emulation of it (tests/gpu/test_scan_modes_gpu.py).

    python3 benchmarks/scan_bench.py --out $OUT
    python3 benchmarks/scan_bench.py --precision bfloat16 --out $OUT
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.backends import fused  # noqa: E402
from engine.bench.timing import cupy_timer, time_runs  # noqa: E402
from engine.schedules import scan  # noqa: E402
from engine.schedules.registry import schedule_class  # noqa: E402

ROUNDS = 3                  # the engine's rows are timed in turn this many times; each row's figure is the median


def median_ms(run, warmup=3, reps=20) -> float:
    """The median of CUDA-event intervals after warm-up (engine.bench's timing, as the harness times every row)."""
    return time_runs(lambda k: run(), cupy_timer, buffers=1, warmup=warmup, reps=reps).median_ms


def torch_log_space(torch, F, x, params, h0):
    """The paper's minGRU in log space (parallel mode): h = exp(parallel_scan_log(...))."""
    def log_g(v):
        return torch.where(v >= 0, (F.relu(v) + 0.5).log(), -F.softplus(-v))
    k = F.linear(x, params["W_z"], params["b_z"])
    h_tilde = F.linear(x, params["W_h"], params["b_h"])
    log_coeffs = -F.softplus(k)                              # log(1 - z)
    log_values = torch.cat([log_g(h0)[:, None], -F.softplus(-k) + log_g(h_tilde)], dim=1)   # log z + log g(h~)
    a_star = F.pad(torch.cumsum(log_coeffs, dim=1), (0, 0, 1, 0))
    log_h = a_star + torch.logcumsumexp(log_values - a_star, dim=1)
    return torch.exp(log_h)[:, 1:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--precision", default="float32",
                        choices=("float32", "tf32", "float16", "bfloat16", "float32x3"))
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    mode = args.precision
    trains = mode != "float32x3"
    import cupy
    os.environ.setdefault("CUPY_TF32", "0")
    T, B, H = args.steps, args.batch, args.hidden
    cell = engine.preset("mingru").cell
    network = engine.Network(cell, H, H, 1)
    params = engine.init_params(network, seed=0)
    rng = np.random.default_rng(1)
    x_host = rng.standard_normal((T, B, H)).astype(np.float32)
    x = cupy.asarray(x_host)
    want = engine.run(network, params, x_host.astype(np.float64), backend="reference", dtype=np.float64).outputs
    scale = float(np.abs(want).max())
    rows: list[dict] = []
    results = {"device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "cupy": cupy.__version__,
               "T": T, "B": B, "H": H, "I": H, "precision": mode, "rows": rows}

    programs = {"scan": scan.prepare(network, params, precision=mode)}
    if mode == "float32":
        programs["fused"] = fused.prepare(network, params)
    for name in ("persistent", "graph"):
        try:
            programs[name] = schedule_class(name)(network, params, precision=mode)
        except engine.EngineError as e:
            rows.append({"name": name, "error": str(e).splitlines()[0]})
    checked = {}
    for name, program in programs.items():
        try:
            out = program.run(x, poison=True)
            checked[name] = float(cupy.abs(out.outputs - cupy.asarray(want)).max().get()) / scale
        except engine.EngineError as e:
            rows.append({"name": f"engine {name}", "error": str(e).splitlines()[0]})
    rounds: dict[str, list[float]] = {name: [] for name in checked}
    for _ in range(ROUNDS):             # interleaved: a row timed while the GPU ramps up would read slow
        for name in checked:
            rounds[name].append(median_ms(lambda: programs[name].run(x), reps=10 if name == "fused" else 20))
    for name, error in checked.items():
        rows.append({"name": f"engine {name}", "ms": float(np.median(rounds[name])), "rounds_ms": rounds[name],
                     "rel_err_vs_float64": error})
    from engine.schedules.scan_grad import scan_gradients
    d_out = cupy.asarray(rng.standard_normal((T, B, H)), dtype=cupy.float32)
    params = engine.Params([{k: cupy.asarray(v, dtype=cupy.float32) for k, v in layer.items()}
                           for layer in params.layers])              # as an fp32 training loop holds them
    calls = {}                          # x's gradient, or x as data (input_gradient): the scan and the stepped bptt
    for asked, tag in ((True, ""), (False, ", no x gradient")) if trains else ():
        calls[f"engine scan, forward + backward{tag}"] = (lambda asked=asked: scan_gradients(
            network, params, x, None, d_out, dtype=np.float32, xp=cupy, input_gradient=asked, precision=mode)), 20
        calls[f"engine fused bptt (step by step), forward + backward{tag}"] = (lambda asked=asked: engine.bptt(
            network, params, x, None, d_out, dtype=np.float32, backend="fused", input_gradient=asked,
            precision=mode)), 3
    both_rounds: dict[str, list[float]] = {}
    try:
        for _ in range(ROUNDS):         # interleaved, as the forward rows
            for name, (call, reps) in calls.items():
                both_rounds.setdefault(name, []).append(median_ms(call, warmup=1, reps=reps))
        rows += [{"name": name, "ms": float(np.median(ms)), "rounds_ms": ms} for name, ms in both_rounds.items()]
    except engine.EngineError as e:
        rows.append({"name": "engine forward + backward", "error": str(e).splitlines()[0]})
    try:
        import torch
        import torch.nn.functional as F  # noqa: N812
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = mode in ("tf32", "float32x3")
        half = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(mode)
        results["torch_mode"] = f"autocast {half}" if half else f"float32, TF32 {'on' if mode != 'float32' else 'off'}"

        def in_mode(call):             # the 16-bit modes under autocast, as a PyTorch training loop would run them
            if half is None:
                return call

            def autocast():
                with torch.autocast("cuda", dtype=half):
                    return call()
            return autocast
        tp = {k: torch.tensor(v, device="cuda", dtype=torch.float32) for k, v in params[0].items()}
        tx = torch.tensor(x_host, device="cuda").transpose(0, 1).contiguous()          # (B, T, H)
        h0 = torch.zeros(B, H, device="cuda")
        rows.append({"name": "torch log-space scan, forward (paper's form)",
                     "ms": median_ms(in_mode(lambda: torch_log_space(torch, F, tx, tp, h0)))})
        leaf = {k: v.clone().requires_grad_(True) for k, v in tp.items()}

        def forward_backward():
            in_mode(lambda: torch_log_space(torch, F, tx, leaf, h0).float().sum())().backward()
        rows.append({"name": "torch log-space scan, forward + backward", "ms": median_ms(forward_backward)})
        results["torch"] = torch.__version__
        from engine.torch_module import CellRNN
        tx_seq = torch.tensor(x_host, device="cuda")                                   # (T, B, H), time first
        for scan_on in (True, False) if trains else ():     # CellRNN's step: the scan's walks, or step by step
            rnn = CellRNN(engine.preset("mingru").cell, H, H, 1, seed=0, scan=scan_on, precision=mode).cuda()
            rnn(tx_seq)
            name = f"CellRNN forward + backward ({rnn.last_backend}), x data"     # x.requires_grad is False
            rows.append({"name": name, "ms": median_ms(lambda rnn=rnn: rnn(tx_seq)[0].sum().backward(),
                                                       warmup=2, reps=10 if scan_on else 5)})
    except ImportError as e:
        rows.append({"name": "torch", "error": f"not installed ({e})"})
    by_name = {r["name"]: r.get("ms") for r in rows}
    torch_both = by_name.get("torch log-space scan, forward + backward")       # x data: no x gradient there
    for tag in ("", ", no x gradient"):
        both = by_name.get(f"engine scan, forward + backward{tag}")
        stepped = by_name.get(f"engine fused bptt (step by step), forward + backward{tag}")
        if both and torch_both:
            print(f"forward + backward{tag}: PyTorch's log-space scan / the engine's scan = {torch_both / both:.2f}x")
        if both and stepped:
            print(f"forward + backward{tag}: the step-by-step bptt / the engine's scan = {stepped / both:.2f}x")
    scan_ms = by_name.get("engine scan")
    print(f"minGRU, I = H = {H}, B = {B}, T = {T}, precision {mode} (CuPy's TF32 off; PyTorch: "
          f"{results.get('torch_mode', 'not run')}), {results['device']}")
    print(f"{'row':48s} {'median ms':>10s} {'scan speedup':>13s} {'rel err':>10s}")
    for r in rows:
        if "ms" in r:
            speed = f"{r['ms'] / scan_ms:.1f}x" if scan_ms and "backward" not in r["name"] else "-"
            err = f"{r['rel_err_vs_float64']:.2e}" if "rel_err_vs_float64" in r else "-"
            print(f"{r['name']:48s} {r['ms']:10.3f} {speed:>13s} {err:>10s}")
        else:
            print(f"{r['name']:48s} {r['error']}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        name = "scan_bench.json" if mode == "float32" else f"scan_bench-{mode}.json"
        (Path(args.out) / name).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
