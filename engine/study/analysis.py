"""What a study found: each variant's numbers over its seeds, each cell at its best hyperparameters, and the
comparison with the baseline cell that "LSTM: A Search Space Odyssey" (Greff et al. 2017) makes, with Welch's t-test
(unequal variances; scipy.stats.ttest_ind) over the seeds.

The score of a trial is its test metric where the task has a test split (JSB Chorales), else its final held-out
metric. A cell's best variant is chosen on the held-out (valid) metric, never on the test one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05                 # the significance level the comparison's words use


@dataclass(frozen=True)
class Variant:
    name: str                        # "lstm lr=0.01"
    cell: str
    held_out: tuple[float, ...]      # final held-out metric of each finished seed
    scores: tuple[float, ...]        # test metric (or final held-out metric) of each finished seed
    failed: int

    @property
    def mean_held_out(self) -> float:
        return float(np.mean(self.held_out)) if self.held_out else math.nan


@dataclass(frozen=True)
class Comparison:
    cell: str
    variant: str                     # the cell's best variant
    mean: float
    baseline_mean: float
    difference: float                # mean - baseline mean
    p_value: float | None            # Welch's t-test; None where it cannot be computed (see `note`)
    verdict: str                     # "better", "worse", "no significant difference", or the reason there is none
    note: str = ""


def variants(lines: dict, trials) -> list[Variant]:
    """Every variant of the study, in the study's order, from the finished trials' lines."""
    out: dict[str, dict] = {}
    for trial in trials:
        entry = out.setdefault(trial.variant, {"cell": trial.cell, "held_out": [], "scores": [], "failed": 0})
        line = lines.get(trial.id)
        if line is None:
            continue
        if line["status"] == "failed":
            entry["failed"] += 1
            continue
        result = line["result"]
        entry["held_out"].append(result["final_metric"])
        test = result.get("test_metric")
        entry["scores"].append(test if test is not None else result["final_metric"])
    return [Variant(name, e["cell"], tuple(e["held_out"]), tuple(e["scores"]), e["failed"]) for name, e in out.items()]


def best_variants(found: list[Variant], higher_is_better: bool) -> dict[str, Variant]:
    """Each cell's variant with the best mean held-out metric (finished seeds only)."""
    best: dict[str, Variant] = {}
    for variant in found:
        if not variant.held_out:
            continue
        current = best.get(variant.cell)
        if current is None or (variant.mean_held_out > current.mean_held_out if higher_is_better
                               else variant.mean_held_out < current.mean_held_out):
            best[variant.cell] = variant
    return best


def welch(a, b) -> tuple[float | None, str]:
    """Welch's two-sided t-test of a against b: (p-value, "") or (None, why it cannot be computed)."""
    if len(a) < 2 or len(b) < 2:
        return None, "needs 2 or more finished seeds on each side"
    if np.std(a) == 0 and np.std(b) == 0:
        return None, "every seed scored the same on both sides"
    from scipy import stats  # deferred: scipy takes a second to import, and only the comparison needs it
    p = float(stats.ttest_ind(np.asarray(a, dtype=float), np.asarray(b, dtype=float), equal_var=False).pvalue)
    return (p, "") if math.isfinite(p) else (None, "the test is undefined for these scores")


def compare_with_baseline(best: dict[str, Variant], baseline: str, higher_is_better: bool) -> list[Comparison]:
    """Each cell's best variant against the baseline cell's, over their seeds."""
    if baseline not in best:
        return []
    base = best[baseline]
    rows = []
    for cell, variant in best.items():
        if cell == baseline:
            continue
        mean, base_mean = float(np.mean(variant.scores)), float(np.mean(base.scores))
        p, note = welch(variant.scores, base.scores)
        if p is None:
            verdict = "not tested"
        elif p >= ALPHA:
            verdict = "no significant difference"
        else:
            verdict = "better" if (mean > base_mean) == higher_is_better else "worse"
        rows.append(Comparison(cell, variant.name, mean, base_mean, mean - base_mean, p, verdict, note))
    return rows
