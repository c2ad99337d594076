"""The persistent schedule's cluster mode on the GPU (TileConfig(sync="cluster"), engine/schedules/cluster.py): the
blocks of a head (or of a small layer) as one thread-block cluster exchanging h through distributed shared memory.
Each case runs on poisoned buffers against the reference that emulates the mode, and against the grid-barrier
schedule of the same precision; reruns are bit-identical."""
from __future__ import annotations

import numpy as np
import pytest
from test_fused import make_case, relative_error
from test_precision_gpu import check_mode

import engine
from engine.errors import BackendError, CompileError
from engine.schedules import schedule_class
from engine.schedules.tiling import TileConfig

pytestmark = pytest.mark.gpu


# Cases the wgmma path takes on sm_90 (the others: 40 rows pad to 48, or threads that are not whole warpgroups)
WGMMA_CASES = {("lstm", 512, 16), ("slstm", 768, 16), ("lstm", 256, 64), ("lstm", 192, 32), ("slstm", 256, 16)}


@pytest.mark.parametrize("name,hidden,batch,precision,layers,units", [
    ("slstm", 256, 16, "bfloat16", 1, None),       # 4 heads of 64 units: clusters of 8 blocks
    ("slstm", 256, 16, "bfloat16", 2, 4),          # 16 blocks a head: the non-portable cluster size; two launches
    ("slstm", 768, 16, "bfloat16", 1, None),       # heads of 192 units, 24 a block
    ("slstm", 512, 40, "float16", 1, 16),          # 40 rows: three MMA row tiles, the last one partly padding
    ("lstm", 256, 16, "bfloat16", 2, None),        # no heads: a cluster is the layer (8 blocks of 32 units)
    ("lstm", 512, 16, "bfloat16", 1, None),        # 8 blocks do not fit shared memory: 16 of 32 units, K = 512
    ("gru_cho", 192, 24, "bfloat16", 1, 12),       # two GEMM stages a step: a cluster barrier each
    ("gru", 128, 17, "float16", 1, 8),             # B not a multiple of 8
    ("lstm", 256, 64, "bfloat16", 1, None),        # 64 rows: wgmma's N = 64
    ("lstm", 192, 32, "float16", 1, 12),           # 48 weight rows a block: one tile, partly padding
])
@pytest.mark.parametrize("wgmma", [None, False], ids=["wgmma-where-it-applies", "mma-sync"])
def test_cluster_mode_matches(cupy, name, hidden, batch, precision, layers, units, wgmma):
    """wgmma=None takes the wgmma path with the weights in registers on an H100 / H200 wherever it applies
    (kernels/wgmma_gemm.cuh; all but the 40-row case here), False the mma.sync path from shared memory."""
    size = {"input_size": 48, "hidden_size": hidden, "batch": batch, "steps": 37}
    network, params, x, states = make_case(engine.preset(name).cell, layers, seed=hidden + batch, sizes=size)
    schedule = schedule_class("persistent")(network, params, precision=precision,
                                            config=TileConfig(units_per_block=units, sync="cluster", wgmma=wgmma))
    result = schedule.run(x, states, poison=True)
    assert "clusters of" in result.info["tiling"], result.info["tiling"]
    on_wgmma = "wgmma" in result.info["tiling"]
    assert not (wgmma is False and on_wgmma), result.info["tiling"]
    if wgmma is None and cupy.cuda.Device().compute_capability == "90" and (name, hidden, batch) in WGMMA_CASES:
        assert on_wgmma, result.info["tiling"]
    check_mode(result, network, params, x, states, precision, f"{name} {precision} cluster B={batch} L={layers}")
    again = schedule.run(x, states, poison=True)
    assert np.array_equal(again.outputs, result.outputs)
    grid = schedule_class("persistent")(network, params, precision=precision, config=TileConfig(sync="grid"))
    other = grid.run(x, states, poison=True)
    assert relative_error(result.outputs, other.outputs) <= 2e-2, "cluster against grid barriers"


def test_cluster_mode_replays_and_starts_from_given_states(cupy):
    """The captured replay (a second run at the same shape) and initial states other than zero."""
    size = {"input_size": 32, "hidden_size": 256, "batch": 16, "steps": 19}
    network, params, x, states = make_case(engine.preset("slstm").cell, 1, seed=9, sizes=size)
    schedule = schedule_class("persistent")(network, params, precision="bfloat16", config=TileConfig(sync="cluster"))
    first = schedule.run(cupy.asarray(x), states)
    second = schedule.run(cupy.asarray(x), states)
    assert np.array_equal(cupy.asnumpy(first.outputs), cupy.asnumpy(second.outputs))
    check_mode(schedule.run(x, states, poison=True), network, params, x, states, "bfloat16", "slstm replay")


def test_cluster_mode_refusals_name_the_reason(cupy):
    network = engine.Network(engine.preset("ln_lstm").cell, 32, 256, 1)
    params = engine.init_params(network, seed=0)
    x = np.zeros((5, 16, 32), dtype=np.float32)
    with pytest.raises((CompileError, BackendError), match="reduction"):
        schedule_class("persistent")(network, params, precision="bfloat16",
                                     config=TileConfig(sync="cluster")).run(x)
    network = engine.Network(engine.preset("lstm").cell, 32, 512, 1)      # 512 units over at most 16 blocks
    params = engine.init_params(network, seed=0)
    with pytest.raises((CompileError, BackendError), match="units_per_block"):
        schedule_class("persistent")(network, params, precision="bfloat16",
                                     config=TileConfig(units_per_block=16, sync="cluster")).run(x)
