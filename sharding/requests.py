"""The units of work that flow from tasks to engine replicas and back."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class SamplingSpec:
    """Engine-agnostic sampling parameters; the engine layer turns them into its own type."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    """One sample of one prompt: sample `sample_index` of N, drawn with `seed`."""

    request_id: str
    prompt: str
    sampling: SamplingSpec
    seed: int
    sample_index: int


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
    retryable: bool = False  # failed for a reason outside the request (its replicas died): never cached

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Completion:
        return cls(**json.loads(line))


@dataclass(frozen=True)
class RequestKey:
    """Everything that determines a generation; its hash is the request id used for caching and resume."""

    model: str
    adapter: str | None
    prompt: str
    sampling: SamplingSpec
    seed: int
    sample_index: int
    extra: tuple[str, ...] = field(default_factory=tuple)

    def request_id(self) -> str:
        payload = json.dumps(asdict(self), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]


def expected_cost(prompt: str, max_tokens: int, n: int) -> int:
    """A cheap length estimate for longest-first ordering: about four characters a token, times N samples."""
    return (len(prompt) // 4 + max_tokens) * n


def build_group(prompt: str, requests: list[GenerationRequest]) -> PromptGroup:
    """Bundle the requests of one prompt; the group id is stable so a requeued group is recognisable."""
    group_id = hashlib.sha256("|".join(r.request_id for r in requests).encode()).hexdigest()[:16]
    max_tokens = max(r.sampling.max_tokens for r in requests)
    return PromptGroup(group_id, prompt, tuple(requests), expected_cost(prompt, max_tokens, len(requests)))
