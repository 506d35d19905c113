"""Task-level statistics of judged samples: question-level bootstrap intervals, and a length-controlled win
rate in the spirit of AlpacaEval 2's length-controlled GLM (our own formulation, see
`length_controlled_win_rate`).

Every bootstrap resamples questions, never single judgments: the N runs of a question and both orders of
a pairwise comparison are one cluster, so correlated games are not counted as independent evidence.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import ArrayLike

from evaluators.judging.base import JudgedItem, TaskStatistic

CONFIDENCE = 0.95
# Penalty on the length coefficient, added to the summed negative log-likelihood (a Gaussian prior of
# variance 5): negligible with hundreds of games, it keeps the fit finite when length alone separates
# wins from losses.
LC_L2 = 0.1
LC_THETA_BOUND = 20.0  # |theta| beyond this is a win rate of 0 or 1 to nine digits


def question_index(questions: ArrayLike) -> tuple[np.ndarray, int]:
    """Dense 0..n-1 indices for question ids, and n."""
    unique, index = np.unique(np.asarray(questions), return_inverse=True)
    return index.reshape(-1), len(unique)


def row_sums(counts: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`counts @ values` (each row of counts against values), summed by numpy's own loop, not BLAS: BLAS
    splits a long product over its threads and adds the parts, so its rounding would depend on the machine's
    cores, OPENBLAS_NUM_THREADS, or a run forked by the warm CLI server (one BLAS thread). This way a reported
    statistic has the same bits whatever the number of BLAS threads (for one numpy build on one kind of CPU).
    einsum without `optimize` never hands the product to BLAS."""
    return np.einsum("...n,n->...", counts, values)


def _rng_argument(seed: int) -> dict[str, np.random.Generator]:
    # scipy >= 1.15 names it `rng`; older releases (we allow 1.11) call it `random_state`.
    from scipy import stats

    name = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
    return {name: np.random.default_rng(seed)}


def bootstrap_statistic(
    key: str,
    num_questions: int,
    estimate: Callable[[np.ndarray], np.ndarray],
    *,
    rounds: int,
    seed: int,
    estimator: str,
    higher_is_better: bool = True,
) -> TaskStatistic:
    """A statistic with its bootstrap std and percentile CI95, resampling whole questions.

    `estimate` maps question multiplicities, shape (batch, num_questions) (all ones for the data as
    observed; a bootstrap draw counts how often each question was picked), to one value per row.
    `estimator` says in words what is estimated; it opens the statistic's `method`.
    """
    value = float(estimate(np.ones((1, num_questions)))[0])
    method = (
        f"{estimator}; std and CI95: bootstrap over {num_questions} questions (all runs and judgments of a "
        f"question resampled together), {rounds} rounds, percentile 2.5/97.5 interval, std = std of the "
        f"bootstrap estimates, seed {seed}"
    )
    if num_questions < 2:
        nan = float("nan")
        return TaskStatistic(
            key, value, nan, nan, nan, method + " (one question: no interval)", higher_is_better
        )

    def statistic(draw: np.ndarray, axis: int = -1) -> np.ndarray:
        picks = np.moveaxis(np.asarray(draw, dtype=np.intp), axis, -1)
        flat = picks.reshape(-1, num_questions)
        counts = np.zeros(flat.shape, dtype=float)
        np.add.at(counts, (np.arange(flat.shape[0])[:, None], flat), 1.0)
        return np.asarray(estimate(counts), dtype=float).reshape(picks.shape[:-1])

    from scipy import stats  # here, not at the top: planning a run loads this module, and scipy takes 0.5 s

    result = stats.bootstrap(
        (np.arange(num_questions),),
        statistic,
        n_resamples=rounds,
        batch=min(rounds, 200),  # bounds memory: batch x questions multiplicities at a time
        vectorized=True,
        method="percentile",
        confidence_level=CONFIDENCE,
        **_rng_argument(seed),
    )
    return TaskStatistic(
        key=key,
        value=value,
        std=float(result.standard_error),
        ci95_low=float(result.confidence_interval.low),
        ci95_high=float(result.confidence_interval.high),
        method=method,
        higher_is_better=higher_is_better,
    )


def ratio_statistic(
    key: str,
    questions: ArrayLike,
    values: ArrayLike,
    weights: ArrayLike,
    *,
    rounds: int = 1000,
    seed: int = 0,
    estimator: str = "weighted mean over questions of each question's mean over its judged samples",
    higher_is_better: bool = True,
) -> TaskStatistic:
    """The weighted mean over questions, each question once (its values' and weights' means over its
    samples), as the task's mean counts it (`evaluators.stats.question_scores`), with a question-level
    bootstrap; questions of zero weight are dropped. With as many samples in every question this is
    sum(values)/sum(weights); a question whose samples failed in part does not count less."""
    index, num_questions = question_index(questions)
    samples = np.bincount(index, minlength=num_questions)
    q_value = np.bincount(index, weights=np.asarray(values, dtype=float), minlength=num_questions)
    q_weight = np.bincount(index, weights=np.asarray(weights, dtype=float), minlength=num_questions)
    keep = q_weight > 0
    q_value, q_weight = q_value[keep] / samples[keep], q_weight[keep] / samples[keep]

    def estimate(counts: np.ndarray) -> np.ndarray:
        return row_sums(counts, q_value) / row_sums(counts, q_weight)

    return bootstrap_statistic(
        key,
        int(keep.sum()),
        estimate,
        rounds=rounds,
        seed=seed,
        estimator=estimator,
        higher_is_better=higher_is_better,
    )


def metric_statistic(
    key: str, items: Sequence[JudgedItem], *, rounds: int = 1000, seed: int = 0, estimator: str | None = None
) -> TaskStatistic:
    """The question-bootstrapped weighted mean of metric `key` over judged items that have it."""
    scored = [(item.question, item.judged.scores[key]) for item in items if key in item.judged.scores]
    questions = np.array([question for question, _ in scored], dtype=np.int64)
    return ratio_statistic(
        key,
        questions,
        [score.value for _, score in scored],
        [score.weight for _, score in scored],
        rounds=rounds,
        seed=seed,
        estimator=estimator
        or f"mean of '{key}' over the questions of {len(scored)} judged samples (weighted as scored)",
    )


def length_controlled_win_rate(
    wins: ArrayLike,
    length_deltas: ArrayLike,
    game_weights: ArrayLike | None = None,
    l2: float = LC_L2,
) -> float:
    """The win rate a logistic length model predicts for equal lengths.

    Fits P(win in game g) = sigmoid(theta + phi * tanh(delta_g / s)) by penalised maximum likelihood,
    with delta_g the model's length minus the reference's and s the (weighted) std of delta over all
    games; returns sigmoid(theta), i.e. the win probability at delta = 0. Only phi is penalised (by
    `l2 * phi**2`): penalising theta would pull the answer towards 1/2.
    """
    from scipy import optimize, special

    y = np.asarray(wins, dtype=float)
    delta = np.asarray(length_deltas, dtype=float)
    w = np.ones_like(y) if game_weights is None else np.asarray(game_weights, dtype=float)
    if w.sum() <= 0:
        return float("nan")
    mean = np.average(delta, weights=w)
    scale = float(np.sqrt(np.average((delta - mean) ** 2, weights=w)))
    # All lengths equal: phi has nothing to explain, the penalty holds it at 0 and LC = raw win rate.
    x = np.tanh(delta / scale) if scale > 0 else np.zeros_like(delta)

    def loss(params: np.ndarray) -> tuple[float, np.ndarray]:
        theta, phi = params
        z = theta + phi * x
        residual = w * (special.expit(z) - y)
        value = float(np.sum(w * (np.logaddexp(0.0, z) - y * z)) + l2 * phi**2)
        return value, np.array([residual.sum(), row_sums(residual, x) + 2 * l2 * phi])

    fit = optimize.minimize(
        loss,
        x0=np.zeros(2),
        jac=True,
        method="L-BFGS-B",
        bounds=[(-LC_THETA_BOUND, LC_THETA_BOUND), (None, None)],
    )
    return float(special.expit(fit.x[0]))
