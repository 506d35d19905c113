"""Adaptive N end to end on real engines: `--num-samples auto --target-sem X --max-samples K` draws extra
samples in rounds for the questions that move the error bar most, reports N per question and why it stopped,
and a rerun reads every round back from the store."""

from __future__ import annotations

import json

import pytest

from tests.runs import ENGINE_FLAGS, rayeval, records

COMMON = ["--tasks", "ifeval", "--limit", "8", "--temperature", "0.9", *ENGINE_FLAGS]


def test_adaptive_samples_until_the_most_allowed_then_resume_asks_nothing(tmp_path):
    args = ["run", *COMMON, "--num-samples", "auto", "--target-sem", "0.0001", "--max-samples", "4"]
    args += ["--output-dir", str(tmp_path), "--run-id", "adaptive"]
    done = rayeval(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    task = json.loads((tmp_path / "adaptive" / "summary.json").read_text())["tasks"]["ifeval"]
    adaptive = task["adaptive"]
    per_question = adaptive["samples_per_question"]
    assert adaptive["stop"] == "max_samples_reached" and adaptive["first_samples"] == 2
    assert len(per_question) == 8 and set(per_question.values()) == {4}  # an unreachable target: all to K
    assert adaptive["rounds"] >= 2 and len(adaptive["sem_by_round"]) == adaptive["rounds"] + 1
    rows = records(tmp_path / "adaptive" / "samples" / "SmolLM2-135M-Instruct" / "ifeval.jsonl")
    assert len(rows) == 32 and {r["sample_index"] for r in rows} == {0, 1, 2, 3}
    metric = task["metrics"][adaptive["metric"]]
    # the report's last SEM is the summary's: question-clustered, each question once
    assert metric["n"] == 4 and metric["sem"] == pytest.approx(adaptive["sem_by_round"][-1])

    again = rayeval(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "(32 of 32 requests reused" in again.stdout
    assert (
        json.loads((tmp_path / "adaptive" / "summary.json").read_text())["tasks"]["ifeval"]["adaptive"]
        == adaptive
    )


def test_a_target_already_met_draws_nothing_more(tmp_path):
    args = ["run", *COMMON, "--num-samples", "auto", "--target-sem", "0.9", "--output-dir", str(tmp_path)]
    done = rayeval(*args, "--run-id", "loose")
    assert done.returncode == 0, done.stderr[-3000:]
    adaptive = json.loads((tmp_path / "loose" / "summary.json").read_text())["tasks"]["ifeval"]["adaptive"]
    assert adaptive["stop"] == "target_sem_reached" and adaptive["rounds"] == 0
    assert set(adaptive["samples_per_question"].values()) == {2}
