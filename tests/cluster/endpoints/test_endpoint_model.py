"""The model under test behind an OpenAI-compatible endpoint (`rayeval run --model openai:NAME --base-url`):
the checks made before anything starts, and a real run whose endpoint answers 429 and 500 before it answers.

The endpoint here is the loopback stand-in of the API judge tests (tests/judge_api_standin.py): it stands
in for an API that misbehaves on a schedule, which a real server cannot be made to do. A real served model
(`rayeval serve`) answers the runs of tests/cluster/serve/test_serve.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.endpoints import NO_KEY, ApiSettings, ApiUser, read_api_key
from cluster.models import default_model_dir
from evaluators.errors import EvalInputError
from tests.judge_api_standin import JudgeApiStandin, dealt
from tests.runs import rayeval, records

ANSWER = "Hello. This answer has two sentences."
KEY_ENV = "RAYEVAL_TEST_ENDPOINT_KEY"


def test_an_endpoint_at_a_base_url_needs_no_key_but_openais_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    local = ApiSettings(
        model="m", base_url="http://127.0.0.1:8000/v1", api_key_env=KEY_ENV, user=ApiUser.MODEL
    )
    assert read_api_key(local) == NO_KEY
    hosted = ApiSettings(model="gpt-x", api_key_env=KEY_ENV, user=ApiUser.MODEL)
    with pytest.raises(EvalInputError, match=f"model endpoint 'gpt-x'.*{KEY_ENV}.*--api-key-env"):
        read_api_key(hosted)
    # a judge alike: one served at a base URL without a key (rayeval serve on loopback) takes any
    judge = ApiSettings(model="m", base_url="http://127.0.0.1:8000/v1", api_key_env=KEY_ENV)
    assert read_api_key(judge) == NO_KEY
    with pytest.raises(EvalInputError, match="API judge 'gpt-x'.*--judge-api-key-env"):
        read_api_key(ApiSettings(model="gpt-x", api_key_env=KEY_ENV))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--base-url", "http://127.0.0.1:9/v1"], "is for a model behind an endpoint"),
        (["--model", "openai:", "--base-url", "http://127.0.0.1:9/v1"], "has no model after the colon"),
        (["--model", "openai:m", "--base-url", "localhost:8000"], "is not an http(s) URL"),
        (["--model", "openai:m", "--lora", "/tmp/adapter"], "serve the adapter there"),
        (
            ["--model", "openai:m", "--base-url", "http://127.0.0.1:9/v1", "--tasks", "lm_eval:gsm8k"],
            "names no model folder here: pass --tokenizer",
        ),
        (
            [
                "--model",
                "openai:m",
                "--base-url",
                "http://127.0.0.1:9/v1",
                "--tokenizer",
                "/nonexistent/tok",
                "--tasks",
                "lm_eval:gsm8k",
            ],
            "--tokenizer /nonexistent/tok: no tokenizer could be loaded",
        ),
        (["--tokenizer", "/tmp", "--tasks", "ifeval"], "is for a model behind an endpoint"),
    ],
)
def test_bad_endpoint_settings_are_refused_before_anything_starts(argv: list[str], message: str) -> None:
    done = rayeval("run", *argv, "--dry-run", timeout=120)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]


def test_log_likelihood_tasks_are_refused_up_front_where_the_endpoint_returns_no_prompt_logprobs(
    local_lm_eval_tasks: Path,
) -> None:
    """The stand-in answers chat completions only (its /v1/completions is a 404), as a hosted chat API would;
    a generate_until lm-eval task needs no prompt logprobs, so the same endpoint passes the check with it."""
    tasks = local_lm_eval_tasks
    with JudgeApiStandin() as standin:
        common = [
            "run", "--model", "openai:standin", "--base-url", standin.base_url, "--tokenizer", str(default_model_dir()),
            "--include-path", str(tasks), "--dry-run",
        ]  # fmt: skip
        refused = rayeval(*common, "--tasks", "gsm8k_local,gsm8k_mc_local,gsm8k_rolling_local", timeout=180)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert (
            "lm-eval task(s) gsm8k_mc_local, gsm8k_rolling_local score answers by log-likelihood"
            in refused.stderr
        )
        assert "HTTP 404: no route /v1/completions" in refused.stderr
        generative = rayeval(*common, "--tasks", "gsm8k_local", timeout=180)
        assert generative.returncode == 0, generative.stderr[-2000:]
        assert "gsm8k_local" in generative.stdout


@pytest.mark.slow
def test_an_endpoint_that_answers_429_and_500_first_costs_no_sample_and_a_resume_asks_nothing(
    tmp_path: Path,
) -> None:
    schedule = dealt(["429", "500", "ok"], first_attempt_only=True)
    with JudgeApiStandin(answer=lambda _messages: ANSWER, schedule=schedule, retry_after_s=0.2) as standin:
        argv = [
            "run", "--model", "openai:standin", "--base-url", standin.base_url, "--tasks", "ifeval",
            "--limit", "9", "--no-progress", "--output-dir", str(tmp_path), "--run-id", "faults",
        ]  # fmt: skip
        done = rayeval(*argv)
        assert done.returncode == 0, done.stderr[-3000:]
        served = standin.log()
        calls = json.loads((tmp_path / "faults" / "summary.json").read_text())["run"]["endpoint"]["calls"]
        again = rayeval(*argv)
        assert again.returncode == 0, again.stderr[-3000:]
        assert len(standin.log()) == len(served)  # the resumed run asked the endpoint nothing
    samples = records(tmp_path / "faults" / "samples" / "standin" / "ifeval.jsonl")
    assert len(samples) == 9 and all(s["output"] == ANSWER and s["error"] is None for s in samples)
    assert sorted(s.action for s in served) == ["429"] * 3 + ["500"] * 3 + ["ok"] * 9
    assert {s.replica for s in served} == {"endpoint-0"} and {s.model for s in served} == {"standin"}
    assert calls["requests"] == 9 and calls["failures"] == 0
    assert calls["retries_by_reason"] == {"429": 3, "5xx": 3}
    assert "9 of 9 requests reused" in again.stdout


def test_top_k_and_a_repetition_penalty_reach_the_endpoint_in_each_chat_request(tmp_path: Path) -> None:
    """A run's --top-k and --repetition-penalty go in the body of every chat request to an endpoint, as vLLM's
    chat API takes them (they were dropped unsaid); a server that knows no such field would answer its error."""
    with JudgeApiStandin(answer=lambda _messages: ANSWER) as standin:
        argv = [
            "run", "--model", "openai:standin", "--base-url", standin.base_url, "--tasks", "ifeval", "--limit", "3",
            "--temperature", "0.5", "--top-k", "5", "--repetition-penalty", "1.2", "--no-progress",
            "--output-dir", str(tmp_path), "--run-id", "sampled",
        ]  # fmt: skip
        done = rayeval(*argv)
        assert done.returncode == 0, done.stderr[-3000:]
        served = standin.log()
    assert len(served) == 3
    sent = [{k: s.settings.get(k) for k in ("temperature", "top_k", "repetition_penalty")} for s in served]
    assert sent == [{"temperature": 0.5, "top_k": 5, "repetition_penalty": 1.2}] * 3
