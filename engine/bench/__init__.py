"""The benchmark and divergence harness: every implementation of a cell timed side by side on the GPU.

    from engine.bench import run_bench, load_results, list_results, markdown_table
    results = run_bench(["lstm", "gru"], ["mid", "512,512,2,100,1"], quick=True, progress=callback)

Implementations: the engine's GPU backends (naive, fused, and the schedules graph, persistent and
auto, each its own row), cuDNN through torch.nn in fp32 (TF32 off), TF32, fp16 and bf16, the engine's
schedules and auto in those reduced precisions too (graph-tf32, persistent-fp16, auto-bf16, ...; each
also timed against the cuDNN row of its own mode), and the cell graph in torch ops (eager, and the
faster of torch.compile and TorchScript). Each is checked against a float64 reference before it is
timed; per-step error curves are kept for the app. A net configuration (`deepspeech`) times a whole network
of blocks instead: cuDNN's modules against the engine's run_net (engine/bench/nets.py). `python -m engine bench`
is the CLI. pipelines.py reads back the multi-GPU pipelines benchmarks/probe_pipeline.py measured.

May import: engine.nets, engine.multigpu, engine.schedules, engine.backends, engine.autodiff and lower modules; never
engine.api, engine.explain, engine.export or engine.commands. (The FLOP counts are engine/flops.py's; flops.py
here holds the floors and a training step's products.)
"""
from ..flops import layer_step_flops, network_flops
from .configs import ANCHORS, NET_ANCHORS, BenchConfig, NetBenchConfig, load_config_file, parse_config, parse_configs
from .divergence import TOLERANCE, error_summary, step_curves
from .flops import floors
from .results import (
                      RESULTS_DIR,
                      SCHEMA,
                      SCHEMA_VERSION,
                      list_results,
                      load_results,
                      markdown_table,
                      save_results,
                      text_summary,
                      unreadable_results,
)
from .runner import run_bench
from .timeline import timeline

__all__ = ["ANCHORS", "NET_ANCHORS", "BenchConfig", "NetBenchConfig", "load_config_file", "parse_config", "parse_configs", "TOLERANCE",
           "error_summary", "step_curves", "floors", "layer_step_flops", "network_flops", "RESULTS_DIR", "SCHEMA",
           "SCHEMA_VERSION", "list_results", "load_results", "markdown_table", "save_results", "text_summary",
           "unreadable_results", "run_bench", "timeline"]
