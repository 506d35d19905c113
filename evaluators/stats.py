"""mean@N statistics: the benchmark score, its error bar, and run-to-run noise, named apart.

Two uncertainties are reported and never mixed up:
- `sem`: the standard error of the benchmark score over questions, treating the N samples of one question
  as a cluster (average per question first, then the spread across questions; Miller 2024, "Adding Error
  Bars to Evals", arXiv 2411.00640). Metrics that are rates over several items per question (IFEval's
  instruction-level accuracy) use the cluster-robust form of the same estimator, weighted by item count.
- `std_across_runs`: the standard deviation of the N per-run scores, i.e. sampling noise between runs.

The CI95 is a t-interval on `sem`, cut to the metric's range where the task states it (a win rate in [0, 1],
a 1-10 rating) or, for a proportion of successes (accuracy, a pass rate), to [0, 1]: near the ends, or with few
questions, the symmetric interval would otherwise claim values that cannot exist. A proportion every question
scored alike at 0 or 1 has no spread for a t-interval (it would be the single point); its CI95 is then the
Wilson score interval of that many successes out of that many questions (5 of 5: [0.57, 1]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


CI_METHOD = "t-interval on the question-clustered SEM, df = questions - 1"
CI_METHOD_PROPORTION = CI_METHOD + ", cut to [0, 1] (a proportion of successes)"
CI_METHOD_NO_SPREAD = (
    "Wilson score interval over the questions (every one scored {score:g}: no spread for a t-interval)"
)
Z_95 = 1.959963984540054  # the standard normal's two-sided 95 % critical value


def t_critical_95(df: int) -> float:
    """Student's t two-sided 95 % critical value for `df` degrees of freedom (scipy.stats.t.ppf(0.975, df)),
    from scipy.special: every process that reports a score would otherwise import scipy.stats (0.6 s more).
    Imported here, not at the top: a run loads this module before its first request and reports after its
    last, and scipy.special alone takes 0.2 s of the time before the first request."""
    from scipy import special

    return float(special.stdtrit(df, 0.975))


def t_two_sided_p(t: float, df: int) -> float:
    """The two-sided p-value of Student's t statistic `t` (2 * scipy.stats.t.sf(|t|, df))."""
    from scipy import special

    return float(2 * special.stdtr(df, -abs(t)))


@dataclass(frozen=True)
class ScoredItem:
    """One scored sample of one metric: question, which of the N runs, and its (value, weight)."""

    question: int
    run: int
    value: float
    weight: float


@dataclass(frozen=True)
class MetricSummary:
    mean: float
    sem: float
    ci95_low: float
    ci95_high: float
    ci_method: str
    std_across_runs: float
    run_means: tuple[float, ...]
    num_runs: int
    num_questions: int
    num_scored: int
    bounds: tuple[float, float] | None = None  # the range the metric's values take, where known


@dataclass(frozen=True)
class QuestionScores:
    """Each question's samples reduced once, the one definition every statistic of a run builds on (the mean,
    its SEM, pass@k, a paired comparison): a question counts once whatever its number of samples n_i (adaptive
    N gives some more than others), with its own item weight.

    For question i with n_i scored samples, `value[i]` is the mean over them of rate x weight and `weight[i]`
    the mean of their weights (its item count, 1 for a one-item metric), so `value[i] / weight[i]` is its rate
    and the benchmark mean is sum(value) / sum(weight). `successes[i]` is the sum of the values (the
    successes among its samples for a 0/1 metric). Questions whose weights sum to 0 carry no score and are
    left out."""

    questions: tuple[int, ...]
    value: np.ndarray
    weight: np.ndarray
    samples: np.ndarray  # n_i
    successes: np.ndarray

    def index(self) -> dict[int, int]:
        return {q: i for i, q in enumerate(self.questions)}


def question_scores(items: list[ScoredItem]) -> QuestionScores:
    """The per-question reduction of `QuestionScores`, questions in ascending order."""
    import numpy as np

    if not items:
        empty = np.zeros(0)
        return QuestionScores((), empty, empty, empty, empty)
    questions = np.array([i.question for i in items])
    values = np.array([i.value for i in items], dtype=float)
    weights = np.array([i.weight for i in items], dtype=float)
    ids, q_index, q_samples = np.unique(questions, return_inverse=True, return_counts=True)
    q_sum = np.bincount(q_index, weights=values)
    q_weight_sum = np.bincount(q_index, weights=weights)
    keep = q_weight_sum > 0
    return QuestionScores(
        questions=tuple(int(q) for q in ids[keep]),
        value=(q_sum / q_samples)[keep],
        weight=(q_weight_sum / q_samples)[keep],
        samples=q_samples[keep],
        successes=q_sum[keep],
    )


def summarize(
    items: list[ScoredItem],
    num_runs: int,
    bounds: tuple[float, float] | None = None,
    common_runs: int | None = None,
) -> MetricSummary:
    """Reduce scored samples to mean@N with its clustered SEM, CI95 and the std of the per-run means. The CI95
    is cut to `bounds` (the metric's known range) where given, else to [0, 1] for a proportion.
    `common_runs`: with adaptive N, the runs every question has (the std across runs uses those only)."""
    import numpy as np

    if not items:
        nan = float("nan")
        return MetricSummary(nan, nan, nan, nan, CI_METHOD, nan, (), num_runs, 0, 0)
    runs = np.array([i.run for i in items])
    values = np.array([i.value for i in items], dtype=float)
    weights = np.array([i.weight for i in items], dtype=float)
    per_question = question_scores(items)
    q_value, q_weight = per_question.value, per_question.weight
    n_q = len(q_weight)
    if n_q == 0:  # every sample weighs nothing (a rate over no items)
        nan = float("nan")
        return MetricSummary(nan, nan, nan, nan, CI_METHOD, nan, (), num_runs, 0, len(items))
    mean = float(q_value.sum() / q_weight.sum())

    if n_q > 1:
        # Cluster-robust SE of a ratio estimator; equals std(per-question means, ddof=1)/sqrt(n) for weight 1.
        residual = q_value - mean * q_weight
        sem = float(np.sqrt(n_q / (n_q - 1) * np.sum(residual**2)) / q_weight.sum())
        half = t_critical_95(n_q - 1) * sem
    else:
        sem, half = float("nan"), float("nan")

    run_means = _run_means(runs, values, weights, common_runs)
    std_runs = float(np.std(run_means, ddof=1)) if len(run_means) > 1 else float("nan")
    low, high, method = mean - half, mean + half, CI_METHOD
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
        method = f"{CI_METHOD}, cut to [{bounds[0]:g}, {bounds[1]:g}] (the metric's range)"
    elif _counts_successes(values, weights):
        bounds = (0.0, 1.0)
        low, high, method = max(low, 0.0), min(high, 1.0), CI_METHOD_PROPORTION
        if n_q > 1 and sem == 0 and mean in (0.0, 1.0):
            low, high = wilson_interval(round(mean * n_q), n_q)
            method = CI_METHOD_NO_SPREAD.format(score=mean)
    return MetricSummary(
        mean=mean,
        sem=sem,
        ci95_low=low,
        ci95_high=high,
        ci_method=method,
        std_across_runs=std_runs,
        run_means=tuple(run_means),
        num_runs=num_runs,
        num_questions=n_q,
        num_scored=len(items),
        bounds=bounds,
    )


def wilson_interval(successes: int, trials: int) -> tuple[float, float]:
    """The Wilson score 95 % interval of a proportion: `successes` out of `trials`."""
    z2 = Z_95**2
    centre = (successes + z2 / 2) / (trials + z2)
    half = Z_95 / (trials + z2) * math.sqrt(successes * (trials - successes) / trials + z2 / 4)
    # at 0 or all successes the interval reaches the end exactly (rounding would leave 5e-17 inside it)
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return low, high


def _run_means(
    runs: np.ndarray, values: np.ndarray, weights: np.ndarray, common_runs: int | None
) -> list[float]:
    """Each run's mean (run r: sample r of every question)."""
    run_means = []
    # With adaptive N only the first `common_runs` runs cover every question; a later one covers those that
    # got more samples, so its mean is not another draw of the same benchmark.
    for run in sorted(set(runs.tolist())):
        mask = runs == run
        if common_runs is not None and run >= common_runs:
            continue
        if weights[mask].sum() > 0:
            run_means.append(float(values[mask].sum() / weights[mask].sum()))
    return run_means


def counts_successes(items: list[ScoredItem]) -> bool:
    """Whether the items are successes out of trials (see `_counts_successes`): a metric within [0, 1]."""
    import numpy as np

    values = np.array([i.value for i in items], dtype=float)
    weights = np.array([i.weight for i in items], dtype=float)
    return bool(items) and _counts_successes(values, weights)


def _counts_successes(values: np.ndarray, weights: np.ndarray) -> bool:
    """Whether every item is a whole number of successes out of a whole number of trials (0/1 accuracy,
    IFEval's instructions followed out of those given), so the metric is a proportion bounded by [0, 1].
    A continuous score (F1, BLEU, a judge's rating) is left unbounded: its range is not known here.
    A value arrives as rate x weight, which floats do not always round-trip (7 / 25 * 25 != 7), hence the
    tolerance."""
    import numpy as np

    whole = np.allclose(values, np.round(values), rtol=0, atol=1e-9) and np.all(weights == np.round(weights))
    return bool(whole and np.all(values >= 0) and np.all(values <= weights + 1e-9))
