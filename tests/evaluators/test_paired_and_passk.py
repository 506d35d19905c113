"""Paired differences (question-clustered, Holm-adjusted) and pass@k, against hand-computed values and scipy."""

from __future__ import annotations

import math
from math import comb

import pytest
from scipy import stats

from evaluators.paired import holm_adjusted, paired_difference
from evaluators.passk import ks_for, pass_at_k, pass_at_k_table
from evaluators.stats import ScoredItem, summarize


def items(outcomes: dict[int, list[float]], weight: float = 1.0) -> list[ScoredItem]:
    return [ScoredItem(q, run, v * weight, weight) for q, vs in outcomes.items() for run, v in enumerate(vs)]


def test_pass_at_k_is_chen_et_al_estimator():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - comb(7, 2) / comb(10, 2))  # 0.5333
    assert pass_at_k(10, 3, 8) == 1.0  # fewer than k failures: some draw of k holds a success
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(200, 17, 50) == pytest.approx(1 - comb(183, 50) / comb(200, 50))
    with pytest.raises(ValueError, match="n=4, c=5"):
        pass_at_k(4, 5, 1)
    assert ks_for(8) == [1, 2, 4, 8] and ks_for(6) == [1, 2, 4] and ks_for(1) == [1]


def test_pass_at_k_table_by_hand():
    table = pass_at_k_table(items({0: [1, 0, 0, 0], 1: [1, 1, 0, 1]}))
    assert [row.k for row in table.rows] == [1, 2, 4] and table.left_out == {}
    one, two, four = table.rows
    assert one.mean == pytest.approx(0.5) and one.sem == pytest.approx(0.25)  # std(0.25, 0.75) / sqrt 2
    assert two.mean == pytest.approx(0.75) and two.sem == pytest.approx(0.25)  # questions at 0.5 and 1.0
    assert (four.mean, four.sem, four.ci95_high) == (1.0, 0.0, 1.0)
    half = stats.t.ppf(0.975, 1) * 0.25
    assert two.ci95_low == pytest.approx(max(0.0, 0.75 - half)) and two.ci95_high == 1.0  # cut to [0, 1]


def test_pass_at_k_only_for_binary_metrics_with_several_samples():
    assert not pass_at_k_table(items({0: [1], 1: [0]}))
    assert not pass_at_k_table(items({0: [0.5, 1.0], 1: [0, 0]}))  # a rate, not a pass
    assert not pass_at_k_table(items({0: [1, 1], 1: [0, 1]}, weight=3.0))  # 3 items each


def test_pass_at_k_uses_each_questions_own_n_and_leaves_out_a_k_some_cannot_reach():
    """Adaptive N gave question 1 eight samples and the others two: pass@2 is every question's own estimate
    averaged, and pass@4 and pass@8, which only question 1 reaches, are left out with their coverage (its
    value alone would be the benchmark's hardest question, not the benchmark)."""
    table = pass_at_k_table(items({0: [1, 1], 1: [0, 0, 0, 0, 0, 0, 0, 1], 2: [0, 1]}))
    assert [row.k for row in table.rows] == [1, 2] and table.left_out == {4: 1, 8: 1}
    one, two = table.rows
    assert one.mean == pytest.approx((1 + 1 / 8 + 1 / 2) / 3)
    assert two.mean == pytest.approx((1 + (1 - comb(7, 2) / comb(8, 2)) + 1) / 3)
    assert one.questions == two.questions == table.questions == 3


def test_paired_difference_equals_scipy_paired_t_test():
    a = {0: [1, 1], 1: [0, 0], 2: [1, 0], 3: [0, 1], 4: [1, 1]}
    b = {0: [1, 1], 1: [1, 0], 2: [1, 1], 3: [1, 1], 4: [1, 0]}
    result = paired_difference(items(a), items(b))
    mean_a = [sum(v) / 2 for v in a.values()]
    mean_b = [sum(v) / 2 for v in b.values()]
    test = stats.ttest_rel(mean_b, mean_a)
    assert result.difference == pytest.approx(0.2) and (result.mean_a, result.mean_b) == pytest.approx(
        (0.6, 0.8)
    )
    assert result.p_value == pytest.approx(test.pvalue)
    diffs = [y - x for x, y in zip(mean_a, mean_b, strict=True)]
    assert result.sem == pytest.approx(stats.sem(diffs))
    low, high = stats.t.interval(0.95, df=4, loc=0.2, scale=stats.sem(diffs))
    assert (result.ci95_low, result.ci95_high) == pytest.approx((low, high))
    assert result.questions == 5 and result.only_in_one == 0


def test_pairing_removes_question_difficulty():
    """B is A plus 0.1 on every question: unpaired, question spread hides it; paired, it is as sure as ten
    questions can make it (no spread for a t-test: the exact sign-flip test, 2 of the 2**10 sign sets)."""
    a = {q: [q / 10] for q in range(10)}
    b = {q: [q / 10 + 0.1] for q in range(10)}
    result = paired_difference(items(a), items(b))
    assert result.difference == pytest.approx(0.1) and result.sem == pytest.approx(0.0, abs=1e-12)
    assert result.p_value == pytest.approx(2 / 2**10)
    two = paired_difference(items({0: [0.0], 1: [0.0]}), items({0: [1.0], 1: [1.0]}))
    assert (two.difference, two.sem, two.p_value) == (1.0, 0.0, 0.5)  # two questions prove little
    # no CI95 beside that p: a t-interval would be the single point [1, 1], as if the difference were certain
    assert math.isnan(two.ci95_low) and math.isnan(two.ci95_high) and math.isnan(result.ci95_low)
    assert stats.ttest_ind([v[0] for v in b.values()], [v[0] for v in a.values()]).pvalue > 0.4


def test_weighted_metrics_and_questions_in_one_run_only():
    a = items({0: [1.0, 0.5], 1: [0.0, 0.0]}, weight=2.0) + items({2: [1.0]}, weight=4.0)
    b = items({0: [1.0, 1.0], 1: [0.5, 0.5]}, weight=2.0) + items({3: [1.0]})
    result = paired_difference(a, b)
    assert result.questions == 2 and result.only_in_one == 2
    # questions 0 and 1 weigh 2 each (their 2 items): A 0.75 and 0, B 1 and 0.5
    assert (result.mean_a, result.mean_b, result.difference) == pytest.approx((0.375, 0.75, 0.375))
    assert math.isnan(paired_difference(items({0: [1]}), items({1: [1]})).difference)


def test_a_question_sampled_more_still_counts_once_with_its_item_weight():
    """Adaptive N gave question 0 six samples and question 1 two; each counts once, weighted by its items
    (3 and 1), as the run's own summary counts it: the paired means are the summaries' means."""
    a = items({0: [1, 1, 1, 1, 1, 0]}, weight=3.0) + items({1: [0, 0]})
    b = items({0: [1, 1]}, weight=3.0) + items({1: [1, 1, 1, 1, 1, 1]})
    result = paired_difference(a, b)
    assert result.mean_a == pytest.approx(3 * 5 / 6 / 4) == pytest.approx(summarize(a, 6).mean)
    assert result.mean_b == pytest.approx(1.0) == pytest.approx(summarize(b, 6).mean)
    assert result.difference == pytest.approx(result.mean_b - result.mean_a)


def test_holm_step_down():
    assert holm_adjusted([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm_adjusted([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    adjusted = holm_adjusted([0.01, float("nan"), 0.02])
    assert (
        adjusted[0] == pytest.approx(0.02) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.02)
    )


def test_a_bounded_metrics_difference_stays_within_its_range():
    """Judged scores in [0, 1] (healthbench, arena-hard with ties) are not whole successes, so only their
    stated range keeps the difference's CI95 inside [-1, 1]; a 1-10 rating's inside [-9, 9]."""
    a, b = items({0: [0.0], 1: [0.0], 2: [0.05]}), items({0: [1.0], 1: [1.0], 2: [0.1]})
    unbounded = paired_difference(a, b)
    differences = [1.0, 1.0, 0.05]
    half = stats.t.ppf(0.975, 2) * stats.sem(differences)
    assert (unbounded.ci95_low, unbounded.ci95_high) == pytest.approx(
        (0.6833 - half, 0.6833 + half), abs=1e-4
    )
    assert unbounded.ci95_high > 2  # what compare printed for such a task
    bounded = paired_difference(a, b, bounds=(0.0, 1.0))
    assert (bounded.ci95_low, bounded.ci95_high) == pytest.approx((0.6833 - half, 1.0), abs=1e-4)
    rated = paired_difference(
        items({0: [1.0], 1: [1.0], 2: [9.0]}), items({0: [10.0], 1: [10.0], 2: [9.5]}), (1.0, 10.0)
    )
    assert rated.ci95_high == 9.0


def test_a_proportion_every_question_scored_alike_has_the_wilson_interval_not_a_point():
    """5 of 5 right: the t-interval has no spread to work with and would say [1, 1]; the Wilson interval of
    5 successes in 5 trials (scipy's) is the honest one. 3 of 3 wrong likewise, and a spread keeps the t."""
    right = summarize(items({q: [1.0, 1.0] for q in range(5)}), 2)
    expected = stats.binomtest(5, 5).proportion_ci(method="wilson")
    assert (right.ci95_low, right.ci95_high) == pytest.approx((expected.low, expected.high))
    assert right.ci95_low == pytest.approx(0.566, abs=1e-3) and right.sem == 0 and "Wilson" in right.ci_method
    wrong = summarize(items({q: [0.0] for q in range(3)}), 1)
    expected = stats.binomtest(0, 3).proportion_ci(method="wilson")
    assert (wrong.ci95_low, wrong.ci95_high) == pytest.approx((expected.low, expected.high))
    # exactly: the mean never lies outside its interval (5e-17 did, and a curve's error bar went negative)
    assert wrong.ci95_low == 0.0 and right.ci95_high == 1.0
    spread = summarize(items({0: [1.0], 1: [0.0], 2: [1.0]}), 1)
    assert "Wilson" not in spread.ci_method and spread.bounds == (0.0, 1.0)


def test_holm_counts_the_comparisons_that_have_a_p_value(tmp_path):
    """A metric with one shared question has no p-value and takes no part in Holm's adjustment: the count
    compare prints is of the others (it once counted every row, 2 here, beside an adjustment over 1)."""
    from evaluators.compare import ComparedMetric, RunSamples, comparison_json, render_comparison

    tested = paired_difference(items({q: [q % 2] for q in range(10)}), items({q: [1.0] for q in range(10)}))
    lone = paired_difference(items({0: [0.0]}), items({0: [1.0]}))
    [p_tested, p_lone] = holm_adjusted([tested.p_value, lone.p_value])
    assert p_tested == tested.p_value and math.isnan(p_lone)
    rows = [ComparedMetric("t1", "m", tested, p_tested, False, None),
            ComparedMetric("t2", "m", lone, p_lone, False, None)]  # fmt: skip
    run = RunSamples(tmp_path, "r", {}, {}, {})
    assert "(1 comparisons)" in comparison_json(run, run, rows, 0.05)["multiple_comparisons"]
    assert "(1 comparisons)" in render_comparison(run, run, rows, 0.05)
