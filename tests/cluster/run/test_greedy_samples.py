"""Greedy decoding with --num-samples N on real engines: the N samples of a question are one draw, so they are
one request, generated and scored once, and summary.json says so (N = 1, no std across runs, no pass@k).
A store written when greedy samples were N requests keyed by seed and sample index is read back without
generating anything. The greedy run is the shared base run (`base_ifeval_run`, N = 4)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from sharding.requests import Completion, RequestKey
from tests.runs import BASE_IFEVAL_ARGS, BASE_IFEVAL_LIMIT, BASE_IFEVAL_SAMPLES, MODEL_DIR, rayeval, records


def test_greedy_n_is_one_request_per_question_and_reported_as_one_draw(base_ifeval_run):
    store = records(base_ifeval_run / "cache" / "completions.jsonl")
    summary = json.loads((base_ifeval_run / "summary.json").read_text())
    assert len(store) == BASE_IFEVAL_LIMIT  # not N x questions
    assert summary["run"]["requests"] == summary["run"]["requests_generated"] == BASE_IFEVAL_LIMIT
    task = summary["tasks"]["ifeval"]
    assert f"the {BASE_IFEVAL_SAMPLES} samples asked per question are one draw" in task["one_draw"]
    assert task["num_runs"] == 1 and task["num_samples"] == BASE_IFEVAL_LIMIT
    rows = records(base_ifeval_run / "samples" / MODEL_DIR / "ifeval.jsonl")
    assert [(r["doc_id"], r["sample_index"]) for r in rows] == [(d, 0) for d in range(BASE_IFEVAL_LIMIT)]
    for key, metric in task["metrics"].items():
        assert metric["n"] == 1 and metric["std_across_runs"] is None and "pass_at_k" not in metric
        hits = np.array([r["scores"][key] * r["weights"][key] for r in rows])
        weights = np.array([r["weights"][key] for r in rows])
        assert metric["mean"] == pytest.approx(hits.sum() / weights.sum(), rel=1e-12)
        assert metric["run_means"] == [metric["mean"]]


def test_a_store_written_when_greedy_samples_were_n_requests_is_read_back(base_ifeval_run, tmp_path):
    """The store an earlier rayeval wrote for this run: every question's N samples under the ids of keys with
    seed + i and sample index i (computed here from the key's definition), each holding the greedy answer."""
    from cluster.config import RunConfig
    from cluster.models import prompt_renderer
    from cluster.plan import build_plan
    from cluster.run import build_requests

    settings = yaml.safe_load((base_ifeval_run / "config.yaml").read_text())
    settings.pop("resolved_model_path")
    plan = build_plan(RunConfig(**settings))
    renderer = prompt_renderer(plan.model, plan.config.model.chat_template, plan.config.model.revision)
    planned = build_requests(plan, renderer)
    assert len(planned) == BASE_IFEVAL_LIMIT
    answers = {c["request_id"]: c for c in records(base_ifeval_run / "cache" / "completions.jsonl")}
    old_store = tmp_path / "old" / "cache" / "completions.jsonl"
    old_store.parent.mkdir(parents=True)
    seed = plan.config.sampling.seed
    with old_store.open("w") as handle:
        for item in planned:
            request, answer = item.request, answers[item.request.request_id]
            for i in range(BASE_IFEVAL_SAMPLES):
                key = RequestKey(plan.model.path, None, request.prompt, request.sampling, seed + i, i)
                handle.write(Completion(**{**answer, "request_id": key.request_id()}).to_json() + "\n")

    done = rayeval("run", *BASE_IFEVAL_ARGS, "--limit", str(BASE_IFEVAL_LIMIT), "--num-samples",
                   str(BASE_IFEVAL_SAMPLES), "--output-dir", str(tmp_path), "--run-id", "old")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{BASE_IFEVAL_LIMIT} reused from the store, 0 to generate" in done.stderr
    run = json.loads((tmp_path / "old" / "summary.json").read_text())["run"]
    assert run["requests_generated"] == 0 and run["engines"] == []
    resumed = records(tmp_path / "old" / "samples" / MODEL_DIR / "ifeval.jsonl")
    base = records(base_ifeval_run / "samples" / MODEL_DIR / "ifeval.jsonl")
    assert [(r["output"], r["scores"]) for r in resumed] == [(r["output"], r["scores"]) for r in base]
    # read back, not generated: the base run's token totals, none generated, no tokens per second
    tokens = run["tokens"]
    totals = (sum(r["prompt_tokens"] for r in base), sum(r["output_tokens"] for r in base))
    assert (tokens["prompt_tokens"], tokens["output_tokens"]) == totals
    assert tokens["generated"] == {"prompt_tokens": 0, "output_tokens": 0} and tokens["per_replica"] == {}
    assert tokens["output_tokens_per_s"] is None
    assert (
        f"tokens: {totals[0]:,} prompt, {totals[1]:,} output; no output tokens generated in this run"
        in done.stdout
    )
