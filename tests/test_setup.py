"""The one-command install (issue #9, "one install"): CuPy is a requirement everywhere it has a wheel, and `./run`
adds the CUDA wheels exactly where `nvidia-smi -L` lists a GPU, with pins that agree with the test requirements.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def requirements(name: str) -> dict[str, Requirement]:
    reqs = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            reqs[req.name] = req
    return reqs


def applies(req: Requirement, platform: str) -> bool:
    return req.marker is None or req.marker.evaluate({"sys_platform": platform})


def test_cupy_is_a_requirement_wherever_its_wheel_exists():
    cupy = requirements("requirements.txt")["cupy-cuda13x"]
    assert applies(cupy, "linux") and applies(cupy, "win32")
    assert not applies(cupy, "darwin"), "no CUDA wheel for macOS: pip would fail there"
    assert cupy.specifier.contains("14.2.0")


def test_the_cuda_wheels_agree_with_the_test_requirements():
    gpu, test = requirements("requirements-gpu.txt"), requirements("requirements-test.txt")
    assert {"nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cublas"} <= set(gpu)
    pinned = next(iter(test["nvidia-cublas"].specifier)).version      # the headers CI compiles exports against
    assert gpu["nvidia-cublas"].specifier.contains(pinned)


def app_files(tmp_path: Path, nvidia_smi: str | None, **env) -> list[str]:
    """What `./run` installs for the app, with a fake nvidia-smi (a shell body) or none on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    if nvidia_smi is None:
        fake.unlink(missing_ok=True)
    else:
        fake.write_text("#!/bin/sh\n" + nvidia_smi + "\n")
        fake.chmod(0o755)
    script = ROOT / "run"
    body = script.read_text()
    function = body[body.index("app_files() {"):]
    function = function[:function.index("\n}\n") + 3]
    path = f"{bin_dir}:/usr/bin:/bin"
    out = subprocess.run(["bash", "-c", function + "\napp_files"], capture_output=True, text=True, check=True,
                         env={"PATH": path, **env})
    return out.stdout.split()


@pytest.mark.skipif(os.name != "posix", reason="./run is a bash script")
def test_run_adds_the_cuda_wheels_only_where_a_gpu_is_listed(tmp_path):
    gpu = 'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"'
    assert app_files(tmp_path, gpu) == ["requirements.txt", "requirements-gpu.txt"]
    assert app_files(tmp_path, gpu, RUN_CUDA_WHEELS="0") == ["requirements.txt"]
    assert app_files(tmp_path, 'echo "NVIDIA-SMI has failed: no driver" >&2; exit 9') == ["requirements.txt"]
    if shutil.which("nvidia-smi", path="/usr/bin:/bin") is None:     # a GPU machine has the real one there
        assert app_files(tmp_path, None) == ["requirements.txt"]
