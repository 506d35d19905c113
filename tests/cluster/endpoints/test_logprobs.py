"""Log-likelihoods read from a server's prompt logprobs, on answers shaped as vLLM's /v1/completions writes
them and parsed by the `openai` client as the client actor gets them (no server needed: the real served
model answers tests/cluster/serve/test_serve.py)."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types import Completion as OpenAiCompletion

from cluster.endpoints import BadResponse, FailureReason, read_prompt_logprobs, scored_continuation
from sharding.requests import SamplingSpec, make_request

TOKENS = (1, 7, 8, 9)


def served_answer(prompt_logprobs: Any) -> OpenAiCompletion:
    choice = {"index": 0, "text": " x", "finish_reason": "length", "logprobs": None}
    if prompt_logprobs is not ...:
        choice["prompt_logprobs"] = prompt_logprobs
    return OpenAiCompletion.model_validate(
        {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "smol", "choices": [choice]}
    )


def entry(**logprobs: float) -> dict[str, dict[str, Any]]:
    return {
        token.removeprefix("t"): {"logprob": value, "rank": 1, "decoded_token": "?"}
        for token, value in logprobs.items()
    }


VLLM_SHAPED = [None, entry(t7=-0.5), entry(t8=-1.0), entry(t9=-2.0, t4=-0.25)]


def loglikelihood(start: int) -> Any:
    return make_request("m", "", SamplingSpec(max_tokens=1), 0, 0, prompt_token_ids=TOKENS, kind="loglikelihood",
                        continuation_start=start)  # fmt: skip


def test_the_continuation_is_summed_from_its_start_and_checked_for_greedy() -> None:
    answer = served_answer(VLLM_SHAPED)
    assert scored_continuation(loglikelihood(2), answer) == (-3.0, False)  # token 4 beat token 9
    assert scored_continuation(loglikelihood(1), answer) == (-3.5, False)
    assert scored_continuation(loglikelihood(2), served_answer(VLLM_SHAPED[:3] + [entry(t9=-2.0)])) == (
        -3.0,
        True,
    )
    positions = read_prompt_logprobs(answer.choices[0], TOKENS)
    assert positions[0] == {} and positions[3] == {9: -2.0, 4: -0.25}  # JSON's string keys back to token ids


def test_generated_requests_are_not_read_for_logprobs() -> None:
    generate = make_request("m", "", SamplingSpec(max_tokens=4), 0, 0, prompt_token_ids=TOKENS)
    assert scored_continuation(generate, served_answer(...)) is None


@pytest.mark.parametrize(
    ("prompt_logprobs", "detail"),
    [
        (..., "holds no prompt logprobs (none)"),  # a server that ignores the extension
        (VLLM_SHAPED[:3], "(3 for 4 prompt tokens)"),
        ([None, entry(t7=-0.5), entry(t3=-1.0), entry(t9=-2.0)], "leave out prompt token 8"),
    ],
)
def test_an_answer_without_usable_prompt_logprobs_fails_and_is_not_retried(
    prompt_logprobs: Any, detail: str
) -> None:
    with pytest.raises(BadResponse) as failed:
        scored_continuation(loglikelihood(2), served_answer(prompt_logprobs))
    assert (
        failed.value.reason is FailureReason.NO_PROMPT_LOGPROBS
        and not FailureReason.NO_PROMPT_LOGPROBS.transient
    )
    assert detail in failed.value.message and "rayeval serve" in failed.value.message
