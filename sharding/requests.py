"""The units of work that flow from tasks to engine replicas and back."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

RequestKind = Literal["generate", "loglikelihood", "chat"]
EngineOption = tuple[str, float | int | bool | str]


@dataclass(frozen=True)
class SamplingSpec:
    """Engine-agnostic sampling parameters; the engine layer turns them into its own type.

    `engine_options` carries further sampling fields by their engine name (lm-eval gen kwargs such as
    top_k or skip_special_tokens), sorted so equal settings hash equally.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    engine_options: tuple[EngineOption, ...] = ()


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter the engine applies to a request: its name, its folder on every node, and a digest of its
    files, so a retrained adapter at the same path makes new request ids."""

    name: str
    path: str
    digest: str

    @property
    def identity(self) -> str:
        return f"{self.name}:{self.digest}"


@dataclass(frozen=True)
class GenerationRequest:
    """One sample of one prompt: sample `sample_index` of N, drawn with `seed`.

    A prompt is text, or token ids when the caller tokenised it (lm-eval does). A `loglikelihood` request
    generates nothing: it asks for the log-probability of the prompt tokens from `continuation_start` on,
    given the tokens before it. A `chat` request's prompt is a JSON list of {role, content} messages, for
    chat APIs that apply their own template (API judges).
    """

    request_id: str
    prompt: str
    sampling: SamplingSpec
    seed: int
    sample_index: int
    prompt_token_ids: tuple[int, ...] | None = None
    kind: RequestKind = "generate"
    continuation_start: int = 0
    adapter: Adapter | None = None  # a LoRA adapter on the replicas' base model
    earlier_ids: tuple[str, ...] = ()  # ids earlier rayeval versions gave the same work (read back on resume)

    @property
    def group_key(self) -> tuple[object, ...]:
        """Requests with equal keys share a prompt prefix and go to one replica together (a prefix is cached
        per adapter, so requests of different adapters are grouped apart)."""
        adapter = self.adapter.identity if self.adapter else None
        if self.kind == "loglikelihood" and self.prompt_token_ids is not None:
            return ("loglikelihood", adapter, self.prompt_token_ids[: self.continuation_start])
        return (self.kind, adapter, self.prompt_token_ids or self.prompt, self.sampling)


@dataclass(frozen=True)
class PromptGroup:
    """The dispatch unit: every sample of one prompt, sent together to one replica so its prefix cache pays."""

    group_id: str
    prompt: str
    requests: tuple[GenerationRequest, ...]
    expected_cost: int

    @property
    def size(self) -> int:
        return len(self.requests)


@dataclass
class Completion:
    """What an engine returned for one request. `error` set means the request failed and is counted as such."""

    request_id: str
    text: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str | None = None
    latency_s: float = 0.0
    replica: str = ""
    error: str | None = None
    logprob: float | None = None  # loglikelihood requests: sum over the continuation tokens
    is_greedy: bool | None = None  # loglikelihood requests: every continuation token was the argmax
    retryable: bool = False  # failed for a reason outside the request (its replicas died): never cached

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> str:
        # Every field is a plain value, so the instance's own dict is its record (asdict copies deeply: 3x slower).
        return json.dumps(vars(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Completion:
        return cls(**json.loads(line))


def continuation_logprob(
    continuation: Sequence[int], candidates: Sequence[Mapping[int, float]]
) -> tuple[float, bool]:
    """Sum of the log-probabilities of a continuation's tokens, and whether each was the most likely token.

    `candidates[i]` maps token id -> log-probability at the continuation's position i, holding its actual
    token and the top-1 (an engine's or a server's prompt logprobs). The greedy check takes the first maximum
    in the map's order, as lm-eval's vLLM backend does, so ties resolve identically.
    """
    total = 0.0
    greedy = True
    for token, at in zip(continuation, candidates, strict=True):
        total += at[token]
        if greedy and max(at, key=at.__getitem__) != token:
            greedy = False
    return total, greedy


@dataclass(frozen=True)
class RequestKey:
    """Everything that determines a generation; its hash is the request id used for caching and resume.

    Greedy decoding (temperature 0) gives the same output whatever the seed, so a greedy request's key holds
    seed 0 and sample index 0: the N samples of a greedy question are one request, generated once."""

    model: str
    adapter: str | None
    prompt: str
    sampling: SamplingSpec
    seed: int
    sample_index: int
    prompt_token_ids: tuple[int, ...] | None = None
    kind: RequestKind = "generate"
    continuation_start: int = 0
    extra: tuple[str, ...] = field(default_factory=tuple)

    def request_id(self) -> str:
        # The same JSON as dataclasses.asdict gives (ids stay stable across versions), without its deep copy,
        # which cost ~40 microseconds per request: fields are plain values, tuples and one SamplingSpec.
        fields = {**vars(self), "sampling": vars(self.sampling)}
        payload = json.dumps(fields, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]


def make_request(
    model: str,
    prompt: str,
    sampling: SamplingSpec,
    seed: int,
    sample_index: int,
    *,
    prompt_token_ids: tuple[int, ...] | None = None,
    kind: RequestKind = "generate",
    continuation_start: int = 0,
    adapter: Adapter | None = None,
) -> GenerationRequest:
    """A request whose id is the hash of everything that determines its result (so equal work is done once).

    A tokenised prompt is identified by its token ids alone; its text is kept for the records only. A greedy
    request's id ignores its seed and sample index (`RequestKey`); the id it had when they counted is kept in
    `earlier_ids`, so a store written then is read back.
    """
    key = RequestKey(
        model,
        adapter.identity if adapter else None,
        "" if prompt_token_ids is not None else prompt,
        sampling,
        seed,
        sample_index,
        prompt_token_ids,
        kind,
        continuation_start,
    )
    earlier: tuple[str, ...] = ()
    if sampling.temperature == 0 and (seed, sample_index) != (0, 0):
        earlier = (key.request_id(),)
        key = replace(key, seed=0, sample_index=0)
    return GenerationRequest(
        request_id=key.request_id(),
        prompt=prompt,
        sampling=sampling,
        seed=seed,
        sample_index=sample_index,
        prompt_token_ids=prompt_token_ids,
        kind=kind,
        continuation_start=continuation_start,
        adapter=adapter,
        earlier_ids=earlier,
    )


def expected_cost(request: GenerationRequest, n: int) -> int:
    """A cheap length estimate for longest-first ordering: prompt tokens (or chars / 4) plus output, times N."""
    prompt_tokens = (
        len(request.prompt_token_ids) if request.prompt_token_ids is not None else len(request.prompt) // 4
    )
    output_tokens = 1 if request.kind == "loglikelihood" else request.sampling.max_tokens
    return (prompt_tokens + output_tokens) * n


def build_group(prompt: str, requests: list[GenerationRequest]) -> PromptGroup:
    """Bundle the requests of one prompt; the group id is stable so a requeued group is recognisable."""
    group_id = hashlib.sha256("|".join(r.request_id for r in requests).encode()).hexdigest()[:16]
    longest = max(requests, key=lambda r: expected_cost(r, 1))
    return PromptGroup(group_id, prompt, tuple(requests), expected_cost(longest, len(requests)))


def group_prompts(requests: Sequence[GenerationRequest]) -> list[PromptGroup]:
    """One group per shared prompt prefix (the N samples of a prompt, the choices of a question), in the
    order each group's first request comes."""
    by_key: dict[tuple[object, ...], dict[str, GenerationRequest]] = {}
    for request in requests:
        by_key.setdefault(request.group_key, {})[request.request_id] = request
    return [build_group(next(iter(g.values())).prompt, list(g.values())) for g in by_key.values()]
