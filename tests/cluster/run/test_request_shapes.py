"""Log-likelihood reading and request grouping, checked on hand-made values (no engine needed)."""

from __future__ import annotations

from sharding.requests import SamplingSpec, continuation_logprob, group_prompts, make_request


def test_continuation_logprob_sums_the_continuation_and_checks_greedy_like_lm_eval():
    candidates = [
        {8: -1.0},  # the actual token is the top-1
        {9: -2.0, 4: -0.25},  # another token was more likely
    ]
    assert continuation_logprob((8, 9), candidates) == (-3.0, False)
    assert continuation_logprob((8,), candidates[:1]) == (-1.0, True)


def test_a_tie_resolves_to_the_first_entry_as_in_lm_eval():
    assert continuation_logprob((5,), [{5: -0.7, 6: -0.7}]) == (-0.7, True)
    assert continuation_logprob((6,), [{5: -0.7, 6: -0.7}]) == (-0.7, False)


def test_choices_of_one_question_and_samples_of_one_prompt_are_grouped():
    context = (1, 2, 3)
    choices = [
        make_request(
            "m",
            "",
            SamplingSpec(max_tokens=1),
            0,
            0,
            prompt_token_ids=context + (c,),
            kind="loglikelihood",
            continuation_start=3,
        )
        for c in (10, 11, 12)
    ]
    other = make_request(
        "m",
        "",
        SamplingSpec(max_tokens=1),
        0,
        0,
        prompt_token_ids=(4, 5, 10),
        kind="loglikelihood",
        continuation_start=2,
    )
    sampled = [
        make_request("m", "text", SamplingSpec(temperature=0.7), 1234 + i, i, prompt_token_ids=(9, 9))
        for i in range(3)
    ]
    groups = group_prompts(choices + [other] + sampled + sampled[:1])
    sizes = sorted(g.size for g in groups)
    assert sizes == [1, 3, 3]  # the duplicate request is asked once
    assert len({r.request_id for g in groups for r in g.requests}) == 7


def test_tokenised_prompts_are_identified_by_their_tokens_not_their_text():
    a = make_request("m", "text a", SamplingSpec(), 0, 0, prompt_token_ids=(1, 2))
    b = make_request("m", "text b", SamplingSpec(), 0, 0, prompt_token_ids=(1, 2))
    c = make_request("m", "text a", SamplingSpec(), 0, 0, prompt_token_ids=(1, 3))
    assert a.request_id == b.request_id != c.request_id


def test_a_sampling_seed_draws_new_samples_of_the_same_prompts():
    from cluster.config import RunConfig, TaskOptions
    from cluster.models import PromptRenderer
    from cluster.plan import build_plan
    from cluster.run import build_requests

    plan = build_plan(
        RunConfig(
            tasks=[TaskOptions(name="ifeval", limit=3)],
            num_samples=2,
            sampling={"temperature": 0.7},
            cluster={"device": "cpu"},
        )
    )
    renderer = PromptRenderer(plan.model, plan.config.model.chat_template, plan.config.model.revision)
    default = [p.request for p in build_requests(plan, renderer)]
    fresh = [p.request for p in build_requests(plan, renderer, sampling_seed=1000)]

    assert [r.prompt for r in fresh] == [r.prompt for r in default]
    assert [r.seed for r in default] == [plan.config.sampling.seed + i for i in (0, 1)] * 3
    assert [r.seed for r in fresh] == [1000, 1001] * 3
    assert not {r.request_id for r in fresh} & {r.request_id for r in default}


def test_top_k_and_a_repetition_penalty_reach_vllms_sampling_only_where_they_change_it():
    """--top-k and --repetition-penalty (a task's own over the run's) go to vLLM's SamplingParams; a penalty
    of 1, vLLM's none, is left out, so the requests keep the ids of runs made without the setting (their
    completions are read back). `--dry-run` names both on the task's line."""
    from cluster.config import RunConfig, TaskOptions
    from cluster.engines.actor import sampling_params
    from cluster.models import PromptRenderer
    from cluster.plan import build_plan
    from cluster.run import build_requests

    def requests(sampling: dict, **task: object) -> tuple[list, str]:
        config = RunConfig(
            tasks=[TaskOptions(name="ifeval", limit=2, **task)], sampling=sampling, cluster={"device": "cpu"}
        )
        plan = build_plan(config)
        renderer = PromptRenderer(plan.model, plan.config.model.chat_template, plan.config.model.revision)
        return [p.request for p in build_requests(plan, renderer)], plan.describe()

    plain, _ = requests({})
    neutral, _ = requests({"repetition_penalty": 1.0})
    assert [r.request_id for r in neutral] == [r.request_id for r in plain]
    assert RunConfig(sampling={"repetition_penalty": 1.0}).sampling.repetition_penalty is None  # unset: none
    overridden, _ = requests({"repetition_penalty": 1.3}, repetition_penalty=1.0)  # the task's own: none
    assert [r.request_id for r in overridden] == [r.request_id for r in plain]
    # sampled: vLLM drops top_k from a greedy request
    penalised, described = requests(
        {"repetition_penalty": 1.3, "top_k": 5, "temperature": 0.7}, repetition_penalty=1.1
    )
    assert penalised[0].sampling.engine_options == (("repetition_penalty", 1.1), ("top_k", 5))
    assert not {r.request_id for r in penalised} & {r.request_id for r in plain}
    params = sampling_params(penalised[0])
    assert (params.repetition_penalty, params.top_k) == (1.1, 5)
    assert sampling_params(plain[0]).repetition_penalty == 1.0
    assert "repetition_penalty=1.1 top_k=5" in described
