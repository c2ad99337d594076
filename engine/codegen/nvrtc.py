"""The one compile cache of the engine's CUDA: every generated module (codegen's forward kernels, the schedules'
wavefront kernels, the generated backward) and every hand-written kernels/*.cu file is loaded through `load_module`,
compiled as IEEE fp32: subnormal values kept, IEEE division and square roots.

CuPy's RawKernel and RawModule compile with NVRTC and append `-ftz=true` after the caller's options
(cupy/cuda/compiler.py, `_compile_with_cache_cuda`, CuPy 14.2); NVRTC honours the last `-ftz` it is given, so a
kernel compiled through them flushes subnormal inputs and results of float arithmetic to zero whatever it asks for.
The engine therefore compiles its modules with NVRTC itself and gives CuPy the CUBIN (`cupy.RawModule(path=...)`).
Two levels, one key (the source's hash):
- on disk, the CUBIN by source, options, architecture and NVRTC version, each written to a temporary file and renamed
  into place, so a file is there whole or not at all and two processes can share the cache;
- in memory, the loaded module by source hash, cooperative flag and device, so a process loads a module once.

    module = load_module(source, cooperative=True)          # a cupy.RawModule
    kernel = module.get_function("lstm_persistent")

The cache is the folder kernels/ of $CELLFORGE_CACHE_DIR, else of ~/.cache/cellforge (where the autotuner keeps its
choices), or of the temporary directory when that cannot be written.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
from pathlib import Path

from ..errors import CompileError
from ..files import cache_root

OPTIONS = ("--std=c++17", "-ftz=false", "-prec-div=true", "-prec-sqrt=true")


class NvrtcError(RuntimeError):
    """NVRTC refused the source; the message is its log."""


def cache_dir() -> Path:
    path = cache_root() / "kernels"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-{os.getpid()}-{threading.get_ident()}"
        probe.write_bytes(b"")
        probe.unlink()
        return path
    except OSError:
        fallback = Path(tempfile.gettempdir()) / "cellforge-kernels"
        fallback.mkdir(parents=True, exist_ok=True)
        return fallback


def nvrtc_options() -> tuple[str, ...]:
    """OPTIONS with the include folders CuPy gives NVRTC (the CUDA headers, e.g. cooperative_groups.h, and CuPy's
    CCCL copy), found the way CuPy finds them."""
    try:
        from cupy._core.core import assemble_cupy_compiler_options  # deferred: CuPy is optional (no GPU in CI)
    except ImportError:            # a CuPy without it: the CUDA headers where CuPy's CUDA path says
        import cupy
        return (*OPTIONS, f"-I{Path(cupy.cuda.get_cuda_path()) / 'include'}")
    return tuple(assemble_cupy_compiler_options(OPTIONS))


def compile_cubin(source: str, arch: str, options: tuple[str, ...] | None = None, name: str = "cellforge.cu") -> bytes:
    """The CUBIN of `source` for sm_<arch> (e.g. "90") with `options` (default nvrtc_options()); NvrtcError with
    NVRTC's log if it does not compile."""
    from cupy_backends.cuda.libs import nvrtc  # deferred: CuPy is optional (no GPU in CI)

    program = nvrtc.createProgram(source, name, [], [])
    try:
        try:
            nvrtc.compileProgram(program, [*(options or nvrtc_options()), f"-arch=sm_{arch}"])
        except nvrtc.NVRTCError as e:
            raise NvrtcError(f"{e}\n{nvrtc.getProgramLog(program)}") from None
        return nvrtc.getCUBIN(program)
    finally:
        nvrtc.destroyProgram(program)


def cubin_path(source: str, arch: str) -> Path:
    """Where the CUBIN of `source` for sm_<arch> is (compiled now unless cached)."""
    from cupy_backends.cuda.libs import nvrtc  # deferred: CuPy is optional (no GPU in CI)

    options = nvrtc_options()
    version = ".".join(str(v) for v in nvrtc.getVersion())
    key = hashlib.sha256("\x00".join([*options, arch, version, source]).encode()).hexdigest()[:32]
    path = cache_dir() / f"{key}-sm_{arch}.cubin"
    if not path.exists():
        cubin = compile_cubin(source, arch, options)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(cubin)
        os.replace(tmp, path)
    return path


_loaded: dict[tuple[str, bool, int], object] = {}
_loaded_lock = threading.Lock()


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def source_arch(source: str, capability: str) -> str:
    """The architecture to compile `source` for on a GPU of `capability` ("90"): Hopper's arch-specific "90a" where
    the source issues wgmma (kernels/wgmma.cuh), which only sm_90a has."""
    return capability + "a" if capability == "90" and "wgmma.mma_async" in source else capability


def load_module(source: str, cooperative: bool = False, cell: str | None = None, kernel: str | None = None):
    """The cupy.RawModule of `source` for the current device, compiled with OPTIONS (IEEE fp32); loaded once a
    process and device, the CUBIN compiled once a machine (cubin_path). cell, kernel: what the source is, for the
    CompileError raised when NVRTC refuses it."""
    import cupy  # deferred: CuPy is optional (no GPU in CI)

    device = cupy.cuda.Device()
    key = (source_hash(source), cooperative, device.id)
    with _loaded_lock:
        module = _loaded.get(key)
    if module is None:
        arch = source_arch(source, device.compute_capability)
        try:
            path = cubin_path(source, arch)
        except NvrtcError as e:
            raise compile_error(e, source, arch, cell, kernel) from None
        module = cupy.RawModule(path=str(path), enable_cooperative_groups=cooperative)
        with _loaded_lock:
            module = _loaded.setdefault(key, module)
    return module


def first_error(log: str) -> str:
    """The first line of a compiler log that reports an error (else its first non-empty line)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return next((line for line in lines if "error" in line), lines[0] if lines else "no log")


def kernel_at(source: str, line: int) -> str | None:
    """The kernel or device function whose definition the 1-based `line` of `source` falls in (the last one that
    starts at or before it)."""
    name = None
    for text in source.splitlines()[:line]:
        found = re.search(r"__(?:global|device)__.*?\b(\w+)\s*\(", re.sub(r"__launch_bounds__\([^)]*\)", "", text))
        if found and not text.lstrip().startswith("//"):
            name = found.group(1)
    return name


def compile_error(error: Exception, source: str, arch: str, cell: str | None, kernel: str | None) -> CompileError:
    """NVRTC's refusal of a module as the engine's CompileError: what did not compile (the cell; the kernel named by
    the caller, else the one the first error lies in) and the first error line."""
    line = first_error(str(error))
    at = re.search(r"\((\d+)\): error", line)
    kernel = kernel or (kernel_at(source, int(at.group(1))) if at else None)
    what = f"the CUDA of cell '{cell}'" if cell else "a CUDA module of the engine"
    if kernel:
        what += f", kernel {kernel},"
    return CompileError(f"{what} did not compile with NVRTC for sm_{arch}: {line}\n  hint: this is "
                        "a bug in the code generator; `python -m engine explain <cell>` prints the generated source, "
                        "and renaming the node named in the error works around it")
