"""`rayeval compare` on two run folders written by rayeval's own writers (summary.json, samples JSONL): paired
differences per task and metric, the Holm-adjusted verdict, the JSON file, and the errors for bad folders."""

from __future__ import annotations

import json

import pytest
from scipy import stats

from cluster.cli import main
from tests.run_folders import STRICT
from tests.run_folders import write_gsm8k_run as write_run


def test_compare_pairs_questions_and_says_what_is_beyond_noise(tmp_path, capsys):
    # strict: B solves every question A missed (20 questions), flexible: identical in both runs
    a_strict = {q: [q % 2, q % 2] for q in range(20)}
    b_strict = {q: [1, 1] for q in range(20)}
    same = {q: [1, 0] for q in range(20)}
    a = write_run(tmp_path, "step-100", a_strict, same)
    b = write_run(tmp_path, "step-200", b_strict, same)
    out = tmp_path / "cmp.json"
    assert main(["compare", str(a), str(b), "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "B (step-200) - A (step-100)" in text and "B better" in text and "within noise" in text
    assert "Holm-Bonferroni over every task x metric compared (2 comparisons)" in text

    body = json.loads(out.read_text())
    strict, flexible = body["metrics"]
    assert (strict["metric"], strict["mean_a"], strict["mean_b"], strict["difference"]) == (
        STRICT,
        0.5,
        1.0,
        0.5,
    )
    per_question = [b_strict[q][0] - a_strict[q][0] for q in range(20)]
    assert strict["sem"] == pytest.approx(stats.sem(per_question))
    assert strict["p_value"] == pytest.approx(stats.ttest_rel([1] * 20, [q % 2 for q in range(20)]).pvalue)
    assert strict["p_adjusted"] == pytest.approx(min(1.0, 2 * strict["p_value"]))  # the smaller of two
    assert strict["beyond_noise"] and strict["better"] == "B" and strict["questions"] == 20
    assert flexible["difference"] == 0 and not flexible["beyond_noise"] and flexible["better"] is None
    assert -1 <= strict["ci95"][0] <= strict["ci95"][1] <= 1


def test_compare_names_a_folder_that_is_not_a_run(tmp_path, capsys):
    run = write_run(tmp_path / "runs", "r1", {0: [1, 1]}, {0: [1, 1]})
    assert main(["compare", str(tmp_path / "runs"), str(run)]) == 2
    err = capsys.readouterr().err
    assert "is not a finished rayeval run folder" in err and "It holds these runs: r1" in err
    assert main(["compare", str(run), str(run), "--level", "2"]) == 2
    assert "--level must be between 0 and 1" in capsys.readouterr().err
