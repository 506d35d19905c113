"""Which of a run's tasks a judge scores, whether the run has the judge they need, and what a local judge
adds to the cluster: its engine replicas and, on CPU, its share of the cores' thread-binding slots."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cluster.config import RunMode
from evaluators.errors import EvalInputError

if TYPE_CHECKING:
    from cluster.config import RunConfig
    from cluster.plan import RunPlan


def judged_task_names(plan: RunPlan) -> list[str]:
    from evaluators.judging.base import JudgeTask

    return [t.task.name for t in plan.tasks if isinstance(t.task, JudgeTask)]


def check_judge(plan: RunPlan) -> None:
    """Judged tasks need a judge unless the run only generates, and an API judge its key; say so before any
    engine starts."""
    judged = judged_task_names(plan)
    check_judge_settings(plan.config, judged)
    if judged and plan.config.mode is not RunMode.INFERENCE_ONLY and plan.config.judge.kind == "openai":
        from cluster.endpoints import ApiSettings, read_api_key

        read_api_key(ApiSettings.from_options(plan.config.judge))


def check_judge_settings(config: RunConfig, judged: list[str]) -> None:
    """The config's part of `check_judge` (what `rayeval validate` checks too): with `judged` tasks, a judge
    unless the run only generates; with --judge-only, a judge and judged tasks."""
    mode = config.mode
    if mode is RunMode.JUDGE_ONLY and config.judge.model is None:
        raise EvalInputError("--judge-only needs --judge local:PATH_OR_ID or --judge openai:MODEL.")
    if mode is RunMode.JUDGE_ONLY and not judged:
        raise EvalInputError(
            "--judge-only was given, but the run has no judged task (alpaca_eval, arena_hard, healthbench, "
            "writingbench). Pass --tasks with the judged tasks of that run."
        )
    if judged and mode is RunMode.FULL and config.judge.model is None:
        raise EvalInputError(
            f"Task(s) {', '.join(judged)} are scored by a judge model: pass --judge local:PATH_OR_ID (a judge on "
            "this cluster's engine replicas) or --judge openai:MODEL (an OpenAI-compatible API, key from "
            "$OPENAI_API_KEY), or --inference-only to generate now and judge later with --judge-only."
        )


def local_judge_replicas(plan: RunPlan) -> int:
    """Engine replicas a local judge adds to the cluster (0 for an API judge or a run that does not judge)."""
    if (
        plan.config.mode is RunMode.INFERENCE_ONLY
        or plan.config.judge.kind != "local"
        or not judged_task_names(plan)
    ):
        return 0
    return plan.config.judge.replicas


def core_slots(plan: RunPlan, judge: bool) -> tuple[int, int] | None:
    """CPU thread-binding slots when a local judge and the model's replicas run at once: the model's take the
    first slots, the judge's the next ones. None when either runs alone (it then has every core)."""
    judges = local_judge_replicas(plan)
    if plan.device != "cpu" or judges == 0 or plan.config.mode is RunMode.JUDGE_ONLY:
        return None
    replicas = plan.config.cluster.replicas
    return (replicas, replicas + judges) if judge else (0, replicas + judges)
