"""Paired differences between two evaluations of the same questions (two checkpoints, two models).

Each question's score is averaged over its samples in each run, the two runs are differenced per question,
and the standard error is that of the mean difference over the questions both runs scored: question-clustered
and paired (Miller 2024, "Adding Error Bars to Evals", section on paired differences). Pairing removes the
spread of question difficulty, which both runs share, so a real difference shows at a fraction of the
unpaired error bar. Each question counts once, whatever its number of samples in either run (adaptive N gives
some more than others), and metrics that are rates over several items per question (IFEval's
instruction-level accuracy) weight it by its item count: exactly as the run's own mean does.

Testing every task x metric at once inflates the chance of a false alarm, so the p-values are adjusted with
Holm's step-down procedure (Holm 1979) over the whole family compared, and only adjusted p-values below the
level count as beyond noise. The CI95 is a t-interval on the paired SE, cut to what a difference of the metric
can be: [-(hi - lo), hi - lo] for a metric whose values lie in [lo, hi] (a win rate, a 1-10 rating, a
proportion of successes). Where every question moved by the same amount there is no spread: the p-value is the
exact sign-flip test's and no CI95 is given (a t-interval would be the single point, beside a p that may say
"noise").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evaluators.stats import ScoredItem, counts_successes, question_scores, t_critical_95, t_two_sided_p

MULTIPLE_COMPARISONS = "Holm-Bonferroni over every task x metric compared"
SE_METHOD = "paired, question-clustered standard error of the mean difference (Miller 2024)"


@dataclass(frozen=True)
class PairedDifference:
    """B minus A over the questions both scored: the difference, its paired SE, CI95 and two-sided p."""

    mean_a: float
    mean_b: float
    difference: float
    sem: float
    ci95_low: float
    ci95_high: float
    p_value: float
    questions: int  # scored in both runs
    only_in_one: int  # scored in one run only: left out of the pairing


def paired_difference(
    a: list[ScoredItem], b: list[ScoredItem], bounds: tuple[float, float] | None = None
) -> PairedDifference:
    """B minus A over the questions both runs scored. Each run's mean over those questions is computed as its
    own summary computes its mean (`evaluators.stats.question_scores`: each question once, with its item
    weight, whatever its number of samples), so over the same questions `mean_a` and `mean_b` are the two
    summaries' means. `bounds`: the range the metric's values take (a proportion's [0, 1] is found without)."""
    per_a, per_b = question_scores(a), question_scores(b)
    index_a, index_b = per_a.index(), per_b.index()
    shared = sorted(index_a.keys() & index_b.keys())
    only = len(index_a.keys() ^ index_b.keys())
    nan = float("nan")
    if not shared:
        return PairedDifference(nan, nan, nan, nan, nan, nan, nan, 0, only)
    rows_a, rows_b = [index_a[q] for q in shared], [index_b[q] for q in shared]
    value_a, weight_a = per_a.value[rows_a], per_a.weight[rows_a]
    value_b, weight_b = per_b.value[rows_b], per_b.weight[rows_b]
    total_a, total_b = weight_a.sum(), weight_b.sum()
    mean_a, mean_b = float(value_a.sum() / total_a), float(value_b.sum() / total_b)
    difference = mean_b - mean_a
    n = len(shared)
    if n < 2:
        return PairedDifference(mean_a, mean_b, difference, nan, nan, nan, nan, n, only)
    # Cluster-robust SE of the difference of the two ratio estimators, by linearisation: each question's
    # contribution to B's mean minus its contribution to A's. With equal weights in both runs this is the
    # weighted mean of the per-question differences' SE, and std(differences, ddof=1) / sqrt(n) for weight 1.
    influence = (value_b - mean_b * weight_b) / total_b - (value_a - mean_a * weight_a) / total_a
    sem = float(np.sqrt(n / (n - 1) * np.sum(influence**2)))
    half = t_critical_95(n - 1) * sem
    low, high = difference - half, difference + half
    if bounds is None and counts_successes(a) and counts_successes(b):
        bounds = (0.0, 1.0)
    if bounds is not None:  # two means in [lo, hi]: their difference lies within hi - lo of 0
        width = bounds[1] - bounds[0]
        low, high = max(low, -width), min(high, width)
    if sem > 1e-12 * max(1.0, abs(difference)):  # beyond rounding: equal differences leave ~1e-17
        p_value = t_two_sided_p(difference / sem, n - 1)
    else:  # every question moved by the same amount: the exact sign-flip test's p, as the t-test has none.
        # Of the 2**n ways to flip the differences' signs, two (all +, all -) are as far from 0 as these.
        p_value = 1.0 if difference == 0 else min(1.0, 2.0 ** (1 - n))
        low = high = nan
    return PairedDifference(mean_a, mean_b, difference, sem, low, high, p_value, n, only)


def holm_adjusted(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order (NaN stays NaN and does not count)."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if not np.isnan(p))
    adjusted = [float("nan")] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[index] = running
    return adjusted
