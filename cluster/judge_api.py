"""API judges: Ray actors that send chat requests to an OpenAI-compatible API, all under one limiter.

Each `chat` request's prompt is a JSON list of {role, content} messages. Every attempt holds a lease of the
cluster-wide `RateLimiter` for the length of its HTTP call, so however many judge actors run on however
many nodes, the API sees one request rate and one concurrency. Failures the API may get over (429, 5xx,
timeouts, dropped connections) are retried with exponential backoff and full jitter, or after the
`Retry-After` the API asked for; a request that never succeeds becomes a failed, `retryable` Completion.

The API key is read by the driver from an environment variable and handed to the actors; it is never
logged and never part of an error message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import openai
import ray
from ray.actor import ActorHandle

from cluster.errors import ClusterError
from cluster.pool import remote_message, replica_call
from cluster.rate_limiter import LimiterStats, RateLimiter
from sharding.dispatcher import Replica
from sharding.requests import Completion, GenerationRequest, PromptGroup

log = logging.getLogger(__name__)

ERROR_PREFIX = "JudgeAPIError"
REPLICA_HEADER = "X-Rayeval-Replica"  # tells the API's logs (and the test stand-in) which actor sent a call


@dataclass(frozen=True)
class ApiJudgeSettings:
    """How to reach the judge API and how hard to push it; plain data so it travels to the actors.

    `requests_per_second` and `max_concurrency` hold for the whole cluster, not per actor.
    """

    model: str
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    requests_per_second: float = 5.0
    max_concurrency: int = 8
    max_attempts: int = 6
    timeout_s: float = 60.0
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0


@dataclass
class ApiJudgeStats:
    """Counts of one actor, or summed over a pool; a retry is counted under the failure that caused it."""

    requests: int = 0
    attempts: int = 0
    retries: int = 0
    retries_by_reason: dict[str, int] = field(default_factory=dict)
    failures: int = 0

    def add(self, other: ApiJudgeStats) -> ApiJudgeStats:
        reasons = dict(self.retries_by_reason)
        for reason, count in other.retries_by_reason.items():
            reasons[reason] = reasons.get(reason, 0) + count
        return ApiJudgeStats(
            self.requests + other.requests,
            self.attempts + other.attempts,
            self.retries + other.retries,
            reasons,
            self.failures + other.failures,
        )


@dataclass(frozen=True)
class AttemptFailure:
    """Why one attempt failed: `reason` is the stats key ("429", "503", "timeout", "connection", ...)."""

    reason: str
    message: str
    retry: bool
    retry_after_s: float | None = None


def read_api_key(settings: ApiJudgeSettings) -> str:
    """The API key from the environment of the driver; the actors get it from here, never from their own."""
    name = settings.api_key_env
    value = os.environ.get(name, "").strip()
    if not value:
        state = "is empty" if name in os.environ else "is not set"
        raise ClusterError(
            f"The API judge '{settings.model}' needs an API key in the environment variable {name}, which "
            f"{state}. Set it in the shell that starts the run (export {name}=...), or name another "
            "variable with --judge-api-key-env."
        )
    return value


def parse_messages(prompt: str) -> list[dict[str, str]]:
    """The chat messages of a `chat` request; ValueError when the prompt is not such a JSON list."""
    expected = "the prompt of a chat request must be a JSON list of {role, content} messages"
    try:
        messages = json.loads(prompt)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{expected}, but it is not JSON ({exc.msg})") from None
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{expected}, got {type(messages).__name__ if messages else 'an empty list'}")
    for index, message in enumerate(messages):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise ValueError(f"{expected}; message {index} is not one")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def chat_arguments(model: str, messages: list[dict[str, str]], request: GenerationRequest) -> dict[str, Any]:
    """The chat.completions.create arguments of one request. `engine_options` name vLLM sampling fields
    that chat APIs do not take, so they are left out."""
    spec = request.sampling
    arguments: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "temperature": spec.temperature,
        "top_p": spec.top_p,
        "max_tokens": spec.max_tokens,
        "seed": request.seed,
    }
    if spec.stop:
        arguments["stop"] = list(spec.stop)
    return arguments


def classify(exc: BaseException, settings: ApiJudgeSettings) -> AttemptFailure:
    """Retry 429, 5xx, timeouts and connection errors; no other failure gets better by asking again."""
    if isinstance(exc, openai.APITimeoutError):  # a subclass of APIConnectionError: test it first
        return AttemptFailure("timeout", f"timed out after {settings.timeout_s:g} s", True)
    if isinstance(exc, openai.APIConnectionError):
        cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
        return AttemptFailure("connection", f"connection error{cause}", True)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        wait = retry_after_s(exc.response.headers)
        if status == 429:
            return AttemptFailure("429", "HTTP 429 (rate limited)", True, wait)
        if status >= 500:
            return AttemptFailure(str(status), f"HTTP {status}", True, wait)
        if status in (401, 403):
            # The body would quote part of the key (OpenAI masks only its middle): leave it out.
            return AttemptFailure(
                str(status), f"HTTP {status}: the API rejected the key from {settings.api_key_env}", False
            )
        return AttemptFailure(str(status), f"HTTP {status}: {_short(exc.message)}", False)
    return AttemptFailure("error", f"{type(exc).__name__}: {_short(str(exc))}", False)


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The wait an API asked for: `retry-after-ms`, or `Retry-After` in seconds or as an HTTP date."""
    milliseconds = headers.get("retry-after-ms")
    if milliseconds:
        try:
            return max(0.0, float(milliseconds) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def backoff_s(attempt: int, failure: AttemptFailure, settings: ApiJudgeSettings, rng: random.Random) -> float:
    """The wait before attempt `attempt + 1`: the API's Retry-After when given, else full jitter,
    uniform over [0, min(max, base * 2^(attempt - 1))], so retrying actors do not fire in step."""
    if failure.retry_after_s is not None:
        return min(failure.retry_after_s, settings.backoff_max_s)
    ceiling = min(settings.backoff_max_s, settings.backoff_base_s * 2.0 ** min(attempt - 1, 60))
    return rng.uniform(0.0, ceiling)


def _redact(text: str, secret: str) -> str:
    return text.replace(secret, "***") if secret else text


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@ray.remote(num_cpus=0, max_restarts=0)
class ApiJudgeActor:
    """One judge client. It only waits on the network, so it takes no CPU from engine replicas."""

    def __init__(self, name: str, settings: ApiJudgeSettings, api_key: str, limiter: ActorHandle) -> None:
        self.name = name
        self.settings = settings
        self._limiter = limiter
        self._key = api_key
        self._client = openai.AsyncOpenAI(
            base_url=settings.base_url,
            api_key=api_key,
            max_retries=0,  # the retries are ours: each one must take a limiter lease
            timeout=settings.timeout_s,
            default_headers={REPLICA_HEADER: name},
        )
        self._stats = ApiJudgeStats()
        self._rng = random.Random()
        self._background: set[asyncio.Task[None]] = set()

    def ready(self) -> str:
        return self.name

    def stats(self) -> ApiJudgeStats:
        return self._stats

    async def generate(self, group: PromptGroup) -> list[Completion]:
        """Judge every request of the group at once; each ends as a Completion, failed or not."""
        return list(await asyncio.gather(*(self._one(r) for r in group.requests)))

    async def _one(self, request: GenerationRequest) -> Completion:
        began = time.perf_counter()
        self._stats.requests += 1
        try:
            messages = parse_messages(request.prompt)
        except ValueError as exc:  # a fault of the request itself, the same on every run: not retryable
            self._stats.failures += 1
            return Completion(request.request_id, replica=self.name, error=f"{ERROR_PREFIX}: {exc}")
        arguments = chat_arguments(self.settings.model, messages, request)
        attempt = 0
        while True:
            attempt += 1
            self._stats.attempts += 1
            try:
                async with self._lease():
                    response = await self._client.chat.completions.create(**arguments)
            except Exception as exc:  # noqa: BLE001 - every failure ends as this request's Completion
                failure = classify(exc, self.settings)
                if not failure.retry or attempt >= self.settings.max_attempts:
                    return self._failed(request, failure, attempt, began)
                self._stats.retries += 1
                reasons = self._stats.retries_by_reason
                reasons[failure.reason] = reasons.get(failure.reason, 0) + 1
                wait = backoff_s(attempt, failure, self.settings, self._rng)
                log.debug(
                    "%s: attempt %d failed (%s); retrying in %.2f s", self.name, attempt, failure.reason, wait
                )
                await asyncio.sleep(wait)
                continue
            return self._completion(request, response, began)

    @asynccontextmanager
    async def _lease(self) -> AsyncIterator[None]:
        """Hold one limiter lease for the length of one HTTP call."""
        granted = self._limiter.acquire.remote()
        try:
            await granted
        except asyncio.CancelledError:
            # Not waiting any more does not stop the limiter from granting: give the lease back when it does.
            task = asyncio.get_running_loop().create_task(self._release_when_granted(granted))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            raise
        try:
            yield
        finally:
            self._limiter.release.remote()  # fire and forget: the next attempt need not wait for it

    async def _release_when_granted(self, granted: ray.ObjectRef) -> None:
        try:
            await granted
        except Exception:  # noqa: BLE001 - no lease was granted, so none is owed
            return
        self._limiter.release.remote()

    def _completion(self, request: GenerationRequest, response: Any, began: float) -> Completion:
        latency = (
            time.perf_counter() - began
        )  # limiter waits and retries included, as an engine's queueing is
        if not response.choices:
            self._stats.failures += 1
            return Completion(
                request.request_id,
                latency_s=latency,
                replica=self.name,
                error=f"{ERROR_PREFIX}: the response holds no choices",
                retryable=True,
            )
        choice = response.choices[0]
        usage = response.usage
        return Completion(
            request_id=request.request_id,
            text=choice.message.content or "",
            prompt_tokens=usage.prompt_tokens if usage is not None else 0,
            output_tokens=usage.completion_tokens if usage is not None else 0,
            finish_reason=choice.finish_reason,
            latency_s=latency,
            replica=self.name,
        )

    def _failed(
        self, request: GenerationRequest, failure: AttemptFailure, attempts: int, began: float
    ) -> Completion:
        self._stats.failures += 1
        if failure.retry:
            detail = f"{failure.message} after {attempts} attempts"
        else:
            detail = f"{failure.message} (not retried)"
        # Every API failure is retryable, i.e. never cached: a cached failure from a wrong key, model name
        # or parameter would outlive its fix, while a failure of the request itself merely fails again.
        return Completion(
            request.request_id,
            latency_s=time.perf_counter() - began,
            replica=self.name,
            error=_redact(f"{ERROR_PREFIX}: {detail}", self._key),
            retryable=True,
        )


def api_judge_replicas(
    actors: list[ActorHandle], names: list[str], settings: ApiJudgeSettings
) -> list[Replica]:
    """Dispatcher handles; each window is the cluster-wide concurrency, which the limiter enforces anyway."""
    return [
        Replica(name, replica_call(actor, name), settings.max_concurrency)
        for actor, name in zip(actors, names, strict=True)
    ]


class ApiJudgePool:
    """The judge actors of a run and their one shared limiter."""

    def __init__(
        self, settings: ApiJudgeSettings, limiter: ActorHandle, actors: list[ActorHandle], names: list[str]
    ) -> None:
        self.settings = settings
        self.limiter = limiter
        self.actors = actors
        self.names = names

    def replicas(self) -> list[Replica]:
        return api_judge_replicas(self.actors, self.names, self.settings)

    def stats(self) -> ApiJudgeStats:
        total = ApiJudgeStats()
        for stats in ray.get([a.stats.remote() for a in self.actors]):
            total = total.add(stats)
        return total

    def limiter_stats(self) -> LimiterStats:
        return ray.get(self.limiter.stats.remote())

    def shutdown(self) -> None:
        for actor in [*self.actors, self.limiter]:
            ray.kill(actor)
        self.actors = []


def start_api_judges(settings: ApiJudgeSettings, count: int, ready_timeout_s: float = 120.0) -> ApiJudgePool:
    """Read the key here on the driver, then start the limiter and `count` judge actors (no CPUs: they
    must never keep engine replicas from being scheduled)."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    api_key = read_api_key(settings)
    limiter = RateLimiter.remote(settings.requests_per_second, settings.max_concurrency)
    names = [f"api-judge-{index}" for index in range(count)]
    actors = [ApiJudgeActor.remote(name, settings, api_key, limiter) for name in names]
    pool = ApiJudgePool(settings, limiter, actors, names)
    try:
        ray.get([a.ready.remote() for a in actors], timeout=ready_timeout_s)
    except Exception as exc:
        pool.shutdown()
        raise ClusterError(
            f"The API judge actors for '{settings.model}' failed to start: {remote_message(exc)}. The openai "
            "package must be installed on every node of the cluster."
        ) from exc
    return pool
