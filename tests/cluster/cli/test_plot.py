"""`rayeval plot`: training curves from finished run folders, two training runs on one axis, and a judged
task's curve drawn from one named judge's verdicts."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from matplotlib.image import imread

from cluster.cli import main
from cluster.cli.plot import runs_in
from evaluators.curves import ErrorBar, curves_by_task, points_from_run
from evaluators.tasks.gsm8k import GSM8K
from tests.run_folders import STRICT, write_gsm8k_run, write_judged_run


@pytest.fixture
def two_training_runs(tmp_path):
    """sft and rl, steps 120 / 240 / 360 each; 10 questions, N = 2; strict accuracy grows with the step."""
    for series, offset in (("sft", 0), ("rl", 1)):
        for index, step in enumerate((120, 240, 360)):
            solved = 3 * index + offset  # questions below this one are solved in both samples
            strict = {q: [int(q < solved), int(q <= solved)] for q in range(10)}
            write_gsm8k_run(tmp_path / series, f"step_{step}", strict, strict)
    return tmp_path / "sft", tmp_path / "rl"


def test_plot_draws_one_png_per_task_and_the_tables(two_training_runs, tmp_path, capsys):
    sft, rl = two_training_runs
    out = tmp_path / "plots"
    assert main(["plot", str(sft), str(rl), "--output", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / "gsm8k.png"), str(out / "sweep_summary.csv"), str(out / "sweep_summary.md")]
    height, width, _ = imread(out / "gsm8k.png").shape
    assert height > 200 and width > 300
    rows = list(csv.DictReader((out / "sweep_summary.csv").open()))
    assert len(rows) == 2 * 3 * 2  # training runs x steps x metrics
    sft_strict = [r for r in rows if r["series"] == "sft" and r["metric"] == STRICT]
    assert [int(r["step"]) for r in sft_strict] == [120, 240, 360]
    assert [float(r["mean"]) for r in sft_strict] == pytest.approx([0.05, 0.35, 0.65])
    assert (
        "| sft | 240 | gsm8k | exact_match,strict-match | 0.3500 |" in (out / "sweep_summary.md").read_text()
    )


def test_each_point_carries_its_runs_error_bar(two_training_runs):
    sft, _ = two_training_runs
    points = [p for series, step, run in runs_in(sft) for p in points_from_run(run, series, step)]
    (strict,) = [c for c in curves_by_task(points, ErrorBar.CI95)["gsm8k"] if c.metric == STRICT]
    assert strict.steps == (120, 240, 360)
    first = next(p for p in points if p.step == 120 and p.metric == STRICT)
    assert strict.below[0] == pytest.approx(first.mean - first.ci95_low)
    assert strict.above[0] == pytest.approx(first.ci95_high - first.mean)
    (sem,) = [c for c in curves_by_task(points, ErrorBar.SEM)["gsm8k"] if c.metric == STRICT]
    assert sem.below == sem.above and sem.below[0] == pytest.approx(first.sem)
    (none,) = [c for c in curves_by_task(points, ErrorBar.NONE)["gsm8k"] if c.metric == STRICT]
    assert set(none.below) == {0.0}


def test_a_run_without_a_step_in_its_name_is_named(tmp_path, capsys):
    write_gsm8k_run(tmp_path / "sft", "final", {0: [1]}, {0: [1]})
    assert main(["plot", str(tmp_path / "sft"), "--output", str(tmp_path / "p")]) == 2
    assert "Run folder" in (err := capsys.readouterr().err) and "names no step" in err
    assert main(["plot", str(tmp_path / "nowhere")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_judged_curves_name_their_judge_and_never_mix_two(tmp_path, capsys):
    """A judged task's points are one judge's verdicts, named in the table: a step judged twice needs
    --judge, steps judged by different judges are refused unless allowed, and a sweep's own step takes the
    judge its latest invocation used."""
    sft, out = tmp_path / "sft", tmp_path / "plots"
    write_judged_run(sft, "step_100", {"openai:strict": {q: [q % 3, 0] for q in range(5)}})
    second = {q: [2, q % 2] for q in range(5)}
    write_judged_run(
        sft, "step_200", {"openai:lenient": {q: [2, 2] for q in range(5)}, "openai:strict": second}
    )
    assert main(["plot", str(sft), "--output", str(out)]) == 2
    assert "alpaca_eval was judged by 2 judges" in capsys.readouterr().err
    assert main(["plot", str(sft), "--output", str(out), "--judge", "openai:strict"]) == 0
    rows = list(csv.DictReader((out / "sweep_summary.csv").open()))
    assert [(r["step"], r["judge"]) for r in rows] == [("100", "openai:strict"), ("200", "openai:strict")]
    assert float(rows[1]["mean"]) == pytest.approx(
        np.mean([np.mean(s) / 2 for s in second.values()]), rel=1e-12
    )
    assert "| openai:strict |" in (out / "sweep_summary.md").read_text()
    latest = points_from_run(sft / "step_200", "sft", 200, latest_judge=True)  # its summary.json's judge
    assert {p.judge for p in latest} == {"openai:strict"}

    rl = tmp_path / "rl"
    write_judged_run(rl, "step_100", {"openai:strict": {q: [1] for q in range(5)}})
    write_judged_run(rl, "step_200", {"openai:lenient": {q: [2] for q in range(5)}})
    capsys.readouterr()
    assert main(["plot", str(rl), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "alpaca_eval: the runs were judged by different judges" in err
    assert "openai:lenient at rl step 200; openai:strict at rl step 100" in err
    assert main(["plot", str(rl), "--output", str(out), "--allow-different-judges"]) == 0
    rows = list(csv.DictReader((out / "sweep_summary.csv").open()))
    assert {(r["step"], r["judge"]) for r in rows} == {("100", "openai:strict"), ("200", "openai:lenient")}


def test_steps_scored_by_different_versions_of_a_task_are_refused_unless_allowed(
    two_training_runs, tmp_path, capsys
):
    """A task's version changes how an answer scores: a curve whose steps two versions scored would move with
    the change, so plot refuses it, naming each version's steps, and draws it when told to."""
    sft, _ = two_training_runs
    summary_file = sft / "step_360" / "summary.json"
    summary = json.loads(summary_file.read_text())
    summary["tasks"]["gsm8k"]["version"] = "9.9"
    summary_file.write_text(json.dumps(summary))
    out = tmp_path / "plots"
    assert main(["plot", str(sft), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    now = GSM8K().version
    assert (
        f"gsm8k: the runs scored it with different versions of the task ({now} at sft step 120, sft step 240; "
        in err
    )
    assert "9.9 at sft step 360)" in err and "--allow-different-versions" in err and not out.exists()
    assert main(["plot", str(sft), "--output", str(out), "--allow-different-versions"]) == 0
    rows = list(csv.DictReader((out / "sweep_summary.csv").open()))
    assert len(rows) == 3 * 2 and {(r["step"], r["version"]) for r in rows} == {
        ("120", now),
        ("240", now),
        ("360", "9.9"),
    }


def test_a_perplexity_and_a_bootstrap_statistic_are_curves_too(tmp_path):
    # summary.json as rayeval writes it: lm-eval's perplexity (no mean metric) and a judged task's LC win rate
    import json

    from evaluators.judging.base import TaskStatistic
    from evaluators.report import TaskSummary, summary_json

    wiki = TaskSummary("wiki", "2", 0, 62, 62, 62, 1, 0, {}, source="lm-eval")
    wiki.aggregate_only = {"word_perplexity,none": (21.3, 0.4)}
    judged = TaskSummary("alpaca_eval", "2", 0, 10, 10, 20, 2, 0, {})
    judged.statistics = [TaskStatistic("length_controlled_win_rate,none", 0.41, 0.05, 0.3, 0.5, "LC", True)]
    run = tmp_path / "step_100"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(summary_json([wiki, judged], {"run_id": "step_100"})))
    points = {(p.task, p.metric): p for p in points_from_run(run, "sft", 100)}
    perplexity = points[("wiki", "word_perplexity,none")]
    assert (perplexity.mean, perplexity.sem, perplexity.questions) == (21.3, 0.4, 62)
    lc = points[("alpaca_eval", "length_controlled_win_rate,none (bootstrap)")]
    assert (lc.mean, lc.sem, lc.ci95_low, lc.ci95_high, lc.n) == (0.41, 0.05, 0.3, 0.5, 2)
    # a sweep's own step (the latest judge's numbers) keeps them too
    assert {(p.task, p.metric) for p in points_from_run(run, "sft", 100, latest_judge=True)} == set(points)
