"""CellRNN under torch.nn.parallel.DistributedDataParallel (issue #35, item 5), on the CPU with the gloo backend: two
processes, each with half of every batch, take the same optimisation steps as one process with the whole batch (the
gradients DDP averages across the processes are those of the whole batch's mean loss). The NCCL run on two GPUs and
its throughput are benchmarks/ddp_train.py's (torchrun)."""
from __future__ import annotations

import pytest

import engine

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install -r requirements-test.txt)")
from engine.torch_module import CellRNN  # noqa: E402

STEPS, T, B, I, H = 4, 6, 8, 3, 5


class Regressor(torch.nn.Module):
    """A GRU layer (the engine's cell) and a linear readout of its last output."""

    def __init__(self):
        super().__init__()
        self.rnn = CellRNN(engine.preset("gru").cell, I, H, 1, seed=0, dtype=torch.float64)
        torch.manual_seed(0)
        self.head = torch.nn.Linear(H, 1).double()

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[-1])


def batches():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(STEPS, T, B, I, generator=g, dtype=torch.float64),
            torch.randn(STEPS, B, 1, generator=g, dtype=torch.float64))


def train(net, rows: slice) -> list[float]:
    optimizer = torch.optim.SGD(net.parameters(), lr=0.2)
    xs, ys = batches()
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(net(xs[step][:, rows]), ys[step][rows])
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def train_rank(rank: int, world: int, init: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        net = torch.nn.parallel.DistributedDataParallel(Regressor())
        losses = train(net, slice(rank * B // world, (rank + 1) * B // world))
        torch.save({"state": net.module.state_dict(), "losses": losses}, f"{out}.{rank}")
    finally:
        torch.distributed.destroy_process_group()


def test_two_processes_under_ddp_take_the_whole_batchs_steps(tmp_path):
    init = f"file://{tmp_path / 'rendezvous'}"
    torch.multiprocessing.spawn(train_rank, args=(2, init, str(tmp_path / "ranks")), nprocs=2, join=True)
    alone = Regressor()
    losses = train(alone, slice(0, B))
    ranks = [torch.load(tmp_path / f"ranks.{r}") for r in range(2)]
    for name, value in alone.state_dict().items():
        for r in ranks:
            torch.testing.assert_close(r["state"][name], value, rtol=0, atol=1e-12, msg=name)
    for step, loss in enumerate(losses):                  # the ranks' halves average to the whole batch's loss
        assert (ranks[0]["losses"][step] + ranks[1]["losses"][step]) / 2 == pytest.approx(loss, rel=1e-12)
    assert losses[-1] < losses[0]
