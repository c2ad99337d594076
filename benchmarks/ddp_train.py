"""CellRNN under DistributedDataParallel on the GPUs of one host (issue #35, item 5): the training step's throughput
on N GPUs against one, and the loss curve of N GPUs against one GPU given the whole (N times larger) batch.

    torchrun --nproc_per_node=2 benchmarks/ddp_train.py --out $OUT/ddp-2.json        # 2 GPUs, B a GPU
    python3 benchmarks/ddp_train.py --out $OUT/one.json                                # 1 GPU, B: the throughput bar
    python3 benchmarks/ddp_train.py --world 2 --out $OUT/one-2b.json                   # 1 GPU, 2 B: the same data
    python3 benchmarks/ddp_train.py --compare $OUT/one-2b.json $OUT/ddp-2.json         # loss curves (and speed)
    python3 benchmarks/ddp_train.py --compare $OUT/one.json $OUT/ddp-2.json            # throughput, 1.8x wanted

One cell (default lstm) stacked at `mid` (I = H = 512, 4 layers, T = 100, B = 64 a GPU), fp32 (the generated
training step; TF32 off), a linear readout of every step and the MSE to a fixed random target, SGD. Every rank
draws the whole global batch from one seed and takes its rows, so one GPU given the whole batch sees the same data.
Step times are CUDA-event medians after warm-up (forward, backward with DDP's all-reduce over NCCL, optimizer step).
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
from engine.bench.configs import ANCHORS  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="lstm")
    parser.add_argument("--config", default="mid", choices=sorted(ANCHORS))
    parser.add_argument("--steps", type=int, default=30, help="timed steps (after --warmup)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--world", type=int, default=1, help="alone (no torchrun): the batch of this many GPUs")
    parser.add_argument("--out", default=None)
    parser.add_argument("--compare", nargs=2, metavar=("ONE", "DDP"), help="compare two result files and stop")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    from engine.torch_module import CellRNN

    distributed = "RANK" in os.environ
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    if distributed:
        torch.distributed.init_process_group("nccl")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    config = ANCHORS[args.config]
    per_rank = config.batch
    global_batch = per_rank * (world if distributed else args.world)
    rows = slice(rank * per_rank, (rank + 1) * per_rank) if distributed else slice(0, global_batch)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = CellRNN(engine.preset(args.preset).cell, config.input_size, config.hidden_size,
                               config.num_layers, seed=0)
            torch.manual_seed(0)
            self.head = torch.nn.Linear(config.hidden_size, 1)

        def forward(self, x):
            out, _ = self.rnn(x)
            return self.head(out)

    model = Model().to(device)
    net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index]) if distributed else model
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    T = config.steps
    x_all = torch.randn(T, global_batch, config.input_size, generator=g)
    y_all = torch.randn(T, global_batch, 1, generator=g)
    x, y = x_all[:, rows].to(device), y_all[:, rows].to(device)
    losses, times = [], []
    for step in range(args.warmup + args.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        optimizer.step()
        end.record()
        end.synchronize()
        if step >= args.warmup:
            times.append(start.elapsed_time(end))
        mean = loss.detach().clone()
        if distributed:
            torch.distributed.all_reduce(mean)
            mean /= world
        losses.append(float(mean))
    result = {"preset": args.preset, "config": args.config, "gpus": world if distributed else 1,
              "global_batch": global_batch, "step_ms_median": float(np.median(times)),
              "sequences_per_s": global_batch / (float(np.median(times)) / 1e3), "losses": losses,
              "device": torch.cuda.get_device_name(device), "torch": torch.__version__,
              "backend": model.rnn.last_backend, "tf32": False}
    if rank == 0:
        print(json.dumps({k: v for k, v in result.items() if k != "losses"}))
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if distributed:
        torch.distributed.destroy_process_group()
    return 0


def compare(one: str, ddp: str) -> int:
    a, b = (json.loads(Path(p).read_text()) for p in (one, ddp))
    print(f"{b['gpus']} GPUs (global batch {b['global_batch']}) against 1 (batch {a['global_batch']}): "
          f"{b['sequences_per_s']:.1f} against {a['sequences_per_s']:.1f} sequences/s "
          f"({b['sequences_per_s'] / a['sequences_per_s']:.2f}x)")
    if a["global_batch"] == b["global_batch"]:       # the same data: the loss curves must agree to fp32 rounding
        worst = max(abs(u - v) / max(abs(u), 1e-30) for u, v in zip(a["losses"], b["losses"]))
        print(f"the loss curves differ by at most {worst:.2e} relative over {len(a['losses'])} steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
