"""Property tests: every number a run's summary and a comparison report, for random runs of every kind of
metric, equals an independent computation written here with numpy and scipy from the per-sample records.

The runs are random in what the statistics depend on: how many questions, how many scored samples each
question has (adaptive N's unequal counts, failed samples left out), and the metric's kind: a 0/1 rule metric
(GSM8K), a rate over several items per question (IFEval's instruction level), a judged win fraction of two
games (alpaca_eval), a weighted win fraction whose weight changes from sample to sample (arena_hard), a
graded score in [0, 1] (healthbench) and a mean of 1-10 ratings (writingbench). The definitions checked are
those docs/TASKS.md states under "Statistics":

- N per question: question i has its own n_i scored samples; its score is the mean over them; the run's
  mean counts each question once with its item weight: sum_i x_i r_i / sum_i x_i (x_i its mean weight per
  sample, r_i its rate).
- SEM: the question-clustered standard error; for a weighted mean, that of the ratio estimator, which is
  scipy's `sem` of z_i = (y_i - mean x_i) / mean(x).
- pass@k: Chen et al.'s estimator with each question's own n_i, averaged over every question, for the k
  every question reaches; larger k are left out with their coverage.
- compare: each run's mean over the shared questions as its summary computes it, B - A, and the SE of that
  difference (scipy's paired t-test where every weight is 1).
"""

from __future__ import annotations

import math
from fractions import Fraction
from math import comb
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from evaluators.compare import RunSamples, compare_runs
from evaluators.records import SampleRecord
from evaluators.report import summarize_records

TOLERANCE = 1e-12
KINDS = ("gsm8k", "ifeval", "alpaca_eval", "arena_hard", "healthbench", "writingbench")
METRIC = "m,none"

# One sample's (value, weight) for each kind: value is what the record stores as rate x weight.
Draw = tuple[float, float]


def close(ours: float, expected: float) -> bool:
    if math.isnan(expected):
        return math.isnan(ours)
    return ours == pytest.approx(expected, rel=TOLERANCE, abs=TOLERANCE)


@st.composite
def sample_of(draw: st.DrawFn, kind: str, items: int) -> Draw:
    """One scored sample of a question with `items` items (IFEval's instructions, writingbench's criteria)."""
    if kind == "gsm8k":
        return float(draw(st.integers(0, 1))), 1.0
    if kind == "ifeval":
        return float(draw(st.integers(0, items))), float(items)
    if kind == "alpaca_eval":
        return float(draw(st.integers(0, 2))), 2.0  # games won of two
    if kind == "arena_hard":  # two games, a strong verdict weighing 3
        games = draw(st.lists(st.tuples(st.sampled_from((1.0, 3.0)), st.sampled_from((0.0, 0.5, 1.0))),
                              min_size=2, max_size=2))  # fmt: skip
        return sum(w * o for w, o in games), sum(w for w, _ in games)
    if kind == "healthbench":  # rubric points met over points possible: a ratio of small integers
        possible = draw(st.integers(1, 40))
        return draw(st.integers(0, possible)) / possible, 1.0
    ratings = draw(st.lists(st.integers(1, 10), min_size=items, max_size=items))
    return float(sum(ratings)), float(items)


@st.composite
def run_of(draw: st.DrawFn, kind: str, items: dict[int, int], most: int) -> dict[int, list[Draw]]:
    """question -> its scored samples (1 to `most`; some questions may have none: every sample failed)."""
    run = {}
    for question, count in items.items():
        n = draw(st.integers(0, most))
        if n:
            run[question] = [draw(sample_of(kind, count)) for _ in range(n)]
    return run


@st.composite
def kind_and_runs(draw: st.DrawFn) -> tuple[str, dict[int, list[Draw]], dict[int, list[Draw]]]:
    kind = draw(st.sampled_from(KINDS))
    questions = draw(st.integers(2, 25))
    items = {q: draw(st.integers(1, 5)) for q in range(questions)}
    most = draw(st.integers(1, 9))
    a, b = draw(run_of(kind, items, most)), draw(run_of(kind, items, most))
    return kind, a, b


def records_of(run: dict[int, list[Draw]]) -> list[SampleRecord]:
    """Records as rayeval writes them (score = rate, weight), plus a failed sample per question, which no
    statistic may count."""
    rows = []
    for question, samples in run.items():
        for index, (value, weight) in enumerate(samples):
            rows.append(SampleRecord("t", question, index, f"{question}-{index}", "p", "o", "",
                                     {METRIC: value / weight}, {METRIC: weight}))  # fmt: skip
        rows.append(SampleRecord("t", question, len(samples), "x", "p", "", "", error="EngineError: x"))
    return rows


def per_question(run: dict[int, list[Draw]]) -> dict[int, tuple[float, float]]:
    """(y_i, x_i): the mean over question i's samples of the value and of the weight."""
    return {q: (float(np.mean([v for v, _ in s])), float(np.mean([w for _, w in s]))) for q, s in run.items()}


def independent_mean_and_sem(run: dict[int, list[Draw]]) -> tuple[float, float]:
    y, x = (np.array(column) for column in zip(*per_question(run).values(), strict=True))
    rates = y / x
    mean = float(np.sum(x * rates) / np.sum(x))  # each question once, weighted by its items
    if len(x) < 2:
        return mean, float("nan")
    if np.all(x == 1):
        return mean, float(stats.sem(rates))
    return mean, float(stats.sem((y - mean * x) / x.mean()))


@settings(max_examples=300, deadline=None)
@given(kind_and_runs())
def test_summary_mean_and_sem_equal_the_independent_values(case):
    kind, run, _ = case
    if not run:
        return
    summary = summarize_records("t", "1", [METRIC], records_of(run), 9, 0, len(run))
    metric = summary.metrics[METRIC]
    mean, sem = independent_mean_and_sem(run)
    assert close(metric.mean, mean), (kind, metric.mean, mean)
    assert close(metric.sem, sem), (kind, metric.sem, sem)
    assert metric.num_questions == len(run) and metric.num_scored == sum(len(s) for s in run.values())
    assert summary.failed == len(run)


def chen(n: int, c: int, k: int) -> float:
    """Chen et al.'s estimator from the binomials themselves, exactly."""
    return float(1 - Fraction(comb(n - c, k), comb(n, k)))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(0, 40), st.lists(st.integers(0, 1), min_size=1, max_size=16),
                       min_size=1, max_size=30))  # fmt: skip
def test_pass_at_k_uses_each_questions_own_n_and_covers_every_question(outcomes):
    run = {q: [(float(v), 1.0) for v in vs] for q, vs in outcomes.items()}
    summary = summarize_records("t", "1", [METRIC], records_of(run), 16, 0, len(run))
    counts = {q: (len(vs), sum(vs)) for q, vs in outcomes.items()}
    fewest, most = min(n for n, _ in counts.values()), max(n for n, _ in counts.values())
    powers = [2**e for e in range(5) if 2**e <= most]
    table = summary.pass_at_k.get(METRIC)
    if most < 2:
        assert not table
        return
    assert [row.k for row in table.rows] == [k for k in powers if k <= fewest]
    assert table.left_out == {k: sum(n >= k for n, _ in counts.values()) for k in powers if k > fewest}
    for row in table.rows:
        values = [chen(n, c, row.k) for n, c in counts.values()]
        assert row.questions == len(values) == len(outcomes)
        assert close(row.mean, float(np.mean(values)))
        assert close(row.sem, float(stats.sem(values)) if len(values) > 1 else float("nan"))


def run_samples(name: str, run: dict[int, list[Draw]]) -> RunSamples:
    return RunSamples(
        path=Path(name),
        run_id=name,
        records={"t": records_of(run)},
        metrics={"t": [METRIC]},
        higher_is_better={"t": {METRIC: True}},
    )


@settings(max_examples=300, deadline=None)
@given(kind_and_runs())
def test_compare_means_difference_and_se_equal_the_independent_values(case):
    kind, a, b = case
    shared = sorted(a.keys() & b.keys())
    if not shared:
        return
    (row,) = compare_runs(run_samples("a", a), run_samples("b", b))
    result = row.result
    on_shared_a, on_shared_b = ({q: run[q] for q in shared} for run in (a, b))
    mean_a, _ = independent_mean_and_sem(on_shared_a)
    mean_b, _ = independent_mean_and_sem(on_shared_b)
    assert close(result.mean_a, mean_a) and close(result.mean_b, mean_b), kind
    assert close(result.difference, mean_b - mean_a)
    assert result.questions == len(shared) and result.only_in_one == len(a.keys() ^ b.keys())
    if a.keys() == b.keys():  # the same questions scored: the comparison's means are the summaries' means
        for run, ours in ((a, result.mean_a), (b, result.mean_b)):
            summary = summarize_records("t", "1", [METRIC], records_of(run), 9, 0, 0)
            assert close(ours, summary.metrics[METRIC].mean)
    se = independent_paired_se(on_shared_a, on_shared_b, mean_a, mean_b)
    assert close(result.sem, se)
    if len(shared) > 1 and se > 0:
        if all(w == 1 for run in (a, b) for s in run.values() for _, w in s):
            ya, yb = ([per_question(run)[q][0] for q in shared] for run in (a, b))
            expected = stats.ttest_rel(yb, ya).pvalue
        else:
            expected = 2 * stats.t.sf(abs(mean_b - mean_a) / se, df=len(shared) - 1)
        assert result.p_value == pytest.approx(float(expected), rel=1e-9, abs=TOLERANCE)


def independent_paired_se(a: dict, b: dict, mean_a: float, mean_b: float) -> float:
    """The SE of B's mean minus A's: scipy's SE of the per-question differences where every weight is 1, else
    the SE of the difference of the two ratio estimators (each question's share of B's mean minus of A's)."""
    qa, qb = per_question(a), per_question(b)
    shared = sorted(qa)
    if len(shared) < 2:
        return float("nan")
    ya, xa = (np.array([qa[q][i] for q in shared]) for i in (0, 1))
    yb, xb = (np.array([qb[q][i] for q in shared]) for i in (0, 1))
    if np.all(xa == 1) and np.all(xb == 1):
        return float(stats.sem(yb - ya))
    z = (yb - mean_b * xb) / xb.mean() - (ya - mean_a * xa) / xa.mean()
    return float(stats.sem(z))
