"""nvcc flags for the CPU tests that only check that generated CUDA compiles (warnings as errors, no GPU): the
front end (cicc) and ptxas at -O0. Parsing, type checks, every warning and ptxas's resource checks still run; the
optimizer does not, which halves a compile (3.5 s -> 2.0 s for an LSTM's persistent source). The GPU suite compiles
the same sources through NVRTC with the engine's own options and runs them."""

CHECK_ONLY = ["-Xcicc", "-O0", "-Xptxas", "-O0"]


def nvcc_command(source_path, output_path) -> list[str]:
    """The flags the engine gives NVRTC (engine/codegen/nvrtc.py OPTIONS: --std=c++17, IEEE fp32: -ftz=false,
    -prec-div=true, -prec-sqrt=true), the same for cooperative kernels, for the arch NVRTC would get on an H100; plus
    warnings as errors, with the optimizer off (tests/nvcc_check.py: a check, not a build). No -I for kernels/:
    the source must inline its helpers, as NVRTC gets no include path from us."""
    from pathlib import Path

    from engine.codegen.nvrtc import OPTIONS, source_arch  # deferred: the flags and the arch rule are all it needs
    flags = [("-" + option.lstrip("-")) if option.startswith("--std") else option for option in OPTIONS]
    arch = source_arch(Path(source_path).read_text(), "90")        # sm_90a where the source issues wgmma
    return ["nvcc", f"-arch=sm_{arch}", *flags, *CHECK_ONLY, "--cubin", "-o", str(output_path), "-Werror",
            "all-warnings", str(source_path)]


def compile_sources(sources: dict, tmp_path, tail: int = 3000) -> None:
    """Compile every {label: CUDA source} with nvcc_command at once (one process each) and assert each compiled,
    showing the end of its output where one did not."""
    import subprocess
    jobs = []
    for label, source in sources.items():
        path = tmp_path / f"{label}.cu"
        path.write_text(source)
        jobs.append((label, subprocess.Popen(nvcc_command(path, tmp_path / f"{label}.cubin"), stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, text=True)))
    for label, job in jobs:
        output, _ = job.communicate(timeout=300)
        assert job.returncode == 0, f"{label}:\n{output[-tail:]}"

