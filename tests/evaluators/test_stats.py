from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from evaluators.stats import ScoredItem, summarize


def test_single_run_sem_is_the_plain_standard_error():
    values = [1, 0, 1, 1, 0, 1, 0, 1]
    items = [ScoredItem(q, 0, v, 1.0) for q, v in enumerate(values)]
    s = summarize(items, num_runs=1)
    assert s.mean == pytest.approx(np.mean(values))
    assert s.sem == pytest.approx(np.std(values, ddof=1) / math.sqrt(len(values)))
    t = scipy_stats.t.ppf(0.975, df=len(values) - 1)
    assert s.ci95_low == pytest.approx(s.mean - t * s.sem)
    assert math.isnan(s.std_across_runs)


def test_n_samples_are_clustered_by_question():
    # 3 questions x 2 runs: per-question means 1.0, 0.5, 0.0
    items = [
        ScoredItem(0, 0, 1, 1), ScoredItem(0, 1, 1, 1),
        ScoredItem(1, 0, 1, 1), ScoredItem(1, 1, 0, 1),
        ScoredItem(2, 0, 0, 1), ScoredItem(2, 1, 0, 1),
    ]  # fmt: skip
    s = summarize(items, num_runs=2)
    assert s.mean == pytest.approx(0.5)
    assert s.sem == pytest.approx(np.std([1.0, 0.5, 0.0], ddof=1) / math.sqrt(3))
    assert s.run_means == (pytest.approx(2 / 3), pytest.approx(1 / 3))
    assert s.std_across_runs == pytest.approx(np.std([2 / 3, 1 / 3], ddof=1))
    assert s.num_questions == 3 and s.num_scored == 6


def test_weighted_rate_matches_the_flattened_mean():
    # instruction-level accuracy: 2 of 3 instructions, then 1 of 1
    items = [ScoredItem(0, 0, 2, 3), ScoredItem(1, 0, 1, 1)]
    assert summarize(items, 1).mean == pytest.approx(3 / 4)


def test_no_items_gives_nan_not_a_crash():
    s = summarize([], num_runs=4)
    assert math.isnan(s.mean) and s.num_scored == 0


def test_a_rare_success_rate_never_gets_a_negative_lower_bound():
    # 1 success in 10 questions: the t-interval alone would reach below 0
    items = [ScoredItem(q, 0, 1 if q == 0 else 0, 1) for q in range(10)]
    s = summarize(items, num_runs=1)
    t = scipy_stats.t.ppf(0.975, df=9)
    assert s.mean - t * s.sem < 0
    assert s.ci95_low == 0.0
    assert s.ci95_high == pytest.approx(s.mean + t * s.sem)
    assert "cut to [0, 1]" in s.ci_method


def test_an_instruction_rate_near_one_is_cut_at_one():
    # IFEval-style counts: every instruction followed but one
    items = [ScoredItem(q, 0, 3, 3) for q in range(7)] + [ScoredItem(7, 0, 0, 2)]
    s = summarize(items, num_runs=1)
    assert s.ci95_high == 1.0 and s.ci95_low < s.mean < 1.0


def test_counts_stored_as_rate_times_weight_are_still_counts():
    # the report passes rate x weight, and 7 / 25 * 25 is not exactly 7 in floats
    assert (7 / 25) * 25 != 7
    items = [ScoredItem(0, 0, (7 / 25) * 25, 25)] + [ScoredItem(q, 0, 0.0, 25) for q in range(1, 6)]
    s = summarize(items, num_runs=1)
    assert s.ci95_low == 0.0 and "cut to [0, 1]" in s.ci_method


def test_a_continuous_score_keeps_its_plain_interval():
    # F1-like fractional values: not a count of successes, so no bounds are assumed
    values = [0.05, 0.0, 0.0, 0.1, 0.0, 0.0]
    items = [ScoredItem(q, 0, v, 1.0) for q, v in enumerate(values)]
    s = summarize(items, num_runs=1)
    assert s.ci95_low < 0
    assert "cut" not in s.ci_method


def test_a_metric_range_bounds_its_interval():
    """Three Arena-Hard questions: the t-interval (df = 2) reaches far past [0, 1] and is cut to it; a 1-10
    rating to [1, 10]; the method says so."""
    from evaluators.judging.arena_hard import ArenaHard
    from evaluators.judging.writingbench import WritingBench

    win_rates = [ScoredItem(q, 0, v, 1.0) for q, v in enumerate([1.0, 0.25, 0.0])]
    spec = ArenaHard.metrics[0]  # score,none (its categories' scores have the same range)
    bounded = summarize(win_rates, 1, spec.bounds)
    unbounded = summarize(win_rates, 1)
    assert unbounded.ci95_low < 0 and unbounded.ci95_high > 1
    assert (bounded.ci95_low, bounded.ci95_high) == (0.0, 1.0) and bounded.mean == unbounded.mean
    assert bounded.ci_method.endswith("cut to [0, 1] (the metric's range)")
    ratings = [ScoredItem(q, 0, v, 1.0) for q, v in enumerate([9.5, 2.0, 6.0])]
    (rating,) = WritingBench.metrics
    cut = summarize(ratings, 1, rating.bounds)
    assert (cut.ci95_low, cut.ci95_high) == (1.0, 10.0)
