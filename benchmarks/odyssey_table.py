"""The Odyssey on JSB Chorales (issue #35, item 4): a study's result table in markdown, each variant beside what
"LSTM: A Search Space Odyssey" (Greff et al. 2017) found.

    python3 benchmarks/odyssey_table.py benchmarks/results/odyssey-jsb-20261127 > table.md

The study: `python -m engine study vanilla_lstm lstm_nig lstm_nfg lstm_nog lstm_niaf lstm_noaf lstm_np lstm_cifg
lstm_fgr --task jsb --seeds 5 --lr 0.02 0.007 -H 32 --steps 1500 -B 16 -T 32 --folder <folder>`.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.study import load_study  # noqa: E402

# The paper's findings as its abstract and conclusions state them (Greff et al. 2017, IEEE TNNLS 28(10)): "the forget
# gate and the output activation function [are] its most critical components"; coupling the input and forget gates
# (CIFG) or removing the peepholes (NP) simplified the LSTM "without significantly decreasing performance". The
# per-dataset results of the other variants are in its Fig. 3 and are not restated here.
PAPER = {"lstm_nfg": "hurts (most critical)", "lstm_noaf": "hurts (most critical)",
         "lstm_cifg": "no significant decrease", "lstm_np": "no significant decrease"}
ABBREVIATIONS = {"vanilla_lstm": "V", "lstm_nig": "NIG", "lstm_nfg": "NFG", "lstm_nog": "NOG", "lstm_niaf": "NIAF",
                 "lstm_noaf": "NOAF", "lstm_np": "NP", "lstm_cifg": "CIFG", "lstm_fgr": "FGR"}


def ours(verdict: str) -> str:
    """Our result in the paper's words: lower NLL is better."""
    return {"better": "improves", "worse": "hurts", "no significant difference": "no significant difference"}.get(
        verdict, verdict)


def table(folder: str) -> str:
    study = load_study(folder)
    best = study.best()
    comparison = {c.cell: c for c in study.comparison()}
    base = best[study.plan.baseline]
    lines = [f"{study.finished}/{len(study.trials)} trials, {len(study.failures)} failed; test NLL per step (nats, "
             f"the 88 keys summed) over {len(study.plan.seeds)} seeds, each variant at its best learning rate "
             "(chosen on the valid NLL); Welch's t-test against the vanilla LSTM.", "",
             "| variant | best lr | test NLL (mean ± sd) | vs V | p (Welch) | ours | the paper |",
             "|---|---|---|---|---|---|---|"]
    for cell, _ in study.plan.cells:
        variant = best.get(cell)
        if variant is None:
            lines.append(f"| {ABBREVIATIONS.get(cell, cell)} | - | no finished seed | | | | {PAPER.get(cell, 'see its Fig. 3')} |")
            continue
        lr = variant.name.split("lr=")[-1] if "lr=" in variant.name else "-"
        spread = f"{np.mean(variant.scores):.3f} ± {np.std(variant.scores, ddof=1):.3f}"
        if cell == study.plan.baseline:
            lines.append(f"| {ABBREVIATIONS.get(cell, cell)} ({cell}) | {lr} | {spread} | | | baseline | |")
            continue
        c = comparison[cell]
        p = "-" if c.p_value is None else f"{c.p_value:.2g}"
        lines.append(f"| {ABBREVIATIONS.get(cell, cell)} ({cell}) | {lr} | {spread} | {c.difference:+.3f} | {p} | "
                     f"{ours(c.verdict)} | {PAPER.get(cell, 'see its Fig. 3')} |")
    lines += ["", f"Input-blind baseline (the keys' training frequencies): valid NLL "
                  f"{study.results()[0]['baseline']:.3f}. Vanilla LSTM at its best: {np.mean(base.scores):.3f}."]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(sys.argv[1]))
