"""`rayeval compare` on two run folders written by rayeval's own writers (summary.json, samples JSONL, judges'
folders): paired differences per task and metric, the Holm-adjusted verdict, the JSON file, the judge whose
verdicts are compared, and the errors for bad folders, other prompts and mixed judges."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from cluster.cli import main
from evaluators.tasks.gsm8k import GSM8K
from tests.run_folders import STRICT, write_judged_run
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


def test_compare_refuses_a_question_asked_with_another_prompt_unless_allowed(tmp_path, capsys):
    """Pairing by doc_id pairs different questions when a dataset, few-shot set or wording changed between the
    runs: compare names the first question whose prompt differs, and pairs anyway only when told to."""
    scores = {q: [1, 0] for q in range(6)}
    a = write_run(tmp_path, "a", scores, scores)
    b = write_run(tmp_path, "b", scores, scores, prompts={3: "Question 3, reworded", 5: "Question 5?"})
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert "gsm8k: question 3 was asked with different prompts" in err and "'Question 3, reworded'" in err
    assert "--allow-different-prompts" in err
    assert main(["compare", str(a), str(b), "--allow-different-prompts"]) == 0
    assert "within noise" in capsys.readouterr().out


def test_compare_refuses_a_task_scored_by_another_version_of_it_unless_allowed(tmp_path, capsys):
    """A task's version changes how an answer scores (HealthBench 1.1 stopped clipping each sample): two runs
    scored by different versions are refused, naming both and the rerun that scores the older one again."""
    scores = {q: [1, 0] for q in range(6)}
    a, b = write_run(tmp_path, "a", scores, scores), write_run(tmp_path, "b", scores, scores)
    summary = json.loads((a / "summary.json").read_text())
    summary["tasks"]["gsm8k"]["version"] = "0.9"
    (a / "summary.json").write_text(json.dumps(summary))
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert f"gsm8k was scored by version 0.9 of the task in A (a) and {GSM8K().version} in B (b)" in err
    assert "--judge-only" in err and "--allow-different-versions" in err and err.count("rayeval: error:") == 1
    assert main(["compare", str(a), str(b), "--allow-different-versions"]) == 0
    assert "within noise" in capsys.readouterr().out


def test_records_without_a_prompt_hash_are_compared_by_the_prompt_they_sent(tmp_path, capsys):
    scores = {q: [1] for q in range(3)}
    a, b = write_run(tmp_path, "a", scores, scores), write_run(tmp_path, "b", scores, scores)
    for run, text in ((a, "Question 1"), (b, "Question 1 (rendered another way)")):
        samples = run / "samples" / "model" / "gsm8k.jsonl"
        rows = [json.loads(line) | {"prompt_hash": ""} for line in samples.read_text().splitlines()]
        rows[1]["prompt"] = text
        samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["compare", str(a), str(b)]) == 2
    assert "question 1 was asked with different prompts" in capsys.readouterr().err


def test_compare_uses_the_named_judges_verdicts_and_refuses_to_mix_judges(tmp_path, capsys):
    """A was judged by two judges, B by one: with no judge named, A's choice is ambiguous; with --judge, both
    runs' rows are that judge's verdicts, never the other's. Runs judged by different judges only are refused
    unless allowed."""
    lenient = {q: [2, 2] for q in range(8)}  # the lenient judge: every game won
    strict_a = {q: [q % 3, 1] for q in range(8)}
    strict_b = {q: [2, (q + 1) % 3] for q in range(8)}
    a = write_judged_run(tmp_path, "a", {"openai:lenient": lenient, "openai:strict": strict_a})
    b = write_judged_run(tmp_path, "b", {"openai:strict": strict_b})
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert (
        "alpaca_eval was judged by 2 judges (openai:lenient, openai:strict)" in err and "--judge NAME" in err
    )

    out = tmp_path / "cmp.json"
    assert main(["compare", str(a), str(b), "--judge", "openai:strict", "--output", str(out)]) == 0
    assert "openai:strict" in capsys.readouterr().out  # the table's judge column
    (row,) = json.loads(out.read_text())["metrics"]
    rate_a = np.array([np.mean(strict_a[q]) / 2 for q in range(8)])
    rate_b = np.array([np.mean(strict_b[q]) / 2 for q in range(8)])
    assert (row["judge_a"], row["judge_b"]) == ("openai:strict", "openai:strict")
    assert row["mean_a"] == pytest.approx(rate_a.mean(), rel=1e-12)
    assert row["mean_b"] == pytest.approx(rate_b.mean(), rel=1e-12)
    assert row["difference"] == pytest.approx((rate_b - rate_a).mean(), rel=1e-12)
    assert row["sem"] == pytest.approx(stats.sem(rate_b - rate_a), rel=1e-12)
    # the win rate's range, [0, 1], as summary.json states it: the difference's CI95 stays within [-1, 1]
    stated = json.loads((b / "summary.json").read_text())["tasks"]["alpaca_eval"]["metrics"]
    assert [body["bounds"] for body in stated.values()] == [[0.0, 1.0]]
    assert -1 <= row["ci95"][0] <= row["ci95"][1] <= 1
    assert main(["compare", str(a), str(b), "--judge", "openai-strict"]) == 0  # its folder's name works too
    capsys.readouterr()
    assert main(["compare", str(a), str(b), "--judge", "openai:lenient"]) == 2
    assert "has no verdicts of judge openai:lenient on alpaca_eval" in capsys.readouterr().err

    c = write_judged_run(tmp_path, "c", {"openai:lenient": lenient})
    assert main(["compare", str(b), str(c)]) == 2
    err = capsys.readouterr().err
    assert "judged by openai:strict in A (b) and by openai:lenient in B (c)" in err
    assert main(["compare", str(b), str(c), "--allow-different-judges", "--output", str(out)]) == 0
    assert "A: openai:strict, B: openai:lenient" in capsys.readouterr().out
    (row,) = json.loads(out.read_text())["metrics"]
    assert (row["judge_a"], row["judge_b"]) == ("openai:strict", "openai:lenient")
