"""Every task's requests: prompts rendered once per question, `num_samples` requests per prompt, seeded
so that sample i of a question uses seed + i. A greedy task (temperature 0) gets one request per question
whatever N: its N samples would be one draw (`TaskPlan.draws`)."""

from __future__ import annotations

from dataclasses import dataclass

from cluster.models import Renderer
from cluster.plan import RunPlan, TaskPlan
from sharding.requests import GenerationRequest, RequestKind, SamplingSpec, make_request


@dataclass
class PlannedSample:
    """One (question, sample index) of one task, with the request that produces it and the digest of the
    task's prompt for the question (`Prompt.digest`)."""

    task_plan: TaskPlan
    doc_index: int
    request: GenerationRequest
    prompt_hash: str


def build_requests(
    plan: RunPlan, renderer: Renderer, sampling_seed: int | None = None
) -> list[PlannedSample]:
    """Every task's requests, `num_samples` per question (one for a greedy task); sample i is seeded
    `sampling_seed + i` (the config's seed unless given: the GPU bench draws fresh samples of the same prompts
    this way)."""
    seed = plan.config.sampling.seed
    first_sample_seed = seed if sampling_seed is None else sampling_seed
    planned: list[PlannedSample] = []
    for task_plan in plan.tasks:
        n = task_plan.draws(plan.config.num_samples)
        for doc_index, sample in enumerate(task_plan.samples):
            posed = task_plan.task.build_prompt(sample, task_plan.fewshot_for(sample, seed))
            prompt, digest = renderer.render(posed), posed.digest()
            for index in range(n):
                request = sample_request(
                    plan, prompt, task_plan.sampling, first_sample_seed + index, index, renderer.request_kind
                )
                planned.append(PlannedSample(task_plan, doc_index, request, digest))
    return planned


def sample_request(
    plan: RunPlan,
    prompt: str,
    sampling: SamplingSpec,
    seed: int,
    sample_index: int,
    kind: RequestKind = "generate",
) -> GenerationRequest:
    """Sample `sample_index` of a rendered prompt, on the plan's model and adapter; `kind` is the renderer's
    (`chat` for a model behind an endpoint)."""
    return make_request(
        plan.model.path, prompt, sampling, seed, sample_index, kind=kind, adapter=plan.adapter
    )
