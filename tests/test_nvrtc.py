"""engine/codegen/nvrtc.py: the engine compiles its CUDA with NVRTC as IEEE fp32 (no flush of subnormals to zero,
which CuPy's RawKernel would force), caches CUBINs on disk, and reports NVRTC's log when a source does not compile.
NVRTC needs no GPU, so all of it runs in CI."""
from __future__ import annotations

import pytest

from engine.codegen import nvrtc as engine_nvrtc


@pytest.fixture(scope="module")
def nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc
        nvrtc.getVersion()
    except Exception as e:        # no CuPy, or no NVRTC library on this machine
        pytest.skip(f"NVRTC is not available here: {type(e).__name__}: {e}")
    return nvrtc


FMA = r'''extern "C" __global__ void fma_half(float* a, const float* b, const float* c)
{
    a[threadIdx.x] = fmaf(b[threadIdx.x], c[threadIdx.x], a[threadIdx.x]) * 0.5f + sqrtf(c[threadIdx.x]) / b[threadIdx.x];
}
'''


def test_the_engine_options_keep_subnormals_and_ieee_division(nvrtc):
    program = nvrtc.createProgram(FMA, "fma.cu", [], [])
    try:
        nvrtc.compileProgram(program, [*engine_nvrtc.OPTIONS, "-arch=compute_90"])
        ptx = nvrtc.getPTX(program)
    finally:
        nvrtc.destroyProgram(program)
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    body = [line.strip() for line in ptx.splitlines() if ".f32" in line and not line.strip().startswith(".")]
    assert any(line.startswith("fma.rn.f32") for line in body), body
    assert any(line.startswith("div.rn.f32") for line in body) and any(line.startswith("sqrt.rn.f32") for line in body)
    assert not [line for line in body if ".ftz" in line or ".approx" in line], body


def test_cubins_are_cached_on_disk_and_written_whole(nvrtc, tmp_path, monkeypatch):
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(tmp_path))
    first = engine_nvrtc.cubin_path(FMA, "90")
    assert first.parent == tmp_path / "kernels" and first.stat().st_size > 0
    assert first.read_bytes()[:4] == b"\x7fELF"              # a CUBIN is an ELF image
    mtime = first.stat().st_mtime_ns
    assert engine_nvrtc.cubin_path(FMA, "90") == first and first.stat().st_mtime_ns == mtime     # not compiled again
    assert engine_nvrtc.cubin_path(FMA + "\n// changed\n", "90") != first
    assert engine_nvrtc.cubin_path(FMA, "80") != first
    assert not list((tmp_path / "kernels").glob("*.tmp"))


def test_a_source_that_does_not_compile_reports_nvrtc_log(nvrtc):
    bad = FMA.replace("fmaf(", "fmaff(")
    with pytest.raises(engine_nvrtc.NvrtcError, match="fmaff"):
        engine_nvrtc.compile_cubin(bad, "90")


def test_an_unwritable_cache_falls_back_to_the_temporary_directory(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("CELLFORGE_CACHE_DIR", str(blocked))
    path = engine_nvrtc.cache_dir()
    assert path.is_dir() and path.name == "cellforge-kernels"


def test_cuda_headers_are_found_as_cupy_finds_them(nvrtc):
    """The persistent kernels include <cooperative_groups.h>: NVRTC gets CuPy's include folders, not -ftz=true."""
    source = "#include <cooperative_groups.h>\n" + FMA.replace("fma_half", "fma_grid")
    assert engine_nvrtc.compile_cubin(source, "90")[:4] == b"\x7fELF"
    options = engine_nvrtc.nvrtc_options()
    assert any(option.startswith("-I") for option in options) and "-ftz=false" in options
    assert not [option for option in options if option.startswith("-ftz=") and option != "-ftz=false"]
