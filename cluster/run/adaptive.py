"""Adaptive N over a run's native tasks: after the first samples, rounds of more samples where they shrink
each task's error bar most (`evaluators.adaptive.allocate`), until the target SEM or the most samples allowed.
A task's error bar is that of its metric with the largest SEM, so every metric ends at or below the target.

Extra sample i of a question is seeded seed + i like the first ones, so the rounds are the same requests on a
rerun: a resumed run reads them back from the store and reaches the same decisions.
"""

from __future__ import annotations

import logging
import math

from cluster.plan import RunPlan, TaskPlan
from cluster.run.records import SampleWriter
from cluster.run.requests import PlannedSample, sample_request
from cluster.run.runner import RequestRunner
from evaluators.adaptive import AdaptiveReport, AdaptiveRule, allocate
from evaluators.judging.base import JudgeTask
from evaluators.report import scored_items
from evaluators.stats import summarize

log = logging.getLogger(__name__)


def adapt_samples(
    plan: RunPlan, planned: list[PlannedSample], runner: RequestRunner, writer: SampleWriter
) -> dict[str, AdaptiveReport]:
    """Draw rounds of extra samples for the run's native, non-judged tasks; each task's report by name."""
    target = plan.config.sampling.target_sem
    if target is None:
        return {}
    rule = AdaptiveRule(target, plan.config.sampling.max_samples)
    # judged tasks keep their first N; a greedy task's samples are one draw, which more samples cannot move
    tasks = [t for t in plan.tasks if not isinstance(t.task, JudgeTask) and t.sampling.temperature > 0]
    drawn: dict[tuple[str, int], int] = {}
    prompts: dict[tuple[str, int], PlannedSample] = {}
    for item in planned:
        key = (item.task_plan.task.name, item.doc_index)
        drawn[key] = drawn.get(key, 0) + 1
        prompts.setdefault(key, item)
    reports = {t.task.name: _report(t, plan) for t in tasks}
    active = list(tasks)
    while active:
        extra: list[PlannedSample] = []
        for task_plan in list(active):
            more = _next_round(task_plan, reports[task_plan.task.name], writer, rule, drawn, prompts, plan)
            if more is None:
                active.remove(task_plan)
            extra += more or []
        if not extra:
            break
        writer.add_planned(extra)
        runner.run([p.request for p in extra], label="adaptive N", on_completion=writer.add)
        writer.drain()
    for task_plan in tasks:
        report = reports[task_plan.task.name]
        report.samples_per_question = {
            s.doc_id: drawn[(task_plan.task.name, i)] for i, s in enumerate(task_plan.samples)
        }
        log.info(
            "%s: adaptive N stopped (%s) after %d round(s)", task_plan.task.name, report.stop, report.rounds
        )
    return reports


def _sort_key(sem: float) -> float:
    return float("-inf") if math.isnan(sem) else sem


def _report(task_plan: TaskPlan, plan: RunPlan) -> AdaptiveReport:
    sampling = plan.config.sampling
    return AdaptiveReport(
        task_plan.task.metrics[0].key,
        sampling.target_sem or 0.0,
        sampling.max_samples,
        plan.config.num_samples,
    )


def _next_round(
    task_plan: TaskPlan,
    report: AdaptiveReport,
    writer: SampleWriter,
    rule: AdaptiveRule,
    drawn: dict[tuple[str, int], int],
    prompts: dict[tuple[str, int], PlannedSample],
    plan: RunPlan,
) -> list[PlannedSample] | None:
    """This task's extra samples for the next round; None once it stops (the report says why)."""
    name = task_plan.task.name
    index_of = {s.doc_id: i for i, s in enumerate(task_plan.samples)}
    values: dict[str, dict[int, list[float]]] = {
        m.key: {i: [] for i in range(len(task_plan.samples))} for m in task_plan.task.metrics
    }
    weights: dict[str, dict[int, float]] = {key: {} for key in values}  # a question's weight in the mean
    for record in writer.task_records(name):
        for key, score in record.scores.items():
            if record.error is None and key in values:
                values[key][index_of[record.doc_id]].append(score)
                weights[key][index_of[record.doc_id]] = record.weights[key]
    # The task's error bar is its widest one: the metric with the largest SEM decides the round.
    records = writer.task_records(name)
    drawn_here = {i: drawn[(name, i)] for i in range(len(task_plan.samples))}
    allocations = {
        key: allocate(
            per_question,
            rule,
            summarize(scored_items(records, key), 0).sem,
            drawn=drawn_here,
            weights=weights[key],
        )
        for key, per_question in values.items()
    }
    report.metric = max(allocations, key=lambda key: _sort_key(allocations[key].sem))
    allocation = allocations[report.metric]
    report.sem_by_round.append(allocation.sem)
    report.floor_sem = allocation.floor_sem
    if allocation.stop is not None:
        report.stop = allocation.stop.value
        return None
    report.rounds += 1
    extra = []
    for doc_index, count in sorted(allocation.extra.items()):
        first = drawn[(name, doc_index)]
        first_sample = prompts[(name, doc_index)]
        source = first_sample.request
        for sample_index in range(first, first + count):
            seed = plan.config.sampling.seed + sample_index
            request = sample_request(plan, source.prompt, source.sampling, seed, sample_index, source.kind)
            extra.append(PlannedSample(task_plan, doc_index, request, first_sample.prompt_hash))
        drawn[(name, doc_index)] = first + count
    return extra
