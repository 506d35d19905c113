"""API judges against a loopback stand-in of an OpenAI-compatible API, on a real local Ray cluster.

The judge actors, their shared RateLimiter and the dispatcher are the real ones; only the external API
is stood in for (tests/judge_api_standin.py), and every claim is checked from what that server received.
The first tests need no Ray: the limiter's arithmetic, the backoff and the API key check.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator

import pytest
import ray

from cluster.errors import ClusterError
from cluster.judge_api import (
    ApiJudgePool,
    ApiJudgeSettings,
    AttemptFailure,
    backoff_s,
    read_api_key,
    retry_after_s,
    start_api_judges,
)
from cluster.rate_limiter import LimiterCore
from sharding.dispatcher import Dispatcher
from sharding.requests import Completion, PromptGroup, SamplingSpec, build_group, make_request
from tests.judge_api_standin import JudgeApiStandin, Served, message_key

KEY_ENV = "RAYEVAL_TEST_JUDGE_KEY"
SAMPLING = SamplingSpec(temperature=0.0, max_tokens=64)


def chat(question: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are a fair judge. End with [[A]] or [[B]]."},
        {"role": "user", "content": f"Question {question}: which answer is better, A or B?"},
    ]


def verdict(messages: list[dict]) -> str:
    return f"[[A]] for: {messages[-1]['content']}"


def groups_of(messages: list[list[dict[str, str]]], sizes: list[int]) -> list[PromptGroup]:
    """One group per conversation with `size` samples each, as the judging stage builds them."""
    groups = []
    for conversation, size in zip(messages, sizes, strict=True):
        prompt = json.dumps(conversation)
        requests = [
            make_request("judge", prompt, SAMPLING, seed=i, sample_index=i, kind="chat") for i in range(size)
        ]
        groups.append(build_group(prompt, requests))
    return groups


def judge(pool: ApiJudgePool, groups: list[PromptGroup]) -> dict[str, Completion]:
    done: dict[str, Completion] = {}

    def collect(group: PromptGroup, completions: list[Completion]) -> None:
        done.update((c.request_id, c) for c in completions)

    asyncio.run(Dispatcher(pool.replicas()).run(groups, on_group_done=collect))
    return done


def busiest_second(arrivals: list[float]) -> int:
    ordered = sorted(arrivals)
    return max(sum(1 for t in ordered[i:] if t < start + 1.0) for i, start in enumerate(ordered))


# --- no Ray ---------------------------------------------------------------------------------------------


def test_limiter_core_spaces_grants_and_caps_leases() -> None:
    core = LimiterCore(requests_per_second=4, max_concurrency=2)
    first = core.lease(now=10.0, asked_at=10.0)
    second = core.lease(now=10.0, asked_at=10.0)
    assert (first, second) == (10.0, 10.25)  # capacity 1: the second waits a full interval, no burst
    assert not core.has_room()
    core.release()
    assert core.lease(now=11.0, asked_at=10.5) == 11.0  # the bucket refilled while idle, but holds only one
    stats = core.stats()
    assert (stats.grants, stats.peak_concurrency, stats.in_use) == (3, 2, 2)
    assert stats.total_wait_s == pytest.approx(0.25 + 0.5)
    with pytest.raises(RuntimeError):
        core.lease(now=12.0, asked_at=12.0)


def test_backoff_takes_retry_after_capped_else_full_jitter() -> None:
    settings = ApiJudgeSettings(model="m", backoff_base_s=0.5, backoff_max_s=4.0)
    rng = random.Random(0)
    assert backoff_s(1, AttemptFailure("429", "", True, 2.5), settings, rng) == 2.5
    assert backoff_s(1, AttemptFailure("429", "", True, 90.0), settings, rng) == 4.0
    waits = [
        backoff_s(attempt, AttemptFailure("500", "", True), settings, rng) for attempt in (1, 3, 9) * 200
    ]
    assert all(0 <= w <= 0.5 for w in waits[0::3]) and all(0 <= w <= 2.0 for w in waits[1::3])
    assert max(waits[2::3]) <= 4.0 and max(waits[2::3]) > 3.0


def test_retry_after_headers() -> None:
    assert retry_after_s({"retry-after": "0.3"}) == 0.3
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert retry_after_s({"retry-after": "soon"}) is None
    assert retry_after_s({}) is None


def test_missing_or_empty_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = ApiJudgeSettings(model="gpt-judge", api_key_env=KEY_ENV)
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ClusterError, match=f"{KEY_ENV}, which is not set.*export {KEY_ENV}="):
        read_api_key(settings)
    monkeypatch.setenv(KEY_ENV, "  ")
    with pytest.raises(ClusterError, match=f"{KEY_ENV}, which is empty"):
        start_api_judges(settings, count=1)  # fails on the driver, before any actor starts


# --- on Ray ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = "sk-test-0123456789abcdef"
    monkeypatch.setenv(KEY_ENV, key)
    return key


@pytest.mark.slow
def test_two_judges_share_one_rate_and_concurrency_limit(local_ray: None, api_key: str) -> None:
    rps, concurrency = 8.0, 4
    # 0.2-0.7 s per answer: sometimes the rate binds, sometimes the concurrency.
    latency = {message_key(chat(q)): 0.2 + 0.1 * (q % 6) for q in range(16)}
    with JudgeApiStandin(verdict, latency_s=latency.__getitem__) as server:
        settings = ApiJudgeSettings(
            model="judge-standin",
            base_url=server.base_url,
            api_key_env=KEY_ENV,
            requests_per_second=rps,
            max_concurrency=concurrency,
            timeout_s=10.0,
        )
        pool = start_api_judges(settings, count=2)
        try:
            groups = groups_of([chat(q) for q in range(16)], [1, 2, 3, 4] * 4)  # 40 requests
            done = judge(pool, groups)
            stats, limiter = pool.stats(), pool.limiter_stats()
        finally:
            pool.shutdown()
        log = server.log()

    requests = [r for g in groups for r in g.requests]
    assert len(done) == len(requests) == 40
    assert all(
        c.ok and c.text == verdict(json.loads(r.prompt))
        for r, c in ((r, done[r.request_id]) for r in requests)
    )
    assert all(
        c.prompt_tokens > 0 and c.output_tokens > 0 and c.finish_reason == "stop" for c in done.values()
    )
    assert len(log) == 40 and {s.model for s in log} == {"judge-standin"}
    arrivals = [s.arrival for s in log]
    assert busiest_second(arrivals) <= rps + 1
    assert max(arrivals) - min(arrivals) >= 39 / rps - 0.2  # the limiter really paced them
    assert {s.replica for s in log} == {"api-judge-0", "api-judge-1"}
    assert {c.replica for c in done.values()} == {"api-judge-0", "api-judge-1"}
    assert server.peak_in_flight <= concurrency
    assert (stats.requests, stats.attempts, stats.retries, stats.failures) == (40, 40, 0, 0)
    assert limiter.grants == 40 and limiter.peak_concurrency <= concurrency and limiter.in_use == 0


PLANS: dict[str, list[str]] = {
    "ok": ["ok"],
    "429-then-ok": ["429", "ok"],
    "429-twice": ["429", "429", "ok"],
    "500-then-ok": ["500", "ok"],
    "timeout-then-ok": ["timeout", "ok"],
    "500-forever": ["500"],
    "garbage": ["garbage"],
}


@pytest.mark.slow
def test_faults_are_retried_as_the_api_asks_and_end_as_completions(local_ray: None, api_key: str) -> None:
    conversations = [chat(q) for q in range(len(PLANS) * 4)]
    plan_of = {message_key(m): list(PLANS)[i % len(PLANS)] for i, m in enumerate(conversations)}

    def schedule(key: str, attempt: int) -> str:
        steps = PLANS[plan_of[key]]
        return steps[min(attempt, len(steps)) - 1]

    retry_after, max_attempts = 0.2, 4
    with JudgeApiStandin(verdict, schedule, retry_after_s=retry_after, timeout_sleep_s=1.6) as server:
        settings = ApiJudgeSettings(
            model="judge-standin",
            base_url=server.base_url,
            api_key_env=KEY_ENV,
            requests_per_second=40.0,
            max_concurrency=8,
            max_attempts=max_attempts,
            timeout_s=1.0,
            backoff_base_s=0.05,
            backoff_max_s=0.5,
        )
        pool = start_api_judges(settings, count=2)
        try:
            groups = groups_of(conversations, [1] * len(conversations))
            done = judge(pool, groups)
            stats = pool.stats()
        finally:
            pool.shutdown()
        log = server.log()

    for group in groups:
        completion = done[group.requests[0].request_id]
        plan = plan_of[message_key(json.loads(group.prompt))]
        if plan == "500-forever":
            assert completion.error == f"JudgeAPIError: HTTP 500 after {max_attempts} attempts"
            assert completion.retryable and completion.text == ""
        elif plan == "garbage":
            assert completion.ok and completion.text == server.garbage_text  # parsing is the task's job
        else:
            assert completion.ok and completion.text == verdict(json.loads(group.prompt)), (plan, completion)

    served = {action: sum(1 for s in log if s.action == action) for action in ("429", "500", "timeout")}
    forever = sum(1 for plan in plan_of.values() if plan == "500-forever")
    assert served["429"] == 4 * 3 and served["timeout"] == 4
    assert stats.retries_by_reason == {
        "429": served["429"],
        "500": served["500"] - forever,  # the last attempt of an always-500 request is not retried
        "timeout": served["timeout"],
    }
    assert stats.attempts == len(log) and stats.retries == len(log) - len(conversations)
    assert (stats.requests, stats.failures) == (len(conversations), forever)
    assert all(count == max_attempts for count in attempts_by_key(log, "500-forever", plan_of).values())

    by_key: dict[tuple[str, int], Served] = {(s.key, s.attempt): s for s in log}
    after_429 = [(s, by_key[s.key, s.attempt + 1]) for s in log if s.action == "429"]
    assert len(after_429) == served["429"]
    assert all(nxt.arrival - s.arrival >= retry_after for s, nxt in after_429)


def attempts_by_key(log: list[Served], plan: str, plan_of: dict[str, str]) -> dict[str, int]:
    return {key: sum(1 for s in log if s.key == key) for key, p in plan_of.items() if p == plan}


@pytest.mark.slow
def test_rejected_key_is_not_retried_and_never_quoted(local_ray: None, api_key: str) -> None:
    with JudgeApiStandin(verdict, api_key="sk-the-right-key") as server:
        settings = ApiJudgeSettings(model="judge-standin", base_url=server.base_url, api_key_env=KEY_ENV)
        pool = start_api_judges(settings, count=1)
        try:
            done = judge(pool, groups_of([chat(0)], [1]))
            stats = pool.stats()
        finally:
            pool.shutdown()

    (completion,) = done.values()
    assert (
        completion.error == f"JudgeAPIError: HTTP 401: the API rejected the key from {KEY_ENV} (not retried)"
    )
    assert completion.retryable
    assert api_key not in completion.error and api_key[-4:] not in completion.error
    assert (stats.attempts, stats.retries, stats.failures) == (1, 0, 1)
