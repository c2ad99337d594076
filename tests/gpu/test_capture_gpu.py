"""engine.chunk_replay.capture_graph on the GPU: garbage of an earlier run is not collected inside a capture. A cuBLAS
handle freed there (engine.autodiff.cublas.Sgemm, destroyed with its object) invalidates the capture
(cudaErrorStreamCaptureInvalidated); a freed memory pool, stream, event, graph, module or pinned buffer does not
(measured on an H200, 2026-11-27). The GPU suite under xdist met it: a persistent replay captured in a worker whose
earlier training tests left handles to the collector."""
from __future__ import annotations

import pytest

from engine.autodiff.cublas import Sgemm
from engine.chunk_replay import capture_graph

pytestmark = pytest.mark.gpu


class Cycle:
    """Reachable only through itself: freed by the collector, never by reference counting."""


def garbage_holding_a_cublas_handle(cupy):
    cycle = Cycle()
    cycle.self, cycle.handle = cycle, Sgemm(cupy)


def test_a_capture_survives_garbage_that_holds_a_cublas_handle(cupy):
    x = cupy.arange(4096, dtype=cupy.float32)
    y = x * 2                                   # compiled and loaded before the capture
    cupy.cuda.get_current_stream().synchronize()

    garbage_holding_a_cublas_handle(cupy)      # for the collector before the capture

    def body():
        churn = [[] for _ in range(50_000)]     # many times the collector's first threshold: it would run here
        del churn
        y[...] = x * 2
        return y

    y.fill(-1.0)
    graph, out = capture_graph(cupy, body)
    assert out is y and float(y[0]) == -1.0     # captured, not run
    graph.launch(cupy.cuda.get_current_stream())
    cupy.cuda.get_current_stream().synchronize()
    assert bool((y == x * 2).all())
