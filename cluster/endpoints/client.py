"""API clients: Ray actors that send requests to an OpenAI-compatible API, all under one limiter. They
serve API judges and a model under test behind an endpoint (`--model openai:M --base-url URL`) alike.

A `chat` request's prompt is a JSON list of {role, content} messages and goes to /chat/completions; a
`generate` request's prompt (its text, or its token ids where it has them) goes to /completions, and so
does a tokenised `loglikelihood` request (lm-eval's), asking for prompt logprobs (`logprobs.py`). Every
attempt holds a lease of the cluster-wide `RateLimiter` for the length of its HTTP call, so however many
client actors run on however
many nodes, the API sees one request rate and one concurrency. Failures the API may get over (429, 5xx,
timeouts, dropped connections, and a 200 that is no chat completion: a body that is not JSON, such as a
proxy's HTML error page, or no choices) are retried with exponential backoff and full jitter, or after the
`Retry-After` the API asked for; a request that never succeeds becomes a failed, `retryable` Completion
whose `finish_reason` names its `FailureReason` (`is_transient` tells the judge runner which failures
deserve a second pass at the end of judging).

The API key is read by the driver (the run's coordinator) from an environment variable and handed to the
actors in a method call (`ApiClientActor.use_key`); it is never logged, and every error message is redacted
of it (and of any bearer token a server quotes back) before it leaves the actor.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import openai
import ray
from ray.actor import ActorHandle

from cluster.endpoints.logprobs import NoPromptLogprobs, continuation_from_choice, loglikelihood_arguments
from cluster.endpoints.rate_limiter import LimiterStats, RateLimiter
from cluster.endpoints.settings import (
    ApiSettings,
    FailureReason,
    read_api_key,
    redact,
    shortened,
    status_failure,
)
from cluster.engines import remote_message, replica_call
from cluster.errors import ClusterError
from sharding.dispatcher import Replica
from sharding.requests import Completion, GenerationRequest, PromptGroup

log = logging.getLogger(__name__)

REPLICA_HEADER = "X-Rayeval-Replica"  # tells the API's logs (and the test stand-in) which actor sent a call


def _count(counts: dict[str, int], reason: FailureReason) -> None:
    counts[reason.value] = counts.get(reason.value, 0) + 1


def _summed(first: dict[str, int], second: dict[str, int]) -> dict[str, int]:
    total = dict(first)
    for reason, count in second.items():
        total[reason] = total.get(reason, 0) + count
    return total


@dataclass
class ApiStats:
    """Counts of one actor, or summed over a pool. A retry is counted under the `FailureReason` value of
    the failure that caused it, a failed request under that of its last attempt's failure."""

    requests: int = 0
    attempts: int = 0
    retries: int = 0
    retries_by_reason: dict[str, int] = field(default_factory=dict)
    failures: int = 0
    failures_by_reason: dict[str, int] = field(default_factory=dict)

    def add(self, other: ApiStats) -> ApiStats:
        return ApiStats(
            self.requests + other.requests,
            self.attempts + other.attempts,
            self.retries + other.retries,
            _summed(self.retries_by_reason, other.retries_by_reason),
            self.failures + other.failures,
            _summed(self.failures_by_reason, other.failures_by_reason),
        )


@dataclass(frozen=True)
class AttemptFailure:
    """Why one attempt failed, and the wait the API asked for before the next one."""

    reason: FailureReason
    message: str
    retry_after_s: float | None = None

    @property
    def retry(self) -> bool:
        return self.reason.transient


class BadResponse(Exception):
    """A 200 that is no chat completion; raised inside the attempt, so it is classified and retried."""

    def __init__(self, reason: FailureReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


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
    """The chat.completions.create arguments of one request. Its `engine_options` (a run's --top-k or
    --repetition-penalty) go in the body as vLLM's chat API takes them; a server that knows no such field
    answers with its error rather than the setting being dropped unsaid."""
    arguments = {**sampling_arguments(model, request), "messages": messages}
    if request.sampling.engine_options:
        arguments["extra_body"] = dict(request.sampling.engine_options)
    return arguments


def completion_arguments(model: str, request: GenerationRequest) -> dict[str, Any]:
    """The completions.create arguments of one request: its token ids where it has them (a tokenised
    lm-eval prompt), else its text. Its `engine_options` (lm-eval's generation kwargs beyond the standard
    ones, such as vLLM's skip_special_tokens) go in the body as lm-eval's own API models send them."""
    prompt: str | list[int] = list(request.prompt_token_ids) if request.prompt_token_ids else request.prompt
    arguments = {**sampling_arguments(model, request), "prompt": prompt}
    if request.sampling.engine_options:
        arguments["extra_body"] = dict(request.sampling.engine_options)
    return arguments


def sampling_arguments(model: str, request: GenerationRequest) -> dict[str, Any]:
    """What chat and completion calls share: the model, the sampling and the request's seed."""
    spec = request.sampling
    arguments: dict[str, Any] = {
        "model": model,
        "temperature": spec.temperature,
        "top_p": spec.top_p,
        "max_tokens": spec.max_tokens,
        "seed": request.seed,
    }
    if spec.stop:
        arguments["stop"] = list(spec.stop)
    return arguments


def scored_continuation(request: GenerationRequest, response: Any) -> tuple[float, bool] | None:
    """A log-likelihood request's answer read from the response's prompt logprobs (None for other kinds);
    BadResponse when the server returned none, which asking again will not change."""
    if request.kind != "loglikelihood":
        return None
    try:
        return continuation_from_choice(response.choices[0], request)
    except NoPromptLogprobs as exc:
        raise BadResponse(
            FailureReason.NO_PROMPT_LOGPROBS,
            f"{exc}: log-likelihoods need a server that returns prompt_logprobs (vllm serve, rayeval serve)",
        ) from None


def check_response(response: Any) -> Any:
    """The chat completion of a 200, or BadResponse. The client hands back the body's text when it is not
    JSON (an HTML page from a proxy, say); that text is never quoted, as such a page may echo the headers."""
    if isinstance(response, str | bytes):
        raise BadResponse(
            FailureReason.NOT_JSON, f"HTTP 200 whose body is not JSON ({len(response)} characters)"
        )
    choices = getattr(response, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise BadResponse(FailureReason.NO_CHOICES, "HTTP 200 whose answer holds no choices")
    return response


def classify(exc: BaseException, settings: ApiSettings) -> AttemptFailure:
    """Retry 429, 5xx, timeouts, connection errors and 200s that are no chat completion; no other failure
    gets better by asking again."""
    if isinstance(exc, BadResponse):
        return AttemptFailure(exc.reason, exc.message)
    if isinstance(exc, json.JSONDecodeError):  # a 200 that claims to be JSON and is not
        return AttemptFailure(FailureReason.NOT_JSON, f"HTTP 200 whose body is not valid JSON ({exc.msg})")
    if isinstance(exc, openai.APITimeoutError):  # a subclass of APIConnectionError: test it first
        return AttemptFailure(FailureReason.TIMEOUT, f"timed out after {settings.timeout_s:g} s")
    if isinstance(exc, openai.APIConnectionError):
        cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
        return AttemptFailure(FailureReason.CONNECTION, f"connection error{cause}")
    if isinstance(exc, openai.APIStatusError):
        return _status_failure(exc, settings)
    return AttemptFailure(FailureReason.OTHER, f"{type(exc).__name__}: {shortened(str(exc))}")


def _status_failure(exc: openai.APIStatusError, settings: ApiSettings) -> AttemptFailure:
    reason, message = status_failure(exc, settings)
    wait = (
        retry_after_s(exc.response.headers)
        if reason in (FailureReason.RATE_LIMITED, FailureReason.SERVER_ERROR)
        else None
    )
    return AttemptFailure(reason, message, wait)


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


def backoff_s(attempt: int, failure: AttemptFailure, settings: ApiSettings, rng: random.Random) -> float:
    """The wait before attempt `attempt + 1`: the API's Retry-After when given, else full jitter,
    uniform over [0, min(max, base * 2^(attempt - 1))], so retrying actors do not fire in step."""
    if failure.retry_after_s is not None:
        return min(failure.retry_after_s, settings.backoff_max_s)
    ceiling = min(settings.backoff_max_s, settings.backoff_base_s * 2.0 ** min(attempt - 1, 60))
    return rng.uniform(0.0, ceiling)


@ray.remote(num_cpus=0, max_restarts=0)
class ApiClientActor:
    """One API client. It only waits on the network, so it takes no CPU from engine replicas.

    The key arrives through `use_key`, a method call, never as an argument of the actor's creation: Ray
    keeps creation arguments in its control store for restarts, while a call's arguments go to the actor
    only (and neither is shown by Ray's state API, unlike a runtime_env)."""

    def __init__(self, name: str, settings: ApiSettings, limiter: ActorHandle) -> None:
        self.name = name
        self.settings = settings
        self._limiter = limiter
        self._key = ""
        self._client: openai.AsyncOpenAI | None = None
        self._stats = ApiStats()
        self._rng = random.Random()
        self._background: set[asyncio.Task[None]] = set()

    def use_key(self, api_key: str) -> str:
        """Build the client with the key; the actor answers requests from here on. Returns its name."""
        self._key = api_key
        self._client = openai.AsyncOpenAI(
            base_url=self.settings.base_url,
            api_key=api_key,
            max_retries=0,  # the retries are ours: each one must take a limiter lease
            timeout=self.settings.timeout_s,
            default_headers={REPLICA_HEADER: self.name},
        )
        return self.name

    def stats(self) -> ApiStats:
        return self._stats

    async def generate(self, group: PromptGroup) -> list[Completion]:
        """Judge every request of the group at once; each ends as a Completion, failed or not."""
        return list(await asyncio.gather(*(self._one(r) for r in group.requests)))

    async def _one(self, request: GenerationRequest) -> Completion:
        began = time.perf_counter()
        self._stats.requests += 1
        try:
            call = self._call(request)
        except ValueError as exc:  # a fault of the request itself, the same on every run: not retryable
            _count(self._stats.failures_by_reason, FailureReason.INVALID_PROMPT)
            self._stats.failures += 1
            return Completion(
                request.request_id,
                replica=self.name,
                error=self.settings.user.failure_kind.error(str(exc)),
                finish_reason=FailureReason.INVALID_PROMPT.value,
            )
        attempt = 0
        while True:
            attempt += 1
            self._stats.attempts += 1
            try:
                async with self._lease():
                    response = check_response(await call())
                scored = scored_continuation(request, response)
            except Exception as exc:  # noqa: BLE001 - every failure ends as this request's Completion
                failure = classify(exc, self.settings)
                if not failure.retry or attempt >= self.settings.max_attempts:
                    return self._failed(request, failure, attempt, began)
                await self._back_off(attempt, failure)
                continue
            return self._completion(request, response, began, scored)

    def _call(self, request: GenerationRequest) -> Callable[[], Awaitable[Any]]:
        """One attempt's HTTP call for the request; ValueError when no OpenAI API answers such a request."""
        if self._client is None:
            raise ValueError("the client has no key yet: start it through start_api_clients")
        if request.kind == "chat":
            chat = chat_arguments(self.settings.model, parse_messages(request.prompt), request)
            return lambda: self._client.chat.completions.create(**chat)
        if request.kind == "generate":
            completion = completion_arguments(self.settings.model, request)
            return lambda: self._client.completions.create(**completion)
        if request.kind == "loglikelihood" and request.prompt_token_ids:
            scoring = loglikelihood_arguments(self.settings.model, request.prompt_token_ids)
            return lambda: self._client.completions.create(**scoring)
        raise ValueError(
            f"an OpenAI-compatible API answers chat, completion and tokenised log-likelihood requests, not "
            f"this '{request.kind}' one"
        )

    async def _back_off(self, attempt: int, failure: AttemptFailure) -> None:
        self._stats.retries += 1
        _count(self._stats.retries_by_reason, failure.reason)
        wait = backoff_s(attempt, failure, self.settings, self._rng)
        log.debug("%s: attempt %d failed (%s); retrying in %.2f s", self.name, attempt, failure.reason, wait)
        await asyncio.sleep(wait)

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

    def _completion(
        self, request: GenerationRequest, response: Any, began: float, scored: tuple[float, bool] | None
    ) -> Completion:
        # Limiter waits and retries included, as an engine's queueing is.
        latency = time.perf_counter() - began
        choice = response.choices[0]  # check_response saw at least one
        usage = response.usage
        prompt_tokens = usage.prompt_tokens if usage is not None else 0
        if scored is not None:  # a log-likelihood: the generated token is no part of the answer
            logprob, greedy = scored
            return Completion(
                request.request_id, prompt_tokens=prompt_tokens, latency_s=latency, replica=self.name,
                logprob=logprob, is_greedy=greedy,
            )  # fmt: skip
        text = choice.message.content if request.kind == "chat" else choice.text
        return Completion(
            request_id=request.request_id,
            text=text or "",
            prompt_tokens=prompt_tokens,
            output_tokens=usage.completion_tokens if usage is not None else 0,
            finish_reason=choice.finish_reason,
            latency_s=latency,
            replica=self.name,
        )

    def _failed(
        self, request: GenerationRequest, failure: AttemptFailure, attempts: int, began: float
    ) -> Completion:
        self._stats.failures += 1
        _count(self._stats.failures_by_reason, failure.reason)
        if failure.retry:
            detail = f"{failure.message} after {attempts} attempt{'s' if attempts > 1 else ''}"
        else:
            detail = f"{failure.message} (not retried)"
        # Every API failure is retryable, i.e. never cached: a cached failure from a wrong key, model name
        # or parameter would outlive its fix, while a failure of the request itself merely fails again.
        return Completion(
            request.request_id,
            latency_s=time.perf_counter() - began,
            replica=self.name,
            error=redact(self.settings.user.failure_kind.error(detail), self._key),
            finish_reason=failure.reason.value,  # why it failed: `is_transient` reads it
            retryable=True,
        )


def api_client_replicas(actors: list[ActorHandle], names: list[str], settings: ApiSettings) -> list[Replica]:
    """Dispatcher handles; each window is the cluster-wide concurrency, which the limiter enforces anyway."""
    return [
        Replica(name, replica_call(actor, name), settings.max_concurrency)
        for actor, name in zip(actors, names, strict=True)
    ]


class ApiClientPool:
    """The API client actors of a run (its judges, or its model's endpoint) and their one shared limiter."""

    def __init__(
        self, settings: ApiSettings, limiter: ActorHandle, actors: list[ActorHandle], names: list[str]
    ) -> None:
        self.settings = settings
        self.limiter = limiter
        self.actors = actors
        self.names = names

    def replicas(self) -> list[Replica]:
        return api_client_replicas(self.actors, self.names, self.settings)

    def stats(self) -> ApiStats:
        total = ApiStats()
        for stats in ray.get([a.stats.remote() for a in self.actors]):
            total = total.add(stats)
        return total

    def limiter_stats(self) -> LimiterStats:
        return ray.get(self.limiter.stats.remote())

    def shutdown(self) -> None:
        for actor in [*self.actors, self.limiter]:
            ray.kill(actor)
        self.actors = []


def start_api_clients(settings: ApiSettings, count: int, ready_timeout_s: float = 120.0) -> ApiClientPool:
    """Read the key here on the driver, then start the limiter and `count` client actors (no CPUs: they
    must never keep engine replicas from being scheduled)."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    api_key = read_api_key(settings)
    limiter = RateLimiter.remote(settings.requests_per_second, settings.max_concurrency)
    names = [f"{settings.user.actor_prefix}-{index}" for index in range(count)]
    actors = [ApiClientActor.remote(name, settings, limiter) for name in names]
    pool = ApiClientPool(settings, limiter, actors, names)
    try:
        ray.get([a.use_key.remote(api_key) for a in actors], timeout=ready_timeout_s)
    except Exception as exc:
        pool.shutdown()
        raise ClusterError(
            f"The API client actors for '{settings.model}' failed to start: {remote_message(exc)}. The openai "
            "package must be installed on every node of the cluster."
        ) from exc
    return pool
