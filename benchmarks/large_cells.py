"""Build, validate, emit and explain time of large cells (docs/reliability.md, "Large cells").

The shapes of tests/test_dsl_scale.py at 10,000 nodes: side by side (1,667 gated terms summed pairwise), a chain of
10,000 adds, and a value read twice at each of 24 levels (2^24 paths). Each step is timed once, cold (explain
compiles the cell), then the median of three warm runs; a table goes to stdout.

    python benchmarks/large_cells.py
"""
from __future__ import annotations

import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_dsl_scale import chain, doubling, wide  # noqa: E402

import engine  # noqa: E402
from engine.dsl import cell  # noqa: E402
from engine.dsl_emit import emit_dsl  # noqa: E402
from engine.serialize import from_dict, to_dict  # noqa: E402


def timed(fn) -> tuple[float, float]:
    """(cold seconds, median of 3 warm seconds)."""
    start = time.perf_counter()
    fn()
    cold = time.perf_counter() - start
    warm = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        warm.append(time.perf_counter() - start)
    return cold, statistics.median(warm)


def main() -> None:
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"sys.getrecursionlimit() = {sys.getrecursionlimit()}")
    print("| shape | nodes | build (s) | validate (s) | emit (s) | explain cold / warm (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, fn in [("side by side", wide(1667)), ("chain of adds", chain(10_000)),
                      ("read twice x 24 levels", doubling(24))]:
        graph = cell(fn)
        build = timed(lambda: cell(fn))[1]
        validate = timed(lambda: from_dict(to_dict(graph)))[1]
        emit = timed(lambda: emit_dsl(graph))[1]
        explain_cold, explain_warm = timed(lambda: engine.explain(graph))
        print(f"| {label} | {len(graph.nodes):,} | {build:.3f} | {validate:.3f} | {emit:.3f} | "
              f"{explain_cold:.3f} / {explain_warm:.3f} |")


if __name__ == "__main__":
    main()
