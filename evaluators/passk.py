"""pass@k beside mean@N for 0/1 metrics: the chance that at least one of k samples of a question succeeds.

Per question with n samples of which c succeeded, the unbiased estimator of Chen et al. 2021 ("Evaluating
Large Language Models Trained on Code", arXiv 2107.03374) is 1 - C(n-c, k) / C(n, k), computed as the
product 1 - prod_{i=n-c+1..n} (1 - k / i), which stays exact where the binomials overflow. The benchmark's
pass@k is the mean over questions; its standard error treats each question as one cluster (its n samples
give one value), and its CI95 is a t-interval cut to [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from evaluators.paired import question_means
from evaluators.stats import ScoredItem

METHOD = "unbiased estimator (Chen et al. 2021) per question, mean over questions, question-clustered SEM"


@dataclass(frozen=True)
class PassAtK:
    k: int
    mean: float
    sem: float
    ci95_low: float
    ci95_high: float
    questions: int  # questions with at least k scored samples


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one question with `c` successes among `n` samples."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def ks_for(num_samples: int) -> list[int]:
    """k = 1 and every power of two up to N."""
    ks, k = [], 1
    while k <= num_samples:
        ks.append(k)
        k *= 2
    return ks


def is_binary(items: list[ScoredItem]) -> bool:
    """Each sample a single 0/1 outcome (accuracy, a pass): what pass@k is defined on."""
    return bool(items) and all(i.weight == 1 and i.value in (0.0, 1.0) for i in items)


def pass_at_k_table(items: list[ScoredItem], num_samples: int) -> list[PassAtK]:
    """pass@k for k in {1, 2, 4, ...} up to N; empty where N is 1 or the metric is not 0/1 per sample."""
    if num_samples < 2 or not is_binary(items):
        return []
    per_question = question_means(items)  # (successes, samples) per question
    table = []
    for k in ks_for(num_samples):
        values = np.array([pass_at_k(int(n), int(c), k) for c, n in per_question.values() if n >= k])
        if len(values) == 0:
            continue
        mean = float(values.mean())
        if len(values) > 1:
            sem = float(values.std(ddof=1) / np.sqrt(len(values)))
            half = float(stats.t.ppf(0.975, df=len(values) - 1)) * sem
        else:
            sem = half = float("nan")
        low, high = (max(0.0, mean - half), min(1.0, mean + half)) if len(values) > 1 else (sem, sem)
        table.append(PassAtK(k, mean, sem, low, high, len(values)))
    return table
