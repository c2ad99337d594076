"""The step GEMMs' outputs kept in shared memory on the persistent kernel (engine/codegen/shared_outputs.py): where
the tiling places them, that the GEMMs write there and the cell code of every stage reads there, and where they stay
in global memory. The numbers are checked on the GPU against the float64 reference with every other schedule test
(tests/gpu/test_schedules.py and the rest, which run the persistent schedule at these sizes)."""
from __future__ import annotations

import engine
from engine.codegen.shared_outputs import staging_floats
from engine.codegen.wavefront import render_wavefront
from engine.compiler import make_plan
from engine.dense import wavefront_network
from engine.schedules.tiling import H100, TileConfig, make_tiling


def tiled(name, sizes, batch, persistent=True, config=None):
    I, H, L = sizes
    network = wavefront_network(engine.Network(engine.preset(name).cell, I, H, L))
    program = make_plan(network, 10, batch, layout="interleaved").program
    return network, program, make_tiling(program, network, batch, config or TileConfig(), H100, persistent=persistent)


def test_blogb_keeps_every_step_gemm_output_in_shared_memory_and_every_stage_reads_it_there():
    for name in ("lstm", "ln_lstm", "gru_cho"):
        network, program, tiling = tiled(name, (64, 256, 3), 64)
        multiplied = {t.name for t in tiling.gemms if t.name not in program.reductions}
        assert {n for n, _, _ in tiling.y_shared} == multiplied, name
        assert tiling.smem_bytes <= H100.smem_per_block
        ends = [at + 64 * ld for _, at, ld in tiling.y_shared]
        assert max(ends) * 4 == tiling.smem_bytes, name                    # the region ends the block's memory
        assert staging_floats(tiling) == min(at for _, at, _ in tiling.y_shared)
        source = render_wavefront(program, network, tiling)
        for g in program.gemms:
            if g.name in multiplied:
                at = next(at for n, at, _ in tiling.y_shared if n == g.name)
                assert f"smem + {at}," in source, (name, g.name)                # the GEMM's Y
                assert f"L.{g.out_buffer}" not in source, (name, g.name)        # nobody reads or writes it globally
                assert f"(smem + {at})[(int)b * " in source, (name, g.name)   # the cell code's loads
        assert "the GEMMs' outputs kept in shared memory" in tiling.describe()


def test_outputs_stay_in_global_memory_where_they_do_not_fit_or_the_kernel_is_not_persistent():
    _, _, mid = tiled("lstm", (512, 512, 4), 64)                 # 213 KiB in use, Y would need 32 more
    assert mid.y_shared == () and staging_floats(mid) == mid.smem_bytes // 4
    _, _, graph = tiled("lstm", (64, 256, 3), 64, persistent=False)
    assert graph.y_shared == ()
    _, _, gemv = tiled("lstm", (64, 256, 2), 2)                   # the warp GEMV path
    assert gemv.y_shared == ()
    network = wavefront_network(engine.Network(engine.preset("lstm").cell, 64, 256, 3))
    program = make_plan(network, 10, 64, layout="interleaved", precision="bfloat16").program
    bf16 = make_tiling(program, network, 64, TileConfig(), H100, persistent=True)
    assert bf16.y_shared == ()                                    # the tensor-core MMAs write Y as before


def test_the_outputs_kept_in_shared_memory_are_not_counted_as_device_memory():
    from engine.backends.fused import plan_bytes
    from engine.codegen.shared_outputs import untouched
    I, H, L, T, B = 64, 256, 3, 1000, 64
    network = wavefront_network(engine.Network(engine.preset("lstm").cell, I, H, L))
    plan = make_plan(network, T, B, layout="interleaved")
    tiling = make_tiling(plan.program, network, B, TileConfig(), H100, persistent=True)
    unused = untouched(plan.program, tiling)
    assert unused == {g.out_buffer for g in plan.program.gemms}          # x_proj's and h_gemm's results
    # the input projection's result alone is T x B x 4H floats a layer
    assert plan_bytes(plan) - plan_bytes(plan, unused) == L * (T * B + B) * 4 * H * 4
