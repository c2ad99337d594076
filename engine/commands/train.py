"""`python -m engine train <preset or cell.json> [more cells...]`: train cells on a generated task (CPU, float64)
and compare them, each on the same data from the same seed.

    python -m engine train lstm gru --task adding --steps 300 --hidden-size 16 --seq-len 10 --batch 32
    python -m engine train my_cell.json lstm --task parity --json results.json
    python -m engine train --list-tasks
"""
from __future__ import annotations

import sys

from ..files import check_destination
from ..training import compare, save_results
from ..training.errors import TrainingError
from ..training.tasks import get_task, tasks
from ._common import (
    MAX_SEED,
    batch_flag,
    float_flag,
    int_flag,
    layers_flag,
    print_columns,
    resolve_cell,
    seed_flag,
    size_flag,
    steps_flag,
)


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train cells on a generated sequence task and compare them (CPU)")
    p.add_argument("cells", nargs="*", metavar="cell", help="preset names or cell JSON files, one or more")
    p.add_argument("--task", default="adding", help=f"the task: {', '.join(tasks())} (default adding)")
    p.add_argument("--steps", type=int_flag(1, 10**7), default=300, help="optimisation steps (default 300)")
    p.add_argument("--hidden-size", "-H", type=size_flag, default=16, help="hidden size H (default 16)")
    p.add_argument("--layers", "-L", type=layers_flag, default=1, help="stacked layers (default 1)")
    p.add_argument("--batch", "-B", type=batch_flag, default=16, help="sequences a step (default 16)")
    p.add_argument("--seq-len", "-T", type=steps_flag, default=10, help="steps a sequence (default 10)")
    p.add_argument("--lr", type=float_flag(0, low_inclusive=False), default=0.01,
                   help="Adam's learning rate (default 0.01)")
    p.add_argument("--clip", type=float_flag(0), default=1.0,
                   help="clip gradients to this global norm; 0: off (default 1)")
    p.add_argument("--seed", type=seed_flag, default=0,
                   help=f"seed of the parameters and the data, 0 to {MAX_SEED} (default 0)")
    p.add_argument("--eval-every", type=int_flag(1), default=None, help="score the held-out set every N steps "
                                                                         "(default: a tenth of the run)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="cpu: float64 (default); gpu: float32, the fused training step on a CUDA GPU")
    p.add_argument("--precision", choices=("float32", "tf32", "bfloat16", "float16"), default="float32",
                   help="the matmuls' mode: float32 (strict, default), or tf32 / bfloat16 / float16 (operands rounded "
                        "to it, fp32 accumulation: tensor cores on the GPU, emulated on the CPU)")
    p.add_argument("--json", metavar="PATH", help="write the results (settings, curves, cells) to this JSON file "
                                                  "(checked before training starts; replaced if it exists)")
    p.add_argument("--list-tasks", action="store_true", help="list the tasks and exit")
    p.set_defaults(func=main)


def print_tasks() -> None:
    names = tasks()
    width = max(len(name) for name in names)
    for name in names:
        task = get_task(name)
        baseline = f"{task.baseline:<6.4g}" if task.data_ready() else "(on first use: its data is built then)"
        print(f"{name:<{width}}  in {task.input_size:>2}  out {task.output_size:>2}  {task.metric:<8}  "
              f"baseline {baseline}  {task.description}")


def progress_printer(cell_names: list[str], steps: int):
    """A progress line per cell: rewritten in place on a terminal, a line every tenth of the run otherwise."""
    live = sys.stderr.isatty()
    every = max(1, steps // 10)

    def show(done: int, total: int, loss: float) -> None:
        index, step = (done - 1) // steps, (done - 1) % steps + 1
        line = f"[{index + 1}/{len(cell_names)}] {cell_names[index]}: step {step}/{steps}  loss {loss:.4g}"
        if live:
            print("\r" + line, end="\n" if step == steps else "", file=sys.stderr, flush=True)
        elif step % every == 0 or step == steps:
            print(line, file=sys.stderr, flush=True)
    return show


def print_table(results, task) -> None:
    settings = results[0].settings
    better = "higher" if task.higher_is_better else "lower"
    print(f"task {task.name}: {task.metric} on {settings['eval_batch']} held-out sequences ({better} is better; "
          f"input-blind baseline {task.baseline:.4g}); {settings['steps']} steps of B={settings['batch']}, "
          f"T={settings['seq_len']}, H={settings['hidden_size']}, L={settings['num_layers']}, lr {settings['lr']:g}, "
          f"clip {settings['clip'] or 'off'}, seed {settings['seed']}")
    tested = "test" in task.splits
    rows = [(r.cell, f"{r.num_params:,}", f"{r.final_loss:.4g}", f"{r.final_metric:.4g}",
             *([f"{r.test_metric:.4g}"] if tested else []), f"{r.seconds:.1f}") for r in results]
    header = ("cell", "params", "held-out loss", task.metric, *([f"test {task.metric}"] if tested else []), "seconds")
    print_columns(header, rows)


def main(args) -> int:
    if args.list_tasks:
        print_tasks()
        return 0
    if not args.cells:
        raise TrainingError("no cell to train", hint="name one or more presets or cell JSON files, e.g. "
                                                     "`python -m engine train lstm gru --task adding`")
    task = get_task(args.task)
    cells = [resolve_cell(spec) for spec in args.cells]        # every file read before any training starts
    if args.json:                                              # a bad destination found before training, not after
        check_destination(args.json, "training results", flag="--json", example="results.json")
    results = compare(cells, task, hidden_size=args.hidden_size, num_layers=args.layers, steps=args.steps,
                      batch=args.batch, seq_len=args.seq_len, lr=args.lr, clip=args.clip or None, seed=args.seed,
                      eval_every=args.eval_every, device=args.device, precision=args.precision,
                      on_progress=progress_printer([c.name for c in cells], args.steps))
    print_table(results, task)
    if args.json:
        save_results(results, args.json, flag="--json")
        print(f"saved {len(results)} result(s) to {args.json}")
    return 0
