"""Outputs without stop strings are decoded once by the engine actor instead of token by token inside vLLM.

The fast tests check which requests are decoded how; the slow one runs the real SmolLM2 engine on CPU and
checks that decoding once gives exactly the text vLLM's incremental detokenizer gives.
"""

from __future__ import annotations

import pytest

from cluster.engine import _sampling_params, defer_detokenization
from sharding.requests import SamplingSpec, make_request

PROMPTS = [
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
    "Réponds en français : quelle est la capitale de l'Italie ?",
    "Write one line of Python that prints a dictionary with emoji keys like 🐍.",
]


def test_only_requests_without_stop_strings_skip_incremental_detokenization():
    assert defer_detokenization((), detokenize_while_generating=False)
    assert not defer_detokenization(("\n\n",), detokenize_while_generating=False)
    assert not defer_detokenization((), detokenize_while_generating=True)


def test_sampling_params_ask_vllm_for_text_only_where_it_is_needed():
    plain = make_request("m", "p", SamplingSpec(max_tokens=8), 0, 0)
    stopped = make_request("m", "p", SamplingSpec(max_tokens=8, stop=("Q:",)), 0, 0)
    forced = make_request("m", "p", SamplingSpec(max_tokens=8, engine_options=(("detokenize", True),)), 0, 0)
    assert _sampling_params(plain).detokenize is False
    assert _sampling_params(plain, detokenize_while_generating=True).detokenize is True
    assert _sampling_params(stopped).detokenize is True
    assert _sampling_params(forced).detokenize is True  # the task's own engine options win


@pytest.mark.slow
def test_decoding_once_gives_the_text_of_incremental_detokenization():
    from cluster.config import ClusterOptions, ModelOptions, RunConfig
    from cluster.plan import build_model_plan
    from cluster.runner import RequestRunner
    from cluster.session import ray_session

    config = RunConfig(
        model=ModelOptions(max_model_len=512, enforce_eager=True),
        cluster=ClusterOptions(replicas=1, device="cpu"),
    )
    plan = build_model_plan(config, device="cpu")
    once = SamplingSpec(temperature=0.0, max_tokens=64)
    incremental = SamplingSpec(temperature=0.0, max_tokens=64, engine_options=(("detokenize", True),))
    requests = {
        (prompt, mode): make_request(plan.model.path, prompt, spec, seed=0, sample_index=0)
        for prompt in PROMPTS
        for mode, spec in (("once", once), ("incremental", incremental))
    }
    with ray_session(None, plan.replica, 1, verbose=False):
        runner = RequestRunner(plan, None, progress=False)
        try:
            results = runner.run(list(requests.values()))
        finally:
            runner.close()
    for prompt in PROMPTS:
        decoded_once = results[requests[prompt, "once"].request_id]
        streamed = results[requests[prompt, "incremental"].request_id]
        assert decoded_once.ok and streamed.ok
        assert decoded_once.output_tokens == streamed.output_tokens > 0
        assert decoded_once.text == streamed.text
