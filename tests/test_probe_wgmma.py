"""benchmarks/probe_wgmma.py on the CPU: its two kernels (warpgroup MMA and warp MMA over the same swizzled tiles)
compile with nvcc for sm_90a (wgmma is arch-specific), and the layout arithmetic it relies on holds: the 128-byte
swizzle is a permutation of each row's 16-byte groups, whose 8-row blocks are 1024 bytes apart (the descriptors'
stride), and every tile it addresses starts on a 1024-byte boundary. The GPU runs it against NumPy."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from script_loader import load_script

PROBE = Path(__file__).resolve().parents[1] / "benchmarks" / "probe_wgmma.py"


def probe():
    return load_script("probe_wgmma")


def swz(row: int, group: int) -> int:        # the kernels' swz()
    return row * 128 + ((group ^ (row & 7)) << 4)


def test_the_swizzle_permutes_each_rows_groups_and_keeps_core_matrices_1024_bytes_apart():
    for row in range(64):
        assert sorted(swz(row, g) - row * 128 for g in range(8)) == [16 * g for g in range(8)]
    assert all(swz(r + 8, g) - swz(r, g) == 1024 for r in range(56) for g in range(8))


@pytest.mark.parametrize("case", ["large", "blogA", "large-tf32", "blogA-tf32"])
def test_every_tile_starts_on_1024_bytes_and_fits_shared_memory(case):
    module = probe()
    c = module.CASES[case]
    K, nt, B, chunk = c["K"], c["nt"], c["B"], module.chunk_columns(c["kind"])
    assert chunk * (2 if c["kind"] == "bf16" else 4) == 128                # a chunk row is one 128-byte row
    w_tiles = [i * nt * 128 for i in range(K // chunk)]
    x_tiles = [(K // chunk) * nt * 128 + buffer * B * 128 for buffer in range(2)]
    groups = [x + g * 64 * 128 for x in x_tiles for g in range(B // 64)]
    assert all(t % 1024 == 0 for t in w_tiles + groups) and K % chunk == 0
    assert module.shared_bytes(nt, B, K, c["kind"]) <= 227 * 1024          # an H100 / H200 block's shared memory
    assert B % 64 == 0 and nt % 16 == 0 and (c["blocks"] * nt) % 8 == 0


@pytest.mark.nvcc
@pytest.mark.parametrize("nt,kind", [(64, "bf16"), (32, "bf16"), (32, "tf32"), (16, "tf32")])
def test_the_probe_kernels_compile_for_sm_90a(nt, kind, tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    source = tmp_path / f"probe_wgmma_{nt}_{kind}.cu"
    source.write_text(probe().source(nt, kind))
    job = subprocess.run(["nvcc", "-arch=sm_90a", "--std=c++17", "--cubin", "-Werror", "all-warnings", "-o",
                          str(tmp_path / "probe.cubin"), str(source)], capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, (job.stdout + job.stderr)[-3000:]


@pytest.mark.nvcc
def test_every_wgmma_shape_of_the_header_assembles(tmp_path):
    """kernels/wgmma.cuh's six RnnWgmma specializations (N = 16, 32, 64; bf16 and tf32) through ptxas: a kernel
    that issues each (ptxas checks the instruction text only where it is used)."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    calls = []
    for n in (16, 32, 64):
        for tf32 in ("false", "true"):
            calls.append(f"{{ float d[{n // 2}] = {{}}; rnn_wgmma_fence(); RnnWgmma<{n}, {tf32}>::mma(d, a, b, 0); "
                         f"rnn_wgmma_commit(); rnn_wgmma_wait<0>(); out[threadIdx.x] += d[0]; }}")
    source = tmp_path / "wgmma_shapes.cu"
    source.write_text((PROBE.parents[1] / "kernels" / "wgmma.cuh").read_text() + """
extern "C" __global__ void every_shape(float* out, unsigned long long a, unsigned long long b)
{
""" + "\n".join("    " + c for c in calls) + "\n}\n")
    job = subprocess.run(["nvcc", "-arch=sm_90a", "--std=c++17", "--cubin", "-Werror", "all-warnings", "-o",
                          str(tmp_path / "shapes.cubin"), str(source)], capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, (job.stdout + job.stderr)[-3000:]
