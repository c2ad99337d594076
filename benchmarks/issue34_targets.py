"""Issue #34's targets, met or not, from the harness's own rows on the GPU this runs on (the issue asks for them on
an H100 and an H200 each, ratios from one run).

    python3 benchmarks/issue34_targets.py --out $OUT --part bf16       # runs the part's rows, then the table
    python3 benchmarks/issue34_targets.py --out $OUT --part x3 --part flashrnn --part train
    python3 benchmarks/issue34_targets.py --table bench-....json train-....json       # the table from saved runs

Parts (each one call of under 10 minutes with the default time budget):
- bf16, fp16: cuDNN and the engine's `auto` in that mode, LSTM and GRU, every anchor configuration; tf32: the same at
  `large` and blogA (its target's configurations);
- x3: cuDNN fp32 (TF32 off) and `auto-fp32x3` (engine.run's opt-in, allow_tensor_core_fp32=True) at `large` and
  blogA, with each row's error over cuDNN fp32's (the harness's error_vs_cudnn_bound);
- flashrnn: one LSTM layer, I = H = 512, B = 16, T = 1024 (configs/issue34_flashrnn.json): FlashRNN's cuda_fused
  where it is installed, and the engine's `auto` in bf16 and fp32 (FlashRNN's "fp32" multiplies on TF32 tensor cores;
  the engine's rows are IEEE fp32);
- train: the training step at `mid` in bf16, cuDNN bf16 against the engine's fused step.
Each target reads a set of rows and reports the smallest ratio among them (baseline's median over the engine's: above
1 the engine is faster) and whether it is met; a row that is missing, failed or unavailable leaves the target "not
measured", never met. "Strict fp32 stays where it is" needs the figures before a change, so it is not a row here:
compare `python -m engine bench --quick` with docs/performance.md.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ANCHORS = ("lat", "blogB", "mid", "large", "blogA")
LARGE = ("large", "blogA")
FLASHRNN_CONFIG = "lstm-I512-H512-L1-T1024-B16"        # the name in configs/issue34_flashrnn.json
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Target:
    text: str
    kind: str                 # "bench" (python -m engine bench) or "train" (--train)
    engine: str               # the engine's row
    baseline: str             # the row it is measured against
    configs: tuple
    cells: tuple
    threshold: float
    error_bound: float | None = None        # float32x3: the engine row's error over cuDNN fp32's at most this


TARGETS = (
    Target("bf16: at least 1.3x cuDNN bf16 at large and blogA", "bench", "auto-bf16", "cudnn-bf16", LARGE,
           ("lstm", "gru"), 1.3),
    Target("bf16: no anchor below 1.0x cuDNN bf16", "bench", "auto-bf16", "cudnn-bf16", ANCHORS, ("lstm", "gru"), 1.0),
    Target("fp16: at least 1.3x cuDNN fp16 at large and blogA", "bench", "auto-fp16", "cudnn-fp16", LARGE,
           ("lstm", "gru"), 1.3),
    Target("fp16: no anchor below 1.0x cuDNN fp16", "bench", "auto-fp16", "cudnn-fp16", ANCHORS, ("lstm", "gru"), 1.0),
    Target("tf32: at least 1.2x cuDNN tf32 at large and blogA", "bench", "auto-tf32", "cudnn-tf32", LARGE,
           ("lstm", "gru"), 1.2),
    Target("float32x3: at least 2x cuDNN fp32 (TF32 off) at large and blogA, error within 2x cuDNN's", "bench",
           "auto-fp32x3", "cudnn-fp32", LARGE, ("lstm", "gru"), 2.0, error_bound=2.0),
    Target("one LSTM layer, I = H = 512, B = 16, T = 1024: at least 1.2x FlashRNN cuda_fused in bf16", "bench",
           "auto-bf16", "flashrnn-bf16", (FLASHRNN_CONFIG,), ("lstm",), 1.2),
    Target("the same in fp32 (FlashRNN's TF32 against the engine's IEEE fp32)", "bench", "auto", "flashrnn-fp32",
           (FLASHRNN_CONFIG,), ("lstm",), 1.2),
    Target("training step in bf16 at mid: at least 1.5x cuDNN bf16", "train", "engine-fused-bf16", "cudnn-bf16",
           ("mid",), ("lstm", "gru"), 1.5),
)

PARTS = {
    **{mode: ["--impl", f"cudnn-{mode}", "--impl", f"auto-{mode}", "-p", "lstm", "-p", "gru",
              *[a for c in (ANCHORS if mode != "tf32" else LARGE) for a in ("-c", c)]] for mode in ("bf16", "fp16", "tf32")},
    "x3": ["--impl", "cudnn-fp32", "--impl", "auto-fp32x3", "-p", "lstm", "-p", "gru", "-c", "large", "-c", "blogA"],
    "flashrnn": ["--impl", "flashrnn-bf16", "--impl", "auto-bf16", "--impl", "flashrnn-fp32", "--impl", "auto",
                 "--impl", "auto-tf32", "-p", "lstm", "-c", str(HERE / "configs" / "issue34_flashrnn.json")],
    "train": ["--train", "--impl", "cudnn-bf16", "--impl", "fused-bf16", "-p", "lstm", "-p", "gru", "-c", "mid"],
}


def rows_of(paths) -> dict:
    """{(kind, cell, config, row name): entry} from bench and --train result files (the later file wins)."""
    found = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        kind = "train" if Path(path).name.startswith("train") else "bench"
        for cell in data.get("cells", []):
            config = cell["config"]["name"] if isinstance(cell["config"], dict) else cell["config"]
            for entry in cell.get("implementations", []):
                found[(kind, cell["preset"], config, entry["name"])] = entry
    return found


def verdict(target: Target, rows: dict) -> dict:
    """The target against the rows: the ratios (baseline median / engine median) a cell and config, the smallest,
    the engine rows' error over cuDNN's where bounded, and met / not met / not measured (with what is missing)."""
    ratios, errors, missing = {}, {}, []
    for cell in target.cells:
        for config in target.configs:
            engine = rows.get((target.kind, cell, config, target.engine))
            base = rows.get((target.kind, cell, config, target.baseline))
            if not ok(engine) or not ok(base):
                missing.append(f"{cell} {config}: " + (target.engine if not ok(engine) else target.baseline)
                               + f" {status(engine if not ok(engine) else base)}")
                continue
            ratios[f"{cell} {config}"] = base["median_ms"] / engine["median_ms"]
            if target.error_bound is not None:
                errors[f"{cell} {config}"] = (engine.get("error_vs_cudnn_bound") or {}).get("ratio")
    smallest = min(ratios.values()) if ratios else None
    if missing:
        state = "not measured"
    else:
        within = all(e is not None and e <= target.error_bound for e in errors.values()) \
            if target.error_bound is not None else True
        state = "met" if smallest >= target.threshold and within else "not met"
    return {"target": target.text, "state": state, "smallest": smallest, "ratios": ratios, "errors": errors,
            "missing": missing}


def ok(entry) -> bool:
    return bool(entry) and entry.get("status") == "ok" and bool(entry.get("median_ms"))


def status(entry) -> str:
    return "not run" if not entry else f"{entry.get('status')}: {str(entry.get('reason'))[:80]}"


def table(verdicts: list[dict], device: str) -> str:
    lines = [f"Issue #34's targets on {device} (ratio: the baseline's median over the engine's, the smallest of the "
             "rows; each from one run)", "", "| target | smallest ratio | rows | state |", "|---|---|---|---|"]
    for v in verdicts:
        rows = ", ".join(f"{k} {r:.2f}x" + (f" (err {v['errors'][k]:.2f}x)" if v["errors"].get(k) is not None else "")
                         for k, r in v["ratios"].items())
        rows += ("; " if rows and v["missing"] else "") + "; ".join(v["missing"])
        smallest = f"{v['smallest']:.2f}x" if v["smallest"] is not None else "-"
        lines.append(f"| {v['target']} | {smallest} | {rows} | **{v['state']}** |")
    return "\n".join(lines)


def device_of(paths) -> str:
    for path in paths:
        environment = json.loads(Path(path).read_text()).get("environment") or {}
        if environment.get("device"):
            return f"{environment['device']} (cuDNN {environment.get('cudnn')}, torch {environment.get('torch')})"
    return "an unnamed device"


def run(part: str, out: Path, budget: int) -> list[Path]:
    """One part's rows through the harness's CLI into `out`; the result files it wrote."""
    before = set(out.glob("*.json"))
    command = [sys.executable, "-m", "engine", "bench", "--quick", "--warmup", "2", "--time-budget", str(budget),
               "--out", str(out), *PARTS[part]]
    print("$ " + " ".join(command), flush=True)
    subprocess.run(command, cwd=HERE.parent, check=False)
    return sorted(set(out.glob("*.json")) - before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--part", action="append", choices=sorted(PARTS), default=[])
    parser.add_argument("--time-budget", type=int, default=420, help="seconds of measurements a part (the harness's)")
    parser.add_argument("--table", nargs="*", default=None, help="result files to read instead of running parts")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    paths = [Path(p) for p in args.table] if args.table is not None else \
        [p for part in args.part for p in run(part, args.out, args.time_budget)]
    if not paths:
        parser.error("nothing to read: name --part (to run) or --table FILES")
    rows = rows_of(paths)
    verdicts = [verdict(t, rows) for t in TARGETS]
    text = table(verdicts, device_of(paths))
    (args.out / "issue34_targets.md").write_text(text + "\n")
    (args.out / "issue34_targets.json").write_text(json.dumps(verdicts, indent=1))
    print("\n" + text)


if __name__ == "__main__":
    main()
