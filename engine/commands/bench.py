"""`python -m engine bench`: time the engine's backends against cuDNN and PyTorch on the GPU."""
from __future__ import annotations

from .. import backends
from ..bench import ANCHORS, NET_ANCHORS, markdown_table, parse_configs, run_bench, text_summary
from ..bench import results as bench_results
from ..bench.implementations import select
from ..bench.nets import net_markdown_table
from ..bench.progress import TextProgress
from ..bench.training import bench_training, training_key, training_table
from ..errors import BackendError
from ..gallery import get as get_preset
from ._common import add_seed_arg, check_input_file, check_output_folder, float_flag, int_flag, resolve_cell


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="benchmark a cell on the GPU against cuDNN and PyTorch (needs a CUDA GPU)",
        description="Time every available implementation of a cell side by side on the GPU (the engine's "
                    "backends, cuDNN fp32/TF32/fp16/bf16, the cell in torch ops eager and compiled, FlashRNN's "
                    "LSTM, GRU and sLSTM where it is installed), after "
                    "checking each against a float64 reference. Results go to a JSON file.")
    parser.add_argument("--preset", "-p", action="append", metavar="NAME|CELL.json",
                        help="cell to benchmark, repeatable (default: lstm)")
    parser.add_argument("--config", "-c", action="append", metavar="NAME|I,H,L,T,B|FILE.json",
                        help="configuration, repeatable: an anchor (blogB, mid, lat, large, blogA), five "
                             "integers I,H,L,T,B, a JSON file (benchmarks/configs/), or a network (deepspeech: "
                             "the preset's cell in 4 layers, max-pool over time, 4 more); default: every anchor")
    parser.add_argument("--impl", action="append", metavar="NAME",
                        help="only these implementations, repeatable (e.g. fused, graph, persistent, auto, cudnn-fp32, "
                             "torch-compile; with --train: cudnn-fp32, fused, naive, and per mode tf32, bf16, fp16: "
                             "cudnn-bf16, fused-bf16, ...)")
    parser.add_argument("--quick", action="store_true",
                        help="20 repetitions, 3 warm-ups, 3 input buffers, 60 s of compile budget (else 50, 5, 4, 300 s)")
    parser.add_argument("--reps", type=int_flag(1, 10**6), help="timed repetitions (at least 20)")
    parser.add_argument("--warmup", type=int_flag(0, 10**6), help="untimed runs first")
    parser.add_argument("--buffers", type=int_flag(1, 1024), help="input buffers the repetitions rotate among")
    parser.add_argument("--compile-budget", type=float_flag(0), metavar="SECONDS",
                        help="seconds the whole run may spend compiling, for torch.compile and for TorchScript each")
    parser.add_argument("--time-budget", type=float_flag(0, low_inclusive=False), metavar="SECONDS",
                        help="stop starting new measurements after this long (the rest are reported skipped)")
    add_seed_arg(parser, "parameters and inputs")
    parser.add_argument("--out", default=None, metavar="DIR", help="results folder (default: benchmarks/results)")
    parser.add_argument("--copy-to", default=None, metavar="DIR", help="also write the results JSON here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--list-configs", action="store_true", help="print the anchor configurations and exit")
    parser.add_argument("--train", action="store_true",
                        help="time a training step (forward + backward, fp32, TF32 off; and rows in tf32, bf16 and "
                             "fp16, their error against float64 reported) of the engine against cuDNN's "
                             "instead, each checked against float64 gradients first (engine/bench/training.py; "
                             "default configuration blogB, 5 repetitions)")
    parser.set_defaults(func=main)


def bench_cells(values: list[str] | None) -> list:
    """Each --preset: a Preset by name (its documentation goes with the results), or a cell JSON file."""
    return [resolve_cell(value) if value.endswith(".json") else get_preset(value) for value in values or ["lstm"]]


def main(args) -> int:
    if args.list_configs:
        for config in [*ANCHORS.values(), *NET_ANCHORS.values()]:
            print(f"{config.name:<10} {config.shape}")
        return 0
    for value in args.config or []:
        if value.endswith(".json"):
            check_input_file(value, "--config", "configuration", "give an anchor name, I,H,L,T,B or a "
                             "configuration JSON file (benchmarks/configs/)", text=True)
    configs = parse_configs(args.config)      # bad input is reported before the GPU is looked for
    cells = bench_cells(args.preset)
    check_output_folder(args.out or bench_results.RESULTS_DIR, "--out", "benchmark results")
    if args.copy_to:
        check_output_folder(args.copy_to, "--copy-to", "copy of the benchmark results")
    for name in args.impl or []:              # named before the GPU is looked for, as the configurations are
        training_key(name) if args.train else select([], [name])
    ok, why = backends.gpu_status()
    if not ok:
        raise BackendError(f"`python -m engine bench` needs a CUDA GPU: {why}\n  hint: run it on a machine with an "
                           "NVIDIA GPU, CuPy (`./run` installs it, and the CUDA wheels where nvidia-smi lists a GPU) "
                           "and, for the cuDNN and PyTorch baselines, torch with CUDA; `--list-configs` works "
                           "without one")
    if args.train:
        results = bench_training(cells, args.config or ["blogB"], implementations=args.impl, reps=args.reps or 5,
                                 warmup=args.warmup or 1, seed=args.seed, out_dir=args.out or bench_results.RESULTS_DIR)
        print(training_table(results))
        for path in results.get("saved_to", []):
            print(f"results: {path}")
        return 0
    progress = None if args.no_progress else TextProgress()
    try:
        results = run_bench(cells, configs, implementations=args.impl, quick=args.quick, reps=args.reps,
                            warmup=args.warmup, buffers=args.buffers, compile_budget_s=args.compile_budget,
                            time_budget_s=args.time_budget, seed=args.seed,
                            out_dir=args.out or bench_results.RESULTS_DIR, copy_to=args.copy_to, progress=progress)
    finally:
        if progress is not None:
            progress.close()
    print(text_summary(results))
    if results.get("cells"):
        print(markdown_table(results))
    if results.get("nets"):
        print()
        print(net_markdown_table(results))
    print()
    for path in results.get("saved_to", []):
        print(f"results: {path}")
    return 0
