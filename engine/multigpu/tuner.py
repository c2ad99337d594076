"""Measuring the chunk and the split of a pipeline on this host's GPUs, and keeping the fastest plan on disk
(pipelines.json beside the schedules' autotune.json)."""
from __future__ import annotations

import hashlib
import logging

import numpy as np

from ..errors import BackendError
from ..nets.data import Net
from ..nets.io import net_to_json
from ..schedules.autotune import cache_path, read_cache, write_entry
from .plan import PipelinePlan, at_block_boundaries, plan_pipeline
from .program import PipelineProgram
from .results import PipelineMeasurement


def block_boundary_split(plan: PipelinePlan) -> list[int] | None:
    """The plan's split with each cut moved to the nearest boundary between blocks (a GPU then runs whole blocks, so
    fewer pieces a chunk: DeepSpeech's [3, 5] becomes [4, 4]); None where it is the same or would empty a GPU."""
    runs = at_block_boundaries(plan.units, plan.split)
    return None if runs is None else [len(run) for run in runs]


PIPELINE_CACHE = "pipelines.json"      # beside the schedules' autotune.json (engine/schedules/autotune.py)


def tuned_key(net: Net, gpus: int, steps: int, batch: int, backend: str, fuse_pools: bool, device: str) -> str:
    digest = hashlib.sha256(net_to_json(net).encode()).hexdigest()[:16]
    return f"{net.name}|{digest}|gpus{gpus}|T{steps}|B{batch}|{backend}|fuse{int(fuse_pools)}|{device}"


def tuned_plan(net: Net, gpus: int, steps: int, batch: int, *, backend: str = "persistent", fuse_pools: bool = False,
               device: str | None = None, **plan_options) -> PipelinePlan | None:
    """The plan tune_pipeline found fastest for this net, sizes and backend on GPUs named `device` (else GPU 0's
    name), with its measured time and bubble, or None if it was never tuned there."""
    if device is None:
        import cupy  # deferred: CuPy is optional (no GPU in CI)
        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    entry = read_cache(cache_path(PIPELINE_CACHE)).get(tuned_key(net, gpus, steps, batch, backend, fuse_pools,
                                                                  device))
    if entry is None:
        return None
    try:
        plan = plan_pipeline(net, gpus, steps, batch, split=list(entry["split"]), chunk=int(entry["chunk"]),
                             **plan_options)
        plan.measured = PipelineMeasurement(float(entry["ms"]), [float(b) for b in entry["busy_ms"]],
                                            int(entry["repeats"]))
    except (KeyError, TypeError, ValueError, BackendError) as e:
        logging.getLogger(__name__).warning("tuned pipeline entry for net '%s' is unusable (%s); ignored", net.name, e)
        return None
    plan.notes.append(f"tuned on {device}: the fastest of {entry.get('candidates', '?')} measured candidates")
    return plan


def tune_pipeline(net: Net, params, gpus: int, steps: int, batch: int, *, backend: str = "persistent", x=None,
                  chunks: list[int] | None = None, splits: list[list[int]] | None = None, warmup: int = 1,
                  repeats: int = 3, seed: int = 0, fuse_pools: bool = False, use_cache: bool = True,
                  replay: bool = True, **plan_options) -> tuple[PipelinePlan, list[dict]]:
    """Measure the pipeline on this host's GPUs and keep the fastest plan (the model: plan.py): the planner's
    chunk and the powers of two from a quarter to four times it, over the planner's split, the FLOP-balanced one and
    each with its cuts at block boundaries (or the given chunks and splits). Returns the plan, with .measured set, and
    every candidate's row (split, chunk, ms, bubble, or the error that ruled it out). x: the input (else normal random
    on GPU 0). fuse_pools, replay: how each candidate's PipelineProgram runs. use_cache: the winner is written to the
    pipelines cache, where tuned_plan() finds it (replayed runs only: what PipelineProgram does by default)."""
    import cupy  # deferred: CuPy is optional (no GPU in CI)
    present = cupy.cuda.runtime.getDeviceCount()
    base = plan_pipeline(net, gpus, steps, batch, available=present, **plan_options)
    if splits is None:               # the planner's split, the FLOP-balanced one, each with its cuts at block boundaries
        balanced = plan_pipeline(net, gpus, steps, batch, available=present,
                                 **{**plan_options, "host_us_per_run": 0.0})
        splits = []
        for plan in (base, balanced):
            for split in ([len(run) for run in plan.split], block_boundary_split(plan)):
                if split is not None and split not in splits:
                    splits.append(split)
    if chunks is None:
        chunks = [base.chunk] + [c for c in (2 ** k for k in range(2, 12)) if base.chunk / 4 <= c <= 4 * base.chunk
                                 and c < steps]
    if x is None:
        with cupy.cuda.Device(0):
            x = cupy.asarray(np.random.default_rng(seed).standard_normal((steps, batch, net.input_size)),
                             dtype=cupy.float32)
    rows, best = [], None
    seen = set()
    for split in splits:
        for chunk in chunks:
            plan = plan_pipeline(net, gpus, steps, batch, split=list(split), chunk=chunk, available=present,
                                 **plan_options)
            key = (tuple(len(run) for run in plan.split), plan.chunk)
            if key in seen:                        # two chunks the pools round to the same one
                continue
            seen.add(key)
            row = {"split": list(key[0]), "chunk": plan.chunk, "predicted_ms": plan.predicted_ms}
            try:
                measured = PipelineProgram(net, params, plan, backend=backend, fuse_pools=fuse_pools,
                                           replay=replay).measure(x, warmup=warmup, repeats=repeats)
            except BackendError as e:
                row["error"] = str(e).splitlines()[0]
            else:
                plan.measured = measured
                row.update(ms=measured.ms, bubble=measured.bubble, busy_ms=measured.busy_ms)
                if best is None or measured.ms < best.measured.ms:
                    best = plan
            rows.append(row)
    if best is None:
        raise BackendError(f"no pipeline plan of net '{net.name}' ran on {gpus} GPU(s): "
                           + "; ".join(f"split {r['split']} chunk {r['chunk']}: {r['error']}" for r in rows))
    if use_cache and replay:
        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        write_entry(tuned_key(net, gpus, steps, batch, backend, fuse_pools, device),
                    {"split": [len(run) for run in best.split], "chunk": best.chunk, "ms": best.measured.ms,
                     "busy_ms": best.measured.busy_ms, "repeats": best.measured.repeats,
                     "candidates": sum("ms" in r for r in rows)}, cache_path(PIPELINE_CACHE))
    return best, rows
