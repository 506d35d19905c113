"""lm-eval tasks inside a rayeval run: lm-eval builds the requests and computes the metrics, our replicas answer.

Each task is loaded on its own, so one whose dataset cannot be had fails alone and the others still run.
Tasks that select their documents alike (a limit, a test_range applied to each leaf task, as OpenCompass
applies it to each dataset) go to lm-eval's `simple_evaluate` together, so all their requests of one type reach
the dispatcher as one batch. With N > 1 samples, generate_until tasks that sample are evaluated N times: the
first round generates all N samples of every prompt in one dispatch, later rounds read theirs from the result
store. A task whose generations are greedy runs once: its N samples would be one draw.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cluster.config import RunConfig
from cluster.errors import ClusterError
from cluster.lm_eval.backend import RayEvalLM
from cluster.plan import LmEvalTaskPlan
from cluster.run import RequestRunner
from evaluators.lm_eval_tasks import (
    ExecutionInfo,
    LmEvalCatalog,
    LmEvalTaskResult,
    LmEvalTaskUnavailable,
    LoadedLmEvalTask,
    describe_leaf,
    records_from_round,
    summarize_lm_eval_group,
    summarize_lm_eval_task,
)
from evaluators.ranges import DatasetRange
from evaluators.records import SampleRecord
from evaluators.report import TaskSummary, greedy_note, unavailable_task
from evaluators.sentence_splitting import offline_loaded_checkers

log = logging.getLogger(__name__)

LM_EVAL_DEFAULT_SEEDS = (0, 1234, 1234, 1234)  # lm_eval's --seed default: python, numpy, torch, few-shot


@dataclass
class LmEvalRunOutput:
    summaries: list[TaskSummary] = field(default_factory=list)
    records: dict[str, list[SampleRecord]] = field(default_factory=dict)
    group_rounds: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # lm-eval's group entries
    group_subtasks: dict[str, list[str]] = field(default_factory=dict)
    sampled: set[str] = field(default_factory=set)  # leaf tasks whose generations sample (temperature > 0)


def lm_eval_seeds(seed: int) -> tuple[int, int, int, int]:
    """Our --seed as lm_eval's --seed: the default matches lm-eval's default, another S sets all four to S."""
    return LM_EVAL_DEFAULT_SEEDS if seed == 1234 else (seed, seed, seed, seed)


def run_lm_eval_tasks(
    config: RunConfig, catalog: LmEvalCatalog, plans: list[LmEvalTaskPlan], runner: RequestRunner
) -> LmEvalRunOutput:
    output = LmEvalRunOutput()
    loaded: dict[str, LoadedLmEvalTask] = {}
    for plan in plans:
        try:
            loaded[plan.name] = catalog.load(plan.name)
        except LmEvalTaskUnavailable as exc:
            log.error("%s", exc)
            output.summaries.append(unavailable_task(plan.name, "lm-eval", str(exc)))
            continue
        if (empty := _selects_nothing(plan, loaded[plan.name])) is not None:
            log.error("%s", empty)
            output.summaries.append(unavailable_task(plan.name, "lm-eval", empty))
            del loaded[plan.name]
    offline_loaded_checkers()  # a loaded task scored by lm-eval's IFEval checkers gets the offline Punkt
    n = config.num_samples
    results: dict[str, LmEvalTaskResult] = {}
    for round_index in range(n):
        this_round = [
            p
            for p in plans
            if p.name in loaded and (round_index == 0 or output.sampled & loaded[p.name].leaves.keys())
        ]
        if not this_round:
            break
        for same_limit in _by_selection(this_round):
            try:
                tasks = {
                    p.name: loaded[p.name] if round_index == 0 else catalog.load(p.name) for p in same_limit
                }
                _evaluate_round(config, catalog, same_limit, tasks, round_index, runner, results, output)
            except (ClusterError, KeyboardInterrupt):
                raise
            except Exception as exc:  # noqa: BLE001 - lm-eval failing on some tasks must not lose the others
                log.exception("lm-eval failed on %s", ", ".join(p.name for p in same_limit))
                for plan in same_limit:
                    _drop(plan.name, loaded, results, output)
                    reason = f"lm-eval failed while evaluating it: {type(exc).__name__}: {exc}"
                    output.summaries.append(unavailable_task(plan.name, "lm-eval", reason))
    leaves = {}
    for name, result in results.items():
        runs = n if name in output.sampled else 1
        leaves[name] = summarize_lm_eval_task(result, output.records.get(name, []), runs)
        if result.output_type == "generate_until" and runs < n:
            leaves[name].one_draw = greedy_note(n)
        output.summaries.append(leaves[name])
    for group, rounds in output.group_rounds.items():
        under = _leaves_under(group, output.group_subtasks)
        output.summaries.append(summarize_lm_eval_group(group, rounds, under, leaves))
    return output


def _leaves_under(group: str, subtasks: dict[str, list[str]]) -> list[str]:
    """The leaf tasks under a group, through its subgroups (MMLU's children are mmlu_stem and the others)."""
    leaves = []
    for child in subtasks.get(group, []):
        leaves += _leaves_under(child, subtasks) if child in subtasks else [child]
    return leaves


def _drop(
    name: str,
    loaded: dict[str, LoadedLmEvalTask],
    results: dict[str, LmEvalTaskResult],
    output: LmEvalRunOutput,
) -> None:
    """Forget a task that failed part way: no half-computed numbers are reported for it."""
    task = loaded.pop(name, None)
    output.group_rounds.pop(name, None)
    for leaf in task.leaves if task is not None else []:
        results.pop(leaf, None)
        output.records.pop(leaf, None)


def _by_selection(plans: list[LmEvalTaskPlan]) -> Iterable[list[LmEvalTaskPlan]]:
    alike: dict[tuple[int | None, str | None], list[LmEvalTaskPlan]] = {}
    for plan in plans:
        alike.setdefault(plan.selection, []).append(plan)
    return alike.values()


def _documents(
    plans: list[LmEvalTaskPlan], tasks: dict[str, LoadedLmEvalTask]
) -> tuple[int | None, dict[str, list[int]] | None]:
    """lm-eval's `limit` or `samples` for tasks that select alike: a test_range picks each leaf task's
    documents by its own size (then the limit applies to those), as lm-eval's `samples` takes them: in
    dataset order."""
    limit, test_range = plans[0].selection
    if test_range is None:
        return limit, None
    chosen = DatasetRange.parse(test_range)
    return None, {
        leaf_name: sorted(set(chosen.indices(len(leaf.eval_docs))))[:limit]
        for plan in plans
        for leaf_name, leaf in tasks[plan.name].leaves.items()
    }


def _selects_nothing(plan: LmEvalTaskPlan, task: LoadedLmEvalTask) -> str | None:
    """Why a task's test_range cannot run (it selects none of a subtask's documents, which lm-eval's
    `samples` would read as every document), or None."""
    if plan.test_range is None:
        return None
    chosen = DatasetRange.parse(plan.test_range)
    for leaf_name, leaf in task.leaves.items():
        if not chosen.indices(len(leaf.eval_docs)):
            return (
                f"--test-range {plan.test_range} selects none of {leaf_name}'s {len(leaf.eval_docs)} documents: "
                "give a slice that selects some of every subtask, e.g. [:min(100, len(index_list)//2)]"
            )
    return None


def _evaluate_round(
    config: RunConfig,
    catalog: LmEvalCatalog,
    plans: list[LmEvalTaskPlan],
    tasks: dict[str, LoadedLmEvalTask],
    round_index: int,
    runner: RequestRunner,
    results: dict[str, LmEvalTaskResult],
    output: LmEvalRunOutput,
) -> None:
    from lm_eval.utils import simple_parse_args_string

    options = config.lm_eval
    global_gen_kwargs = simple_parse_args_string(options.gen_kwargs) if options.gen_kwargs else {}
    for plan in plans:
        for leaf in tasks[plan.name].leaves.values():
            _apply_task_overrides(leaf, plan, global_gen_kwargs)
    lm = RayEvalLM(
        runner=runner,
        max_gen_toks=options.max_gen_toks,
        seed=config.sampling.seed,
        num_samples=config.num_samples,
        sample_index=round_index,
    )
    limit, samples = _documents(plans, tasks)
    objects = [obj for plan in plans for obj in tasks[plan.name].objects]
    evaluated = _simple_evaluate(config, catalog, objects, limit, samples, lm)
    for group in evaluated.get("groups", {}):  # groups with an aggregate (MMLU's overall accuracy)
        output.group_rounds.setdefault(group, []).append(dict(evaluated["results"][group]))
        output.group_subtasks[group] = list(evaluated.get("group_subtasks", {}).get(group, []))
    for plan in plans:
        for leaf_name, leaf in tasks[plan.name].leaves.items():
            if round_index > 0 and leaf_name not in output.sampled:
                continue  # evaluated again only as part of its group: one draw, kept from the first round
            described = describe_leaf(leaf_name, leaf, evaluated)
            if leaf_name in results:
                results[leaf_name].rounds.extend(described.rounds)
            else:
                results[leaf_name] = described
            executions = _executions(lm, leaf_name, samples.get(leaf_name) if samples else None)
            if leaf_name in lm.sampled_tasks:
                output.sampled.add(leaf_name)
            output.records.setdefault(leaf_name, []).extend(
                records_from_round(
                    leaf_name, evaluated["samples"].get(leaf_name, []), round_index, executions
                )
            )


def _simple_evaluate(
    config: RunConfig,
    catalog: LmEvalCatalog,
    task_objects: list[Any],
    limit: int | None,
    samples: dict[str, list[int]] | None,
    lm: RayEvalLM,
) -> dict[str, Any]:
    """lm-eval's own evaluation loop over the tasks, seeded and configured as `lm_eval`'s flags would."""
    from lm_eval import simple_evaluate

    options = config.lm_eval
    python_seed, numpy_seed, torch_seed, fewshot_seed = lm_eval_seeds(config.sampling.seed)
    evaluated = simple_evaluate(
        model=lm,
        tasks=task_objects,
        task_manager=catalog.manager,
        limit=limit,
        samples=samples,
        bootstrap_iters=options.bootstrap_iters,
        log_samples=True,
        system_instruction=options.system_instruction,
        apply_chat_template=options.apply_chat_template,
        fewshot_as_multiturn=(
            options.apply_chat_template
            if options.fewshot_as_multiturn is None
            else options.fewshot_as_multiturn
        ),
        random_seed=python_seed,
        numpy_random_seed=numpy_seed,
        torch_random_seed=torch_seed,
        fewshot_random_seed=fewshot_seed,
        confirm_run_unsafe_code=options.confirm_run_unsafe_code,
    )
    assert evaluated is not None  # rank 0 of a single process always gets the results
    return evaluated


def _apply_task_overrides(leaf: Any, plan: LmEvalTaskPlan, global_gen_kwargs: dict[str, Any]) -> None:
    """What `lm_eval` does with --num_fewshot and --gen_kwargs, plus our per-task options on top."""
    if plan.num_fewshot is not None:
        if leaf.get_config("num_fewshot") == 0:
            log.info(
                "%s: its config fixes num_fewshot to 0; --num-fewshot is ignored (as lm-eval does)", plan.name
            )
        else:
            leaf.set_config(key="num_fewshot", value=plan.num_fewshot)
    if leaf.get_config("output_type") != "generate_until":
        return
    per_task: dict[str, Any] = {}
    if plan.options.temperature is not None:
        per_task |= {"temperature": plan.options.temperature, "do_sample": plan.options.temperature > 0}
    if plan.options.top_p is not None:
        per_task["top_p"] = plan.options.top_p
    if plan.options.top_k is not None:
        per_task["top_k"] = plan.options.top_k
    if plan.options.repetition_penalty is not None:
        per_task["repetition_penalty"] = plan.options.repetition_penalty
    if plan.options.max_tokens is not None:
        per_task["max_gen_toks"] = plan.options.max_tokens
    for overrides in (global_gen_kwargs, per_task):
        if overrides:
            leaf.set_config(key="generation_kwargs", value=dict(overrides), update=True)


def _executions(lm: RayEvalLM, task: str, chosen: list[int] | None) -> dict[int, ExecutionInfo]:
    """Each document's requests, by its index in the task's dataset: lm-eval numbers the requests of a
    `samples` selection by position in it (`chosen`), its logged samples by the dataset's index."""
    executions = {}
    for (name, doc_id), outcome in lm.outcomes.items():
        if name != task:
            continue
        completions = outcome.completions
        executions[chosen[doc_id] if chosen is not None else doc_id] = ExecutionInfo(
            request_ids=tuple(dict.fromkeys(c.request_id for c in completions)),
            replicas=tuple(dict.fromkeys(c.replica for c in completions if c.replica)),
            latency_s=max((c.latency_s for c in completions), default=0.0),
            prompt_tokens=sum(c.prompt_tokens for c in completions),
            output_tokens=sum(c.output_tokens for c in completions),
            finish_reason=completions[0].finish_reason if len(completions) == 1 else None,
            error=outcome.error,
        )
    return executions
