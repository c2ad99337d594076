"""The generated kernels' lines for the step GEMMs on wgmma with streamed weights (kernels/wgmma_stream.cuh,
TileConfig(stream_wgmma=True), engine/schedules/stream.py): whether the weight's feed runs ahead into the next step,
and the persistent kernel's drain at its end."""
from __future__ import annotations


def stream_ahead(program, tiling, present) -> bool:
    """Whether the wgmma stream's weight feed stages the next call's first chunks as a call ends (kernels/
    wgmma_stream.cuh AHEAD): on the persistent kernel, where each block's calls all run the same GEMMs (one stage of
    them a step) and no reduction uses the staging area between them. present: the stages the kernel runs."""
    if not (tiling.stream_n and tiling.persistent) or program.reductions or tiling.cluster or tiling.y_shared:
        return False                     # (outputs or partial sums in the staging area would meet the early copies)
    with_gemms = [s for s in present if (s == present[0] and tiling.num_layers > 1 and program.hoisted_gemms)
                  or (s and program.step_gemms(s))]
    return len(with_gemms) == 1


def stream_drain(tiling) -> list[str]:
    """The persistent kernel's end with the wgmma stream: the weight copies staged for a step that never came land
    before the block exits."""
    return (["    if constexpr (STREAM_AHEAD) rnn_stream_drain<STAGES>(smem + SCRATCH);"] if tiling.stream_n else [])
