"""benchmarks/probe_tf32_cluster_gemm.py on the CPU: the weights' halves in registers and in shared memory cover every
k step of every warpgroup exactly once, each variant fits a block's shared memory, its tiles start on 1024-byte
boundaries (the descriptors' 128-byte swizzle), and its kernel compiles for sm_90a with nvcc. The GPU runs it against
NumPy."""
from __future__ import annotations

import shutil
import subprocess

import pytest
from script_loader import load_script


def probe():
    return load_script("probe_tf32_cluster_gemm")


@pytest.mark.parametrize("reg_ks", [12, 16])
def test_each_k_step_comes_once_from_registers_or_shared_memory(reg_ks):
    """The kernel's weight_slot and staging, in Python: part p's k steps [32 p, 32 p + reg_ks) from registers, the
    rest from the chunks staged at columns (32 p + reg_ks + 4 c) * 8, slot p * (smem_ks / 4) + c."""
    module = probe()
    ks_all, part_ks = module.K // 8, module.K // 8 // 2
    smem_ks = part_ks - reg_ks
    assert smem_ks % 4 == 0                                          # whole 128-byte chunks of 4 k steps
    staged = {}                                                      # slot -> first column of its chunk
    for part in range(2):
        for c in range(smem_ks // 4):
            staged[part * (smem_ks // 4) + c] = (part * part_ks + reg_ks + 4 * c) * 8
    seen = []
    for part in range(2):
        for s in range(part_ks):
            ks = part * part_ks + s
            if s < reg_ks:
                seen.append(ks)
            else:
                slot = part * (smem_ks // 4) + (ks - part * part_ks - reg_ks) // 4
                assert staged[slot] <= ks * 8 < staged[slot] + 32          # the chunk holds this k step
                seen.append(ks)
    assert sorted(seen) == list(range(ks_all))
    assert len(staged) * module.NC * 128 + module.K // 32 * module.B_ROWS * 128 + 1024 <= module.shared_bytes(reg_ks)


@pytest.mark.parametrize("reg_ks", [12, 16])
def test_each_variant_fits_a_block_and_its_tiles_are_1024_byte_aligned(reg_ks):
    module = probe()
    assert module.shared_bytes(reg_ks) <= 227 * 1024                  # an H100 / H200 block's shared memory
    assert (module.NC * 128) % 1024 == 0 and (64 * 128) % 1024 == 0 and (module.B_ROWS * 128) % 1024 == 0


@pytest.mark.nvcc
@pytest.mark.parametrize("reg_ks", [12, 16])
def test_the_probe_kernel_compiles_for_sm_90a(reg_ks, tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    source = tmp_path / f"probe_tf32_{reg_ks}.cu"
    source.write_text(probe().source(reg_ks))
    job = subprocess.run(["nvcc", "-arch=sm_90a", "--std=c++17", "--cubin", "-Werror", "all-warnings", "-Xptxas", "-v",
                          "-o", str(tmp_path / "probe.cubin"), str(source)], capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, (job.stdout + job.stderr)[-3000:]
    assert "C7520" not in job.stderr and "C7517" not in job.stderr     # the wgmma chain is not serialized by ptxas
