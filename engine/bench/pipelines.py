"""The pipelined runs benchmarks/probe_pipeline.py measured (benchmarks/results/pipeline-*.json), read back for
the app: one row per plan measured."""
from __future__ import annotations

import json
from pathlib import Path

from . import results

MEASUREMENT_FIELDS = ("net", "gpus", "backend", "device", "choice", "split", "chunk", "ms", "measured_bubble",
                      "predicted_ms", "predicted_bubble", "one_gpu_best", "one_gpu_ms", "max_rel_diff")


def measured_pipelines(directory=None) -> tuple[list[dict], list[tuple[str, str]]]:
    """The pipelined runs written by benchmarks/probe_pipeline.py (benchmarks/results/pipeline-*.json with one row
    per plan measured: the planner's and the tuner's), flattened to one row each with its file, and the files that
    are not such runs, with why (left as they are). Rows: MEASUREMENT_FIELDS plus "file", "speedup" (against the
    best one-GPU run of the same net in the same file), "replay" and "fuse_pools" (how the chunks ran; files written
    before the replay existed issued them run by run)."""
    directory = Path(directory) if directory is not None else results.RESULTS_DIR
    rows, skipped = [], []
    for path in sorted(directory.glob("pipeline-*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            skipped.append((path.name, f"not readable as JSON: {e}"))
            continue
        if not isinstance(data, list) or not data or not all(isinstance(r, dict) and "choice" in r for r in data):
            skipped.append((path.name, "not a list of measured plans (an earlier sweep's format)"))
            continue
        missing = sorted({f for r in data for f in MEASUREMENT_FIELDS if f not in r})
        if missing:
            skipped.append((path.name, f"rows without {', '.join(missing)}"))
            continue
        for r in data:
            one = r["one_gpu_ms"].get(r["one_gpu_best"]) if isinstance(r["one_gpu_ms"], dict) else None
            rows.append({**{f: r[f] for f in MEASUREMENT_FIELDS if f != "one_gpu_ms"}, "one_gpu_ms": one,
                         "speedup": one / r["ms"] if one and r["ms"] else None, "file": path.name,
                         "replay": bool(r.get("replay", False)), "fuse_pools": bool(r.get("fuse_pools", False))})
    return rows, skipped
