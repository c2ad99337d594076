"""A study over the GPUs of one host (issue #35, item 6): the same study run with one GPU visible, then with every
GPU, each on its own embedded Ray (a trial a GPU, float32 on the generated training step); trials per hour of each
and their ratio (1.8x wanted on two GPUs).

    python3 benchmarks/study_gpus.py --out $OUT            # on a machine with 2 or more GPUs

The study: the vanilla LSTM and CIFG on JSB Chorales, 16 seeds, 64 units, 300 steps (--seeds, --steps). Both runs use fresh folders,
so neither resumes the other; the JSB cache is built first, outside the timing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDY = ["vanilla_lstm", "lstm_cifg", "--task", "jsb", "-H", "64", "-B", "32", "-T", "64", "--device", "gpu"]


def gpus() -> int:
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return sum(1 for line in listed.splitlines() if line.startswith("GPU "))


def run(visible: str, folder: Path, seeds: int, steps: int) -> dict:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "engine", "study", *STUDY, "--seeds", str(seeds), "--steps", str(steps),
                           "--folder", str(folder)], cwd=ROOT,
                          env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"the study on GPUs {visible} failed:\n{done.stderr[-3000:]}")
    trials = sum(1 for line in (folder / "trials.jsonl").read_text().splitlines() if line.strip())
    return {"gpus": visible, "seconds": seconds, "trials": trials, "trials_per_hour": trials / seconds * 3600,
            "table": done.stdout}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/study-gpus")
    parser.add_argument("--seeds", type=int, default=16, help="seeds a cell (two cells)")
    parser.add_argument("--steps", type=int, default=300, help="training steps a trial")
    args = parser.parse_args(argv)
    count = gpus()
    if count < 2:
        print(f"this machine shows {count} GPU(s); the benchmark needs 2 or more")
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", "from engine.training import jsb; jsb.chorales()"], cwd=ROOT, check=True)
    one = run("0", out / "one-gpu", args.seeds, args.steps)
    every = run(",".join(map(str, range(count))), out / f"{count}-gpus", args.seeds, args.steps)
    result = {"one": one, "every": every, "ratio": every["trials_per_hour"] / one["trials_per_hour"]}
    (out / "study_gpus.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"1 GPU: {one['trials_per_hour']:.0f} trials/hour ({one['seconds']:.0f} s); {count} GPUs: "
          f"{every['trials_per_hour']:.0f} trials/hour ({every['seconds']:.0f} s); {result['ratio']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
