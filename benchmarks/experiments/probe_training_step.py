"""One training step (forward + backward) of a cell on the GPU against cuDNN's (issue #13, item 5): where it starts.

    python benchmarks/experiments/probe_training_step.py --preset lstm --preset gru --config blogB --config mid

Times, with CUDA events after warm-up (median of --repeats): engine.torch_module.CellRNN (the engine's forward and
backward interpreted through CuPy, op by op: engine.autodiff backend "naive") and torch.nn.LSTM / GRU (cuDNN), both
fp32 with TF32 off, the same weights and inputs, the loss sum(out * w) with a fixed random w. Gradients are checked
against each other first (relative error of the input gradient). Random inputs, never zeros.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import engine  # noqa: E402
from engine.bench.configs import parse_configs  # noqa: E402
from engine.bench.timing import time_runs, torch_timer  # noqa: E402


def time_ms(fn, warmup: int, repeats: int) -> float:
    """Median ms of fn, CUDA events around each call (the harness's torch timer)."""
    return time_runs(lambda k: fn(), torch_timer, buffers=1, warmup=warmup, reps=repeats).median_ms


def main(argv=None) -> int:
    import torch

    from engine.torch_layout import from_torch_state_dict
    from engine.torch_module import CellRNN
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", action="append", default=None)
    parser.add_argument("--config", action="append", default=None)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for preset in args.preset or ["lstm"]:
        layout = engine.preset(preset).torch
        for cfg in parse_configs(args.config or ["blogB"]):
            torch.manual_seed(0)
            reference = getattr(torch.nn, layout.module)(cfg.input_size, cfg.hidden_size, cfg.num_layers).cuda()
            rnn = CellRNN(engine.preset(preset).cell, cfg.input_size, cfg.hidden_size, cfg.num_layers).cuda()
            state = {k: v.detach().cpu().numpy() for k, v in reference.state_dict().items()}
            loaded = from_torch_state_dict(rnn.network, state, layout)
            with torch.no_grad():
                for layer, names in enumerate(rnn.names):
                    for p in names:
                        getattr(rnn, f"layer{layer}_{p}").copy_(torch.from_numpy(loaded[layer][p]))
            x = torch.randn(cfg.steps, cfg.batch, cfg.input_size, device="cuda")
            w = torch.randn(cfg.steps, cfg.batch, cfg.hidden_size, device="cuda")

            def step(module):
                xi = x.clone().requires_grad_()
                out, _ = module(xi)
                (out * w).sum().backward()
                return xi.grad
            g_ref, g = step(reference), step(rnn)
            err = float((g - g_ref).norm() / g_ref.norm())
            row = {"preset": preset, "config": cfg.name, "sizes": [cfg.input_size, cfg.hidden_size, cfg.num_layers,
                                                                   cfg.steps, cfg.batch], "input_grad_rel_err": err,
                   "cudnn_ms": time_ms(lambda: step(reference), args.warmup + 2, max(args.repeats, 10)),
                   "engine_naive_ms": time_ms(lambda: step(rnn), args.warmup, args.repeats)}
            row["ratio"] = row["cudnn_ms"] / row["engine_naive_ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"\n{'preset':<8}{'config':<8}{'cudnn ms':>10}{'engine ms':>11}{'ratio':>8}  dx rel err")
    for r in rows:
        print(f"{r['preset']:<8}{r['config']:<8}{r['cudnn_ms']:10.2f}{r['engine_naive_ms']:11.1f}{r['ratio']:8.3f}  "
              f"{r['input_grad_rel_err']:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
