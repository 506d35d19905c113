"""pass@k beside mean@N for 0/1 metrics: the chance that at least one of k samples of a question succeeds.

Per question i with n_i scored samples of which c_i succeeded, the unbiased estimator of Chen et al. 2021
("Evaluating Large Language Models Trained on Code", arXiv 2107.03374) is 1 - C(n_i-c_i, k) / C(n_i, k),
computed as the product 1 - prod_{j=n_i-c_i+1..n_i} (1 - k / j), which stays exact where the binomials
overflow. Each question uses its own n_i (adaptive N and failed samples make them differ), and the estimator
exists only for k <= n_i. The benchmark's pass@k is the mean over every question, so it is reported only for
the k every question reaches; a larger k that some questions reach is left out and listed with how many
questions reach it (averaging over those alone would score a chosen subset, under adaptive N the hard
questions, not the benchmark). Its standard error treats each question as one cluster (its n_i samples give
one value), and its CI95 is a t-interval cut to [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from evaluators.stats import ScoredItem, question_scores, t_critical_95

if TYPE_CHECKING:
    import numpy as np

METHOD = (
    "unbiased estimator (Chen et al. 2021) per question with its own n, mean over every question, "
    "question-clustered SEM; only k that every question reaches"
)


@dataclass(frozen=True)
class PassAtK:
    k: int
    mean: float
    sem: float
    ci95_low: float
    ci95_high: float
    questions: int  # every scored question: each has at least k scored samples


@dataclass(frozen=True)
class PassAtKTable:
    """pass@k for each k every question reaches, and the larger k left out: k -> questions reaching it."""

    rows: list[PassAtK] = field(default_factory=list)
    left_out: dict[int, int] = field(default_factory=dict)
    questions: int = 0

    def __bool__(self) -> bool:
        return bool(self.rows)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one question with `c` successes among `n` samples."""
    import numpy as np

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


def pass_at_k_table(items: list[ScoredItem]) -> PassAtKTable:
    """pass@k for k in {1, 2, 4, ...} up to the most samples a question has; empty where no question has two
    samples or the metric is not 0/1 per sample."""
    import numpy as np

    if not is_binary(items):
        return PassAtKTable()
    per_question = question_scores(items)
    samples = per_question.samples.astype(int)
    successes = np.rint(per_question.successes).astype(int)
    most, fewest = int(samples.max()), int(samples.min())
    if most < 2:
        return PassAtKTable()
    table = PassAtKTable(questions=len(samples))
    for k in ks_for(most):
        if k > fewest:
            table.left_out[k] = int((samples >= k).sum())
            continue
        values = np.array([pass_at_k(int(n), int(c), k) for n, c in zip(samples, successes, strict=True)])
        table.rows.append(_row(k, values))
    return table


def _row(k: int, values: np.ndarray) -> PassAtK:
    import numpy as np

    mean = float(values.mean())
    if len(values) < 2:
        nan = float("nan")
        return PassAtK(k, mean, nan, nan, nan, len(values))
    sem = float(values.std(ddof=1) / np.sqrt(len(values)))
    half = t_critical_95(len(values) - 1) * sem
    return PassAtK(k, mean, sem, max(0.0, mean - half), min(1.0, mean + half), len(values))
