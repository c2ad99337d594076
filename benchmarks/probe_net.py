"""The DeepSpeech block (issue #11) on one GPU: the engine's backends against cuDNN, timed side by side.

    python benchmarks/probe_net.py [--backend persistent --backend fused] [--json out.json]

cuDNN: torch.nn.LSTM(I, H, 4) -> max_pool1d over time (kernel 2, stride 2) -> torch.nn.LSTM(H, H, 4), fp32 with TF32
off, the same weights as the engine's (engine.torch_layout). The engine: engine.run_net on CuPy arrays. Each is timed
with CUDA events around one whole forward after warm-up, the median of --repeats; the engine's output is first
checked against cuDNN's on the same input (max relative difference printed). Sizes default to the issue's: I = H =
512, B = 64, T = 100, 4 + 4 layers.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402
from engine.params import Params  # noqa: E402
from engine.torch_layout import to_torch_state_dict  # noqa: E402
from probe_schedules import time_ms  # noqa: E402  (beside this file)


def torch_block(torch, block, params, input_size):
    layout = engine.preset(block.cell.name).torch
    module = getattr(torch.nn, layout.module)(input_size, block.hidden_size, block.num_layers).cuda()
    weights = {}
    for layer in range(block.num_layers):
        network = block.layer_network(layer, input_size)
        one = to_torch_state_dict(network, Params([params["forward"].layers[layer]]), layout)
        weights.update({key.replace("_l0", f"_l{layer}"): value for key, value in one.items()})
    module.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in weights.items()})
    return module


def main(argv=None) -> int:
    import cupy
    import torch
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", default=None)
    parser.add_argument("--input-size", type=int, default=512)
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    net = engine.net_preset("deepspeech", input_size=args.input_size, hidden_size=args.hidden_size, layers=args.layers)
    params = engine.init_net_params(net, seed=0)
    x = cupy.asarray(np.random.default_rng(1).standard_normal((args.steps, args.batch, args.input_size)),
                     dtype=cupy.float32)
    first = torch_block(torch, net.blocks[0], params.blocks[0], args.input_size)
    second = torch_block(torch, net.blocks[2], params.blocks[2], args.hidden_size)
    xt = torch.from_dlpack(x)

    def cudnn():
        with torch.no_grad():
            a, _ = first(xt)
            pooled = torch.nn.functional.max_pool1d(a.permute(1, 2, 0), kernel_size=2, stride=2).permute(2, 0, 1)
            b, _ = second(pooled.contiguous())
        return b

    reference = cupy.from_dlpack(cudnn().detach())
    row = {"net": "deepspeech", "sizes": [args.input_size, args.hidden_size, args.layers, args.steps, args.batch],
           "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version(), "tf32": False}
    row["cudnn_ms"] = time_ms(cudnn, args.warmup, args.repeats)
    for backend in args.backend or ["persistent", "graph", "fused"]:
        try:
            program = engine.prepare_net(net, params, backend)         # built once, as a user would keep it
            out = program.run(x).outputs
            row[f"{backend}_max_rel_diff_vs_cudnn"] = float(cupy.abs(out - reference).max() / cupy.abs(reference).max())
            row[f"{backend}_ms"] = time_ms(lambda: program.run(x), args.warmup, args.repeats)
            row[f"{backend}_ratio"] = row["cudnn_ms"] / row[f"{backend}_ms"]
        except Exception as e:  # noqa: BLE001 - a probe reports and goes on
            row[f"{backend}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    print(json.dumps(row, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
