"""Adaptive N end to end on real engines: `--num-samples auto --target-sem X --max-samples K` draws extra
samples in rounds for the questions that move the error bar most, reports N per question and why it stopped,
and a rerun reads every round back from the store."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

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
    tight_args = [*common, "--target-sem", "0.0001", "--max-samples", "4"]
    tight = rayeval(*tight_args)
    assert tight.returncode == 0, tight.stderr[-3000:]
    return met, tight_args, tight, out / "adaptive"


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
