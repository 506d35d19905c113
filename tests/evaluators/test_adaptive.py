"""Adaptive N's allocation and the statistics of unequal samples per question, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evaluators.adaptive import AdaptiveRule, StopReason, allocate, clustered_sem, question_variances
from evaluators.stats import ScoredItem, summarize


def test_samples_go_where_answers_vary_and_few_were_drawn():
    values = {0: [1.0, 0.0], 1: [1.0, 1.0], 2: [0.0, 0.0], 3: [1.0, 0.0, 1.0, 0.0]}
    allocation = allocate(values, AdaptiveRule(target_sem=0.01, max_samples=8, round_share=0.5))
    assert allocation.stop is None and sum(allocation.extra.values()) == 2
    # question 0 (split 1/1 on 2 samples) gains most: 0.25 / (2 x 3); then a question that agreed with itself
    # on 2 samples (5/36 / 6 = 0.023) beats question 0's third sample (0.25 / 12) and question 3 (0.25 / 20)
    assert allocation.extra[0] == 1 and set(allocation.extra) - {0} <= {1, 2}
    # the SEM the round starts from: std of the per-question means (0.5, 1, 0, 0.5) / sqrt(4)
    assert allocation.sem == pytest.approx(np.std([0.5, 1.0, 0.0, 0.5], ddof=1) / 2)
    # the prior keeps a question that agreed with itself in play: (2 + 0.5) / 3 = 5/6 -> 5/36
    assert question_variances(values)[1] == pytest.approx(5 / 36)


def test_it_stops_at_the_target_or_when_every_question_has_the_most_samples():
    values = {q: [1.0, 0.0] for q in range(4)}  # every mean 0.5: SEM 0
    reached = allocate(values, AdaptiveRule(target_sem=0.05, max_samples=4))
    assert reached.stop is StopReason.TARGET_REACHED and reached.extra == {}
    full = {0: [1.0, 0.0, 1.0], 1: [0.0, 0.0, 0.0], 2: [1.0, 1.0, 1.0]}
    done = allocate(full, AdaptiveRule(target_sem=0.001, max_samples=3))
    assert done.stop is StopReason.MAX_SAMPLES and done.sem == pytest.approx(clustered_sem(full))
    # the floor: the part of the SEM that between-question spread alone gives (no samples can remove it)
    assert 0 <= done.floor_sem < done.sem


def test_each_question_counts_once_whatever_its_number_of_samples():
    # question 0: 4 samples, mean 0.25; question 1: 2 samples, mean 1.0 -> benchmark mean 0.625, not 0.5
    items = [ScoredItem(0, r, v, 1.0) for r, v in enumerate([1.0, 0.0, 0.0, 0.0])]
    items += [ScoredItem(1, r, 1.0, 1.0) for r in range(2)]
    summary = summarize(items, num_runs=4, common_runs=2)
    assert summary.mean == pytest.approx(0.625)
    assert summary.sem == pytest.approx(np.std([0.25, 1.0], ddof=1) / math.sqrt(2))
    assert summary.run_means == (1.0, 0.5)  # runs 0 and 1 only: the ones both questions have


def test_equal_samples_give_the_same_statistics_as_before():
    rng = np.random.default_rng(0)
    items = [ScoredItem(q, r, float(rng.integers(0, 3)), 2.0) for q in range(30) for r in range(4)]
    summary = summarize(items, num_runs=4)
    per_question = [sum(i.value for i in items if i.question == q) / 8 for q in range(30)]
    ratio = sum(i.value for i in items) / sum(i.weight for i in items)
    assert summary.mean == pytest.approx(ratio) == pytest.approx(np.mean(per_question))
    assert summary.sem == pytest.approx(np.std(per_question, ddof=1) / math.sqrt(30))
    assert len(summary.run_means) == 4


def test_a_question_whose_samples_all_failed_gets_none_and_failures_count_toward_the_cap():
    # question 2's first samples failed (no score); question 1 scored once but was drawn 4 times
    values = {0: [1.0, 0.0], 1: [0.0], 2: [], 3: [0.0, 1.0]}
    drawn = {0: 2, 1: 4, 2: 2, 3: 2}
    allocation = allocate(values, AdaptiveRule(target_sem=0.001, max_samples=4, round_share=2.0), drawn=drawn)
    # budget 8, but only questions 0 and 3 may take more: 2 each, up to the cap of 4 drawn
    assert allocation.stop is None and allocation.extra == {0: 2, 3: 2}
    # nothing left to draw: every question that scored is at the cap; the one that never scored stays out
    capped = {q: 4 for q in values}
    assert allocate(values, AdaptiveRule(0.001, 4), drawn=capped).stop is StopReason.MAX_SAMPLES


def test_questions_that_never_scored_do_not_enlarge_the_round_or_the_floor():
    scored = {0: [1.0, 0.0], 1: [1.0, 1.0], 2: [0.0, 0.0], 3: [1.0, 0.0]}
    with_unscored = scored | {q: [] for q in range(4, 8)}
    rule = AdaptiveRule(target_sem=0.001, max_samples=8, round_share=0.5)
    alone, beside = allocate(scored, rule), allocate(with_unscored, rule)
    assert sum(beside.extra.values()) == sum(alone.extra.values()) == 2
    assert beside.floor_sem == pytest.approx(alone.floor_sem) and beside.sem == pytest.approx(alone.sem)


def _floor_against_exact_means(weights: np.ndarray, rates: np.ndarray, samples: int, seed: int) -> tuple:
    """Draw `samples` scores per question (a question of weight w scores the share of its w items met, each
    met with its rate) many times over; the mean floor^2 rayeval reports, and the SEM^2 that the exact rates
    give (the report's own SEM, on the rates themselves): what more samples approach."""
    generator = np.random.default_rng(seed)

    def sem_of(per_question: dict[int, list[float]]) -> float:
        items = [ScoredItem(q, r, v * weights[q], weights[q]) for q, vs in per_question.items()
                 for r, v in enumerate(vs)]  # fmt: skip
        return summarize(items, samples).sem

    exact = sem_of({q: [rate] for q, rate in enumerate(rates)}) ** 2
    floors = []
    for _ in range(300):
        drawn = generator.binomial(weights.astype(int)[:, None], rates[:, None], (len(rates), samples))
        per_question = {q: list(drawn[q] / weights[q]) for q in range(len(rates))}
        allocation = allocate(
            per_question, AdaptiveRule(1e-9, samples), sem_of(per_question),
            weights={q: float(w) for q, w in enumerate(weights)},
        )  # fmt: skip
        floors.append(allocation.floor_sem**2)
    return float(np.mean(floors)), exact


def test_the_floor_is_the_sem_that_exact_rates_would_give_for_weighted_and_plain_metrics():
    """The floor is what more samples approach: on average it matches the SEM of the exact per-question
    rates (checked over 300 draws each: 0.0384 against 0.0382, and 0.0393 against 0.0392). It once took the
    allocation's prior variances, unweighted, from the weighted SEM: 0.0310 on the same draws of the
    instruction-level case, and 0.0376 in the plain one (the prior gives questions always right a variance)."""
    generator = np.random.default_rng(7)
    weights = np.array([1.0] * 20 + [6.0] * 20)  # one instruction, or six (IFEval's instruction level)
    rates = np.concatenate([np.full(20, 0.5), generator.uniform(0.2, 0.9, 20)])
    floor2, exact2 = _floor_against_exact_means(weights, rates, samples=4, seed=1)
    assert math.sqrt(floor2) == pytest.approx(math.sqrt(exact2), rel=0.06)
    plain = np.concatenate([np.ones(50), np.zeros(20), np.full(30, 0.5)])  # right always, never, or half
    floor2, exact2 = _floor_against_exact_means(np.ones(100), plain, samples=4, seed=2)
    assert math.sqrt(floor2) == pytest.approx(math.sqrt(exact2), rel=0.03)
