"""Adaptive N end to end on real engines: `--num-samples auto --target-sem X --max-samples K` draws extra
samples in rounds for the questions that move the error bar most, reports N per question and why it stopped,
and a rerun reads every round back from the store."""

from __future__ import annotations

import json
import shutil
import subprocess
from math import comb
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from tests.runs import ENGINE_FLAGS, rayeval, records

COMMON = [
    "run",
    "--tasks",
    "ifeval",
    "--limit",
    "8",
    "--temperature",
    "0.9",
    *ENGINE_FLAGS,
    "--num-samples",
    "auto",
]


@pytest.fixture(scope="module")
def adaptive_runs(tmp_path_factory) -> tuple[dict, list[str], subprocess.CompletedProcess[str], Path]:
    """Two runs of one run folder: a loose target (0.9) that the first round meets, then an unreachable one
    (0.0001) with at most 4 samples, which reuses the first round's 16 samples and draws the rest. Returns the
    loose run's adaptive report (before the second run rewrites the summary), the second run's arguments and
    result, and the run folder."""
    out = tmp_path_factory.mktemp("adaptive")
    common = [*COMMON, "--output-dir", str(out), "--run-id", "adaptive"]
    loose = rayeval(*common, "--target-sem", "0.9")
    assert loose.returncode == 0, loose.stderr[-3000:]
    met = json.loads((out / "adaptive" / "summary.json").read_text())["tasks"]["ifeval"]["adaptive"]
    shutil.copytree(out / "adaptive", out / "loose", ignore=shutil.ignore_patterns("cache"))  # for compare
    tight_args = [*common, "--target-sem", "0.0001", "--max-samples", "4"]
    tight = rayeval(*tight_args)
    assert tight.returncode == 0, tight.stderr[-3000:]
    return met, tight_args, tight, out / "adaptive"


def per_question(rows: list[dict], key: str) -> dict[int, tuple[float, float, list[float]]]:
    """Per question, from its scored records: (mean of score x weight, mean weight, its 0/1 scores)."""
    found: dict[int, list[tuple[float, float]]] = {}
    for r in rows:
        if r["error"] is None:
            found.setdefault(r["doc_id"], []).append(
                (r["scores"][key] * r["weights"][key], r["weights"][key])
            )
    return {
        q: (np.mean([v for v, _ in s]), np.mean([w for _, w in s]), [v for v, _ in s])
        for q, s in found.items()
    }


def test_every_number_of_the_adaptive_run_equals_an_independent_recomputation(adaptive_runs, tmp_path):
    """Mean, SEM and pass@k of the run, and compare's means against the first round's run, recomputed here
    from the per-sample records with numpy and scipy: each question counts once, with its own n."""
    *_, run_dir = adaptive_runs
    rows = records(run_dir / "samples" / "SmolLM2-135M-Instruct" / "ifeval.jsonl")
    metrics = json.loads((run_dir / "summary.json").read_text())["tasks"]["ifeval"]["metrics"]
    for key, metric in metrics.items():
        y, x, samples = zip(*per_question(rows, key).values(), strict=True)
        y, x = np.array(y), np.array(x)
        mean = y.sum() / x.sum()
        assert metric["mean"] == pytest.approx(mean, rel=1e-12)
        assert metric["sem"] == pytest.approx(stats.sem((y - mean * x) / x.mean()), rel=1e-9)
        for k, row in metric.get("pass_at_k", {}).items():
            expected = [1 - comb(len(s) - int(sum(s)), int(k)) / comb(len(s), int(k)) for s in samples]
            assert row["mean"] == pytest.approx(np.mean(expected), rel=1e-12) and row["questions"] == len(
                samples
            )
    assert set(metrics["prompt_level_strict_acc,none"]["pass_at_k"]) == {"1", "2", "4"}

    out = tmp_path / "cmp.json"
    done = rayeval("compare", str(run_dir.parent / "loose"), str(run_dir), "--output", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    loose = json.loads((run_dir.parent / "loose" / "summary.json").read_text())["tasks"]["ifeval"]["metrics"]
    for row in json.loads(out.read_text())["metrics"]:
        assert row["mean_a"] == pytest.approx(loose[row["metric"]]["mean"], rel=1e-12)
        assert row["mean_b"] == pytest.approx(metrics[row["metric"]]["mean"], rel=1e-12)


def test_adaptive_samples_until_the_most_allowed_then_resume_asks_nothing(adaptive_runs):
    _, args, done, run_dir = adaptive_runs
    assert "16 of 32 requests reused" in done.stdout  # the loose run's first round, read back
    task = json.loads((run_dir / "summary.json").read_text())["tasks"]["ifeval"]
    adaptive = task["adaptive"]
    per_question = adaptive["samples_per_question"]
    assert adaptive["stop"] == "max_samples_reached" and adaptive["first_samples"] == 2
    assert len(per_question) == 8 and set(per_question.values()) == {4}  # an unreachable target: all to K
    assert adaptive["rounds"] >= 2 and len(adaptive["sem_by_round"]) == adaptive["rounds"] + 1
    rows = records(run_dir / "samples" / "SmolLM2-135M-Instruct" / "ifeval.jsonl")
    assert len(rows) == 32 and {r["sample_index"] for r in rows} == {0, 1, 2, 3}
    metric = task["metrics"][adaptive["metric"]]
    # the report's last SEM is the summary's: question-clustered, each question once
    assert metric["n"] == 4 and metric["sem"] == pytest.approx(adaptive["sem_by_round"][-1])

    again = rayeval(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "(32 of 32 requests reused" in again.stdout
    assert json.loads((run_dir / "summary.json").read_text())["tasks"]["ifeval"]["adaptive"] == adaptive


def test_a_target_already_met_draws_nothing_more(adaptive_runs):
    met, *_ = adaptive_runs
    assert met["stop"] == "target_sem_reached" and met["rounds"] == 0
    assert set(met["samples_per_question"].values()) == {2}
