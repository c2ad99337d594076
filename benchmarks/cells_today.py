"""The cells of issue #33 on the GPU: sLSTM against FlashRNN's fused kernel, and the LayerNorm LSTM and an LSTM with an
exp and a max in its gates against the engine's own LSTM.

sLSTM (presets/slstm.py, 4 heads): one layer, I = H = 512 and 768, B = 16, T = 1024. The engine's rows: the autotuned
forward in float32 and bfloat16 (`autotune.tune` then `prepare`, as engine.run(backend="auto") runs it), and forward +
backward through the generated training step (engine.bptt(backend="fused")) in float32 and in bfloat16 (each GEMM's
operands rounded to bf16, fp32 sums and master weights; its gradients' largest relative difference from float32's is
recorded; the training rows take the parameters already on the GPU, as a training loop and FlashRNN keep them). FlashRNN 1.0.8 (`flashrnn(Wx, R, b, function="slstm", backend="cuda_fused")`),
its input projection (one torch matmul) timed with it, forward and forward + backward of sum(y * dy). Every engine
forward is first checked against the float64 reference on the first CHECK_STEPS steps (poisoned outputs), and
FlashRNN's output against the engine's.

FlashRNN builds its kernels at first use with the CUDA toolkit; with CUDA 13 its gpu_info.cc reads eight
cudaDeviceProp fields CUDA 13 removed, so benchmarks/flashrnn_setup.sh installs the carried wheel into a folder and
drops those reads first (`FLASHRNN_PATH` names the folder; without it the FlashRNN rows say why they are missing).

LSTM variants: `python -m engine bench` rows are the harness's; this script times the engine's autotuned forward of
lstm, ln_lstm and lstm_expmax (an LSTM whose input gate is exp(log_sigmoid(.)) and whose candidate reads
max(., -3)) at blogB and mid, float32, each checked against the float64 reference first. Each row records the
autotuner's pick (printed after the row) and every candidate's timing, so a row that moves between runs shows whether
the pick did.

Every time is the median of CUDA-event intervals after warm-up. TF32 is off (CuPy and torch); no cuDNN row here.

    python3 benchmarks/cells_today.py --out $OUT [--only slstm|variants]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.bench.timing import cupy_timer, time_runs, torch_timer  # noqa: E402
from engine.dsl import W, b, cell, const, exp, log_sigmoid, sigmoid, tanh  # noqa: E402
from engine.dsl import max as maximum  # noqa: E402
from engine.schedules import autotune  # noqa: E402

CHECK_STEPS = 32


@cell
def lstm_expmax(x, h, c):
    """The LSTM with an extra exp (i = exp(log sigmoid(.)), equal to sigmoid) and a max (the candidate's floor)."""
    i = exp(log_sigmoid(W("W_ii") @ x + b("b_ii") + W("W_hi") @ h + b("b_hi")))
    f = sigmoid(W("W_if") @ x + b("b_if") + W("W_hf") @ h + b("b_hf"))
    g = tanh(maximum(W("W_ig") @ x + b("b_ig") + W("W_hg") @ h + b("b_hg"), const(-3.0)))
    o = sigmoid(W("W_io") @ x + b("b_io") + W("W_ho") @ h + b("b_ho"))
    c_next = f * c + i * g
    h_next = o * tanh(c_next)
    return {"h": h_next, "c": c_next}


class Rows(list):
    """The result rows, written to OUT/cells_today.json after each one (a run cut short keeps what it measured) and
    printed as they come."""

    def __init__(self, path, header: dict):
        super().__init__()
        self.path, self.header = path, header

    def append(self, row: dict) -> None:
        super().append(row)
        value = f"{row['ms']:.3f} ms" if "ms" in row else row.get("error", "")
        print(f"ROW {row['case']:12s} {row['row']:58s} {value}", flush=True)
        if self.path is not None:
            self.path.write_text(json.dumps({**self.header, "rows": list(self)}, indent=1))


def median_ms(run, timer=cupy_timer, warmup=3, reps=20) -> float:
    return time_runs(lambda k: run(), timer, buffers=1, warmup=warmup, reps=reps).median_ms


def autotuned(network, params, T, B, precision):
    choice = autotune.tune(network, params, T, B, precision=precision)
    return choice, autotune.prepare(autotune.Candidate(choice.schedule, choice.config), network, params,
                                    precision=precision)


def checked(program, network, params, x_host, cupy) -> float:
    """The program's relative error against the float64 reference on the first CHECK_STEPS steps (poisoned)."""
    prefix = x_host[:CHECK_STEPS]
    want = engine.run(network, params, prefix.astype(np.float64), backend="reference", dtype=np.float64).outputs
    got = program.run(cupy.asarray(prefix), poison=True).outputs
    got = got.get() if hasattr(got, "get") else np.asarray(got)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def slstm_rows(H: int, cupy, rows: list, T=1024, B=16) -> None:
    network = engine.Network(engine.preset("slstm").cell, H, H, 1)
    params = engine.init_params(network, seed=0)
    rng = np.random.default_rng(1)
    x_host = rng.standard_normal((T, B, H)).astype(np.float32)
    x = cupy.asarray(x_host)
    where = f"sLSTM H={H}"
    engine_out = None
    for precision in ("float32", "bfloat16"):
        try:
            choice, program = autotuned(network, params, T, B, precision)
            error = checked(program, network, params, x_host, cupy)
            ms = median_ms(lambda: program.run(x))
            if precision == "float32":
                engine_out = program.run(x).outputs
            rows.append({"case": where, "row": f"engine forward {precision} ({choice.schedule})", "ms": ms,
                         "rel_err_vs_float64": error,
                         "config": choice.config.label() if choice.config is not None else None,
                         "timings": choice.timings})
        except engine.EngineError as e:
            rows.append({"case": where, "row": f"engine forward {precision}", "error": str(e).splitlines()[0]})
    d_out = cupy.asarray(rng.standard_normal((T, B, H)), dtype=cupy.float32)
    # the parameters on the GPU for the training rows, as a training loop (CellRNN) and FlashRNN keep them
    gpu_params = engine.Params([{k: cupy.asarray(v, dtype=cupy.float32) for k, v in layer.items()}
                                for layer in params.layers])
    engine_grads = None
    try:
        engine_grads = engine.bptt(network, gpu_params, x, d_outputs=d_out, dtype=np.float32, backend="fused").params[0]
        rows.append({"case": where, "row": "engine forward + backward float32 (bptt fused)",
                     "ms": median_ms(lambda: engine.bptt(network, gpu_params, x, d_outputs=d_out, dtype=np.float32,
                                                         backend="fused"), warmup=2, reps=10)})
    except engine.EngineError as e:
        rows.append({"case": where, "row": "engine forward + backward float32", "error": str(e).splitlines()[0]})
    try:           # bf16 training: each GEMM's operands rounded to bf16, fp32 sums and master weights (issue #34)
        run = lambda: engine.bptt(network, gpu_params, x, d_outputs=d_out, dtype=np.float32, backend="fused",  # noqa: E731
                                  precision="bfloat16")
        mode_grads = run().params[0]
        rows.append({"case": where, "row": "engine forward + backward bfloat16 (bptt fused)",
                     "ms": median_ms(run, warmup=2, reps=10),
                     **({} if engine_grads is None else largest_difference(
                         gradient_differences(mode_grads, engine_grads), "vs_float32_grads"))})
    except engine.EngineError as e:
        rows.append({"case": where, "row": "engine forward + backward bfloat16", "error": str(e).splitlines()[0]})
    flashrnn_rows(network, params, x_host, d_out, engine_out, where, rows, engine_grads)


def host(a) -> np.ndarray:
    """A CuPy (the engine's gradients) or NumPy (flashrnn_gradients') array as float64 NumPy."""
    return np.asarray(a.get() if hasattr(a, "get") else a, dtype=np.float64)


def gradient_differences(got_grads: dict, engine_grads: dict) -> dict:
    """For each parameter of the cell: ||got - the engine's fp32|| / ||the engine's||, and the engine's norm over
    the largest gradient's (a gradient near 0, a sum that cancels, shows a large relative difference from rounding
    alone). float64 on the host."""
    wants = {name: host(want) for name, want in engine_grads.items()}
    largest = max(np.linalg.norm(w) for w in wants.values())
    out = {}
    for name, want in wants.items():
        got = host(got_grads[name]).reshape(want.shape)
        out[name] = {"rel_diff": float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)),
                     "norm_vs_largest": float(np.linalg.norm(want) / largest)}
    return out


# A gradient under this share of the largest one's norm is a sum that cancels: the sLSTM's b_i is 0 analytically
# with zero initial states (6.5e-18 of the largest in float64: c and n both scale with the input gate, h = c / n does
# not), so its relative difference measures rounding noise (1.1 between FlashRNN's fp32 and the engine's, 1.4 between
# the engine's bf16 and fp32 on an H200, 2026-11-27) and is left out of the row's largest.
NEGLIGIBLE = 1e-6


def largest_difference(differences: dict, what: str) -> dict:
    """The largest relative difference over the gradients that are not negligible, with its parameter, and the
    parameters left out."""
    kept = {k: v for k, v in differences.items() if v["norm_vs_largest"] >= NEGLIGIBLE}
    name = max(kept, key=lambda k: kept[k]["rel_diff"])
    return {f"rel_diff_{what}": kept[name]["rel_diff"], f"rel_diff_{what}_param": name,
            f"negligible_{what}": sorted(set(differences) - set(kept)), f"grad_rel_diff_{what}": differences}


def flashrnn_gradients(w_leaf, r, bias, heads, d) -> dict:
    """FlashRNN's gradients in the cell's parameter names and shapes: W_* rows of the stacked (4H, I), R_* as the
    (heads, D, D) blocks (the layout both use), b_* flattened."""
    out = {}
    for g, k in enumerate("ifzo"):
        rows_ = w_leaf.grad[g * heads * d:(g + 1) * heads * d]
        out[f"W_{k}"] = rows_.double().cpu().numpy()
        out[f"R_{k}"] = r.grad[g].double().cpu().numpy()
        out[f"b_{k}"] = bias.grad[g].reshape(-1).double().cpu().numpy()
    return out


def flashrnn_rows(network, params, x_host, d_out, engine_out, where, rows, engine_grads=None) -> None:
    try:
        import torch
        if os.environ.get("FLASHRNN_PATH"):
            sys.path.insert(0, os.environ["FLASHRNN_PATH"])
        from flashrnn import flashrnn
    except ImportError as e:
        rows.append({"case": where, "row": "FlashRNN", "error": f"not installed ({e})"})
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    T, B, H = x_host.shape
    heads = network.cell["R_i"].attr("heads")
    d = H // heads
    p = params[0]
    for dtype_name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        dev = dict(device="cuda", dtype=dtype)
        w_all = torch.tensor(np.concatenate([p[f"W_{k}"] for k in "ifzo"]), **dev)            # (4H, I)
        r = torch.tensor(np.stack([p[f"R_{k}"] for k in "ifzo"]), **dev).requires_grad_(True)  # (G, N, D, D)
        bias = torch.tensor(np.stack([p[f"b_{k}"].reshape(heads, d) for k in "ifzo"]), **dev).requires_grad_(True)
        xt = torch.tensor(x_host, **dev).transpose(0, 1).contiguous()                       # (B, T, I)
        dy = torch.tensor(d_out.get(), **dev).transpose(0, 1).reshape(B, T, heads, d)
        w_leaf = w_all.clone().requires_grad_(True)

        def forward():
            wx = (xt @ w_leaf.T).reshape(B, T, 4, heads, d)
            states, _ = flashrnn(wx, r, bias, states=None, function="slstm", backend="cuda_fused", dtype=dtype_name)
            return states[0]                                                                # (B, T, N, D)

        def forward_backward():
            (forward() * dy).sum().backward()
        try:
            start = time.perf_counter()
            y = forward()
            built_s = time.perf_counter() - start
            row = {"case": where, "row": f"FlashRNN cuda_fused forward {dtype_name}", "first_call_s": built_s}
            if engine_out is not None:
                got = y.float().transpose(0, 1).reshape(T, B, H).detach().cpu().numpy()
                want = engine_out.get()
                row["rel_diff_vs_engine_fp32"] = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            if dtype_name == "float32" and engine_grads is not None:     # the gradients, before the timed runs
                forward_backward()
                row.update(largest_difference(gradient_differences(
                    flashrnn_gradients(w_leaf, r, bias, heads, d), engine_grads), "vs_engine_fp32_grads"))
                w_leaf.grad = r.grad = bias.grad = None
            with torch.no_grad():
                row["ms"] = median_ms(forward, torch_timer)
            rows.append(row)
            rows.append({"case": where, "row": f"FlashRNN cuda_fused forward + backward {dtype_name}",
                         "ms": median_ms(forward_backward, torch_timer, warmup=2, reps=10)})
        except Exception as e:          # a build or launch failure of the peer is reported, not fatal
            rows.append({"case": where, "row": f"FlashRNN cuda_fused {dtype_name}",
                         "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"})


def variant_rows(cupy, rows: list) -> None:
    cells = {"lstm": engine.preset("lstm").cell, "ln_lstm": engine.preset("ln_lstm").cell, "lstm_expmax": lstm_expmax}
    for config in ("blogB", "mid"):
        I, H, L, T, B = {"blogB": (64, 256, 3, 100, 64), "mid": (512, 512, 4, 100, 64)}[config]   # the anchors
        rng = np.random.default_rng(2)
        x_host = rng.standard_normal((T, B, I)).astype(np.float32)
        x = cupy.asarray(x_host)
        for name, c in cells.items():
            network = engine.Network(c, I, H, L)
            params = engine.init_params(network, seed=0)
            try:
                choice, program = autotuned(network, params, T, B, "float32")
                error = checked(program, network, params, x_host, cupy)
                rows.append({"case": config, "row": f"{name} ({choice.schedule})",
                             "ms": median_ms(lambda: program.run(x)), "rel_err_vs_float64": error,
                             "config": choice.config.label() if choice.config is not None else None,
                             "timings": choice.timings})     # what the autotuner picked, and from which
            except engine.EngineError as e:
                rows.append({"case": config, "row": name, "error": str(e).splitlines()[0]})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--only", choices=("slstm", "variants"), default=None)
    parser.add_argument("--hidden", type=int, action="append", default=None, help="sLSTM sizes (default 512, 768)")
    args = parser.parse_args(argv)
    os.environ.setdefault("CUPY_TF32", "0")
    import cupy
    device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    out = None
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        out = Path(args.out) / f"cells_today-{args.only or 'all'}.json"
    rows = Rows(out, {"device": device, "cupy": cupy.__version__, "tf32": "off (CUPY_TF32=0, torch allow_tf32=False)"})
    if args.only in (None, "variants"):
        variant_rows(cupy, rows)
    if args.only in (None, "slstm"):
        for H in args.hidden or (512, 768):
            slstm_rows(H, cupy, rows)
    print(f"issue #33 cells, {device}, float32 TF32 off unless the row says bfloat16")
    print(f"{'case':12s} {'row':58s} {'median ms':>10s} {'rel err':>10s}")
    for r in rows:
        if "ms" in r:
            err = r.get("rel_err_vs_float64", r.get("rel_diff_vs_engine_fp32", r.get("rel_diff_vs_float32_grads")))
            print(f"{r['case']:12s} {r['row']:58s} {r['ms']:10.3f} {'-' if err is None else f'{err:.2e}':>10s}"
                  + (f"   {r['config']}" if r.get("config") else ""))
        else:
            print(f"{r['case']:12s} {r['row']:58s} {r['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
