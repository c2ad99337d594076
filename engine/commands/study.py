"""`python -m engine study <cells...> --task T --seeds N [--lr A B ...]`: a study of cells x seeds x settings on Ray,
every trial kept in the study's folder as it finishes; then each cell at its best settings against the baseline
(the first cell), with Welch's t-test over the seeds.

    python -m engine study lstm gru lstm_nfg --task jsb --seeds 5 --lr 0.01 0.003 -H 32 --steps 500 --folder s/odyssey
    python -m engine study --resume s/odyssey          # run what a killed study did not finish
    python -m engine study --show s/odyssey            # its tables, running nothing

A setting given one value is fixed; given several, the study tries each (the grid of all of them).
"""
from __future__ import annotations

import sys

import numpy as np

from ..study import Study, StudyProgress, load_study, resume_study, study
from ..study.errors import StudyError
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

SPACE_FLAGS = (("lr", ("--lr",), float_flag(0, low_inclusive=False)),
               ("hidden_size", ("--hidden-size", "-H"), size_flag), ("num_layers", ("--layers", "-L"), layers_flag),
               ("batch", ("--batch", "-B"), batch_flag), ("seq_len", ("--seq-len", "-T"), steps_flag),
               ("clip", ("--clip",), float_flag(0)), ("steps", ("--steps",), int_flag(1, 10**7)))


def add_parser(sub) -> None:
    p = sub.add_parser("study", help="a study of cells x seeds x settings on Ray, kept trial by trial")
    p.add_argument("cells", nargs="*", metavar="cell", help="preset names or cell JSON files (the first is the "
                                                              "baseline unless --baseline names another)")
    p.add_argument("--task", default="adding", help=f"the task: {', '.join(tasks())} (default adding)")
    p.add_argument("--seeds", type=int_flag(1, 10_000), default=3, help="seeds 0 to N-1 of every variant (default 3)")
    p.add_argument("--first-seed", type=seed_flag, default=0, help="the first seed (default 0)")
    for key, flags, kind in SPACE_FLAGS:
        p.add_argument(*flags, dest=key, type=kind, nargs="+", default=None, metavar="V",
                       help="one value (fixed) or several (each tried)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                   help="auto (default): a GPU a trial where Ray has GPUs, else CPU cores")
    p.add_argument("--baseline", default=None, help="the cell the others are compared with (default: the first)")
    p.add_argument("--folder", default=None, help="the study's folder (default studies/<task>-<hash>); "
                                                  "a folder of the same study resumes it")
    p.add_argument("--address", default=None, help="a Ray cluster to join (host:port, ray://host:port or auto); "
                                                   "default: an embedded local Ray")
    p.add_argument("--cpus-per-trial", type=int_flag(1, 1024), default=1, help="CPU cores a CPU trial holds "
                                                                                "(default 1)")
    p.add_argument("--retry-failed", action="store_true", help="run the failed trials again too")
    p.add_argument("--resume", metavar="FOLDER", help="run the unfinished trials of the study in FOLDER")
    p.add_argument("--show", metavar="FOLDER", help="print the tables of the study in FOLDER, running nothing")
    p.set_defaults(func=main)


def progress_printer():
    live = sys.stderr.isatty()

    def show(p: StudyProgress) -> None:
        running = ", ".join(p.running[:4]) + (f" and {len(p.running) - 4} more" if len(p.running) > 4 else "")
        line = (f"[{p.done}/{p.total}] trials done, {p.failed} failed"
                + (f" ({p.resumed} before this run)" if p.resumed else "") + (f"; running: {running}" if running
                                                                              else ""))
        print(("\r\x1b[2K" if live else "") + line, end="" if live and p.done < p.total else "\n", file=sys.stderr,
              flush=True)
    return show


def spread(values) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.4g}"
    return f"{np.mean(values):.4g} ± {np.std(values, ddof=1):.2g}"


def print_tables(s: Study) -> None:
    task = get_task(s.plan.task)
    tested = "test" in task.splits
    better = "higher" if task.higher_is_better else "lower"
    print(f"study {s.folder}: task {task.name}, {s.finished}/{len(s.trials)} trials finished, {len(s.failures)} "
          f"failed; {task.metric}, {better} is better")
    rows = [(v.name, f"{len(v.held_out)}/{len(v.held_out) + v.failed}", spread(v.held_out),
             *([spread(v.scores)] if tested else [])) for v in s.variants()]
    header = ("variant", "ok", f"held-out {task.metric}", *([f"test {task.metric}"] if tested else []))
    print_columns(header, rows)
    comparison = s.comparison()
    if comparison:
        print(f"\neach cell at its best settings (by held-out {task.metric}) against {s.plan.baseline}, "
              f"Welch's t-test over the seeds ({'test' if tested else 'held-out'} {task.metric}):")
        print_columns(("cell", "variant", "mean", "baseline", "difference", "p", "verdict"),
                      [(c.cell, c.variant, f"{c.mean:.4g}", f"{c.baseline_mean:.4g}", f"{c.difference:+.3g}",
                        "-" if c.p_value is None else f"{c.p_value:.3g}",
                        c.verdict + (f" ({c.note})" if c.note else "")) for c in comparison])
    for line in s.failures[:5]:
        print(f"failed: {line['trial']['variant']} seed {line['trial']['seed']}: {line['error'][:300]}")


def main(args) -> int:
    if args.show:
        print_tables(load_study(args.show))
        return 0
    options = {"address": args.address, "cpus_per_trial": args.cpus_per_trial, "on_progress": progress_printer(),
               "retry_failed": args.retry_failed}
    if args.resume:
        print_tables(resume_study(args.resume, **options))
        return 0
    if not args.cells:
        raise StudyError("no cell to study", hint="name presets or cell JSON files, e.g. `python -m engine study "
                                                  "lstm gru --task adding --seeds 3`")
    cells = [resolve_cell(spec) for spec in args.cells]
    space, settings = {}, {"device": args.device}
    for key, _, _ in SPACE_FLAGS:
        values = getattr(args, key)
        if values is not None:
            if len(values) == 1:
                settings[key] = values[0]
            else:
                space[key] = values
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    if seeds[-1] > MAX_SEED:
        raise StudyError(f"--first-seed + --seeds goes past the largest seed, {MAX_SEED}",
                         hint="a smaller --first-seed or fewer --seeds")
    print_tables(study(cells, args.task, seeds=seeds, space=space, settings=settings, folder=args.folder,
                       baseline=args.baseline, **options))
    return 0
