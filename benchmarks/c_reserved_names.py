"""Regenerate engine/c_reserved_names.txt: the macro names the CUDA toolchain's headers define, as the generated code
sees them (the exported program's includes, cooperative_groups.h of the persistent kernels, and cuda_runtime.h,
which nvcc includes in every .cu file), in the device pass and the host pass.

    python benchmarks/c_reserved_names.py            # rewrite the file from this machine's nvcc
    python benchmarks/c_reserved_names.py --check    # exit 1 if this toolchain defines a macro the file lacks

Names that engine.c_names.reserved refuses by their spelling alone (a leading or trailing '_', '__' inside, not
ASCII) are left out: they can never be a generated identifier. The file keeps every name it already has (a union
over the toolchains it was made on), so a newer CUDA only adds.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.c_names import MACROS_FILE, header_macros, reserved_by_spelling  # noqa: E402
from engine.export import cublas_location  # noqa: E402

HEADERS = ("cstdio", "cstdlib", "vector", "cuda_runtime.h", "cublas_v2.h", "cooperative_groups.h")
PASSES = {"device": [], "host": ["-Xcompiler", "-U__CUDA_ARCH__", "-Xcompiler", "-U__CUDA_ARCH_LIST__"]}


def toolchain_macros() -> set[str]:
    include, _ = cublas_location()
    names: set[str] = set()
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "headers.cu"
        source.write_text("".join(f"#include <{h}>\n" for h in HEADERS))
        for extra in PASSES.values():
            cmd = ["nvcc", "-std=c++17", "-arch=sm_90", *([f"-I{include}"] if include else []), "-E",
                   "-Xcompiler", "-dM", *extra, str(source)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            names |= set(re.findall(r"^#define\s+([A-Za-z_]\w*)", out, flags=re.M))
    return {n for n in names if not reserved_by_spelling(n)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on a macro missing from the file")
    args = parser.parse_args()
    found = toolchain_macros()
    known = set(header_macros())
    missing = sorted(found - known)
    if args.check:
        print(f"{len(found)} macros from nvcc, {len(missing)} missing from {MACROS_FILE.name}: {missing[:20]}")
        return 1 if missing else 0
    version = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    head = [f"# Macro names the CUDA headers define, as generated code sees them ({', '.join(HEADERS)}).",
            "# Made by benchmarks/c_reserved_names.py (nvcc -E -Xcompiler -dM, device and host pass);",
            f"# last run with: {version}. One name a line; engine/c_names.py reads it.",
            "# Names refused by their spelling alone (leading/trailing '_', '__', not ASCII) are not listed."]
    MACROS_FILE.write_text("\n".join(head + sorted(found | known)) + "\n")
    print(f"{MACROS_FILE}: {len(found | known)} names ({len(missing)} new)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
