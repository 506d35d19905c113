"""Adaptive N: which questions get another sample, and when to stop.

The benchmark's error bar is the question-clustered SEM (`evaluators.stats`): the spread of the per-question
means over sqrt(questions). That spread has two parts. The questions differ from each other (no number of
samples changes that), and each per-question mean is itself uncertain, by sigma_i^2 / n_i for a question
with per-sample variance sigma_i^2 and n_i samples. Another sample of question i removes
sigma_i^2 / (n_i (n_i + 1)) of the second part, so each round gives its samples to the questions where that
is largest (a question whose answers vary a lot and that has few samples), and the run stops when the SEM
reaches the target or every question has the most samples allowed.

A question's variance is estimated with a little prior weight, so one that agreed with itself on its first
samples is not written off for good: for a 0/1 metric from (successes + 0.5) / (samples + 1), otherwise
from the sample variance plus the benchmark's average variance counted as one more sample. That prior only
chooses where samples go; the floor (the SEM exact per-question means would give) subtracts from the SEM the
noise the means' own samples add, estimated without it (`within_question_variance`).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


class StopReason(StrEnum):
    TARGET_REACHED = "target_sem_reached"  # the SEM is at or below the target
    MAX_SAMPLES = "max_samples_reached"  # every question has max_samples samples (or none scored)


@dataclass(frozen=True)
class AdaptiveRule:
    target_sem: float
    max_samples: int
    round_share: float = 0.5  # each round draws this many samples per question, on average


@dataclass
class Allocation:
    """One round's decision: extra samples per question (empty when stopping), and why it stopped."""

    sem: float
    extra: dict[int, int] = field(default_factory=dict)
    stop: StopReason | None = None
    floor_sem: float = float("nan")  # the SEM if every question's mean were exact: what more samples approach


def clustered_sem(values: dict[int, list[float]]) -> float:
    """The question-clustered SEM of the benchmark mean: std of per-question means / sqrt(questions)."""
    import numpy as np

    means = np.array([np.mean(v) for v in values.values() if v])
    if len(means) < 2:
        return float("nan")
    return float(np.std(means, ddof=1) / math.sqrt(len(means)))


def question_variances(values: dict[int, list[float]]) -> dict[int, float]:
    """Each question's per-sample variance, with the prior of the module docstring."""
    import numpy as np

    flat = [x for v in values.values() for x in v]
    binary = bool(flat) and all(x in (0.0, 1.0) for x in flat)
    if binary:
        return {q: _binary_variance(v) for q, v in values.items()}
    pooled = float(np.mean([np.var(v, ddof=1) for v in values.values() if len(v) > 1] or [0.0]))
    return {q: (float(np.var(v, ddof=1)) * (len(v) - 1) + pooled) / len(v) if len(v) > 1 else pooled
            for q, v in values.items()}  # fmt: skip


def within_question_variance(
    values: dict[int, list[float]], weights: dict[int, float] | None = None
) -> float:
    """What the noise of the per-question means adds to the SEM squared, in expectation: the part more samples
    remove. For the report's SEM of the mean sum(w m) / sum(w) over n questions (cluster-robust, the factor
    n / (n - 1) included), with s_i = sigma_i^2 / n_i the variance of question i's mean:
    n / (n - 1) / W^2 * (sum w_i^2 s_i (1 - 2 w_i / W) + sum w_i^2 / W^2 * sum w_j^2 s_j), W = sum w_i;
    for weights of 1 that is sum s_i / n^2. sigma_i^2 is the unbiased sample variance of the question's
    scores; a question with one score takes the mean of the others' (0 where none has two)."""
    import numpy as np

    scored = {q: v for q, v in values.items() if v}
    n = len(scored)
    if n < 2:
        return float("nan")
    spread = [float(np.var(v, ddof=1)) for v in scored.values() if len(v) > 1]
    pooled = float(np.mean(spread)) if spread else 0.0
    s = np.array([(float(np.var(v, ddof=1)) if len(v) > 1 else pooled) / len(v) for v in scored.values()])
    w = np.array([(weights or {}).get(q, 1.0) for q in scored])
    total = w.sum()
    own = np.sum(w**2 * s * (1 - 2 * w / total))
    shared = np.sum(w**2) / total**2 * np.sum(w**2 * s)
    return float(n / (n - 1) * (own + shared) / total**2)


def _binary_variance(samples: list[float]) -> float:
    p = (sum(samples) + 0.5) / (len(samples) + 1)
    return p * (1 - p)


def allocate(
    values: dict[int, list[float]],
    rule: AdaptiveRule,
    sem: float | None = None,
    drawn: dict[int, int] | None = None,
    weights: dict[int, float] | None = None,
) -> Allocation:
    """The next round for one metric: `values` holds each question's per-sample scores, `sem` the metric's
    SEM as the report computes it (a weighted metric's cluster-robust one), by default `clustered_sem`,
    `drawn` the samples each question has had, failed ones included (by default its scores' count), and
    `weights` each question's weight in the mean (a rate over several items: their count; default 1).

    `rule.max_samples` caps the samples drawn, so a question whose samples fail is not asked again without
    end. A question none of whose samples scored gets no more: its failures (a prompt over the context
    length, say) recur, and without a score it has no variance to weigh."""
    sem = clustered_sem(values) if sem is None else sem
    variances = question_variances(values)
    scored = {q: len(v) for q, v in values.items() if v}  # the questions the SEM is over
    within = within_question_variance(values, weights)
    floor = math.sqrt(max(0.0, sem**2 - within)) if not math.isnan(sem + within) else float("nan")
    if not math.isnan(sem) and sem <= rule.target_sem:
        return Allocation(sem, stop=StopReason.TARGET_REACHED, floor_sem=floor)
    drawn = drawn or {}
    headroom = {q: rule.max_samples - max(n, drawn.get(q, n)) for q, n in scored.items()}
    budget = max(1, round(rule.round_share * len(scored)))
    gains = [(-_gain(variances[q], n), q) for q, n in scored.items() if headroom[q] > 0]
    heapq.heapify(gains)
    extra: dict[int, int] = {}
    while gains and budget > 0:
        _, q = heapq.heappop(gains)
        extra[q] = extra.get(q, 0) + 1
        budget -= 1
        if extra[q] < headroom[q]:
            heapq.heappush(gains, (-_gain(variances[q], scored[q] + extra[q]), q))
    if not extra:
        return Allocation(sem, stop=StopReason.MAX_SAMPLES, floor_sem=floor)
    return Allocation(sem, extra, floor_sem=floor)


def _gain(variance: float, samples: int) -> float:
    """How much one more sample shrinks the variance of this question's mean."""
    return variance / (samples * (samples + 1))


@dataclass
class AdaptiveReport:
    """What adaptive N did for one task, as summary.json gives it."""

    metric: str  # the metric whose SEM decided last (the task's largest)
    target_sem: float
    max_samples: int
    first_samples: int
    stop: str = ""  # a StopReason
    rounds: int = 0  # rounds of extra samples drawn
    sem_by_round: list[float] = field(default_factory=list)  # before each round, then at the stop
    floor_sem: float = float("nan")  # the SEM exact per-question means would give (between-question spread)
    samples_per_question: dict[int, int] = field(default_factory=dict)  # doc_id -> samples drawn
