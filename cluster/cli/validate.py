"""`rayeval validate FILE`: check a YAML run config and name every bad field, loading nothing heavy."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from evaluators.errors import EvalInputError

if TYPE_CHECKING:
    from cluster.config import RunConfig


def add_parser(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser(
        "validate",
        help="check a YAML run config and name every bad field",
        description="Check a run config without loading data or starting anything: its fields (every bad one "
        "named at once), task names, data paths and task folders, the model and its context length, a LoRA "
        "adapter against the model, and whether judged tasks have the judge they need. What depends on the "
        "machine (cores, memory, GPUs, the cluster) is checked when the run starts, or by `rayeval run "
        "--config FILE --dry-run`.",
    )
    v.set_defaults(handler=cmd_validate)
    v.add_argument("config", metavar="FILE")


def cmd_validate(args: argparse.Namespace) -> int:
    from cluster.config import build_config, load_config_file

    config = build_config(load_config_file(args.config), {}, args.config)
    problems = []
    for check in _checks(config, args.config):
        try:
            check()
        except EvalInputError as exc:
            problems.append(str(exc))
    problems = list(dict.fromkeys(problems))  # one task folder missing is one problem, however many tasks
    if len(problems) == 1:
        raise EvalInputError(problems[0])
    if problems:  # one paragraph, as every error: the problems numbered
        numbered = " ".join(f"({i}) {p}" for i, p in enumerate(problems, 1))
        raise EvalInputError(f"{args.config} has {len(problems)} problems: {numbered}")
    names = ", ".join(t.name + ("" if t.enabled else " (disabled)") for t in config.tasks)
    print(
        f"{args.config} is valid: tasks {names}; {config.cluster.replicas} replica(s); N={config.num_samples}"
    )
    return 0


def _checks(config: RunConfig, file: str) -> list[Callable[[], None]]:
    """Each check of a valid config, independent of the others, so every problem is named at once."""
    judged: list[str] = []  # filled by the task checks, read by the judge rule (last)

    def judge_model() -> None:
        from cluster.models import resolve_model

        if config.judge.kind == "local":
            label = f"{file}: judge.model {config.judge.model}"
            resolve_model(config.judge.target, materialise=False, label=label)

    def judge_rule() -> None:
        from cluster.judging import check_judge_settings

        check_judge_settings(config, judged)

    tasks = [lambda task=task: _check_task(config, file, task, judged) for task in config.tasks]
    return [*tasks, lambda: _check_model(config, file), judge_model, judge_rule]


def _check_task(config: RunConfig, file: str, task, judged: list[str]) -> None:  # noqa: ANN001
    from cluster.plan import lm_eval_catalog
    from evaluators.data import check_source
    from evaluators.judging.base import JudgeTask
    from evaluators.lm_eval_tasks import resolve_task_name
    from evaluators.tasks.registry import TASKS

    resolved = resolve_task_name(task.name, TASKS, lm_eval_catalog(config.lm_eval.include_path))
    if task.enabled and resolved.source == "native" and issubclass(TASKS[resolved.name], JudgeTask):
        judged.append(resolved.name)
    for path in (task.data_path, task.fewshot_path):
        if path and resolved.source == "lm_eval":
            raise EvalInputError(
                f"{file}: task '{task.name}' is an lm-eval task, so data_path / fewshot_path do not apply (its "
                "task YAML names its data). Remove them, or give a task folder with --include-path."
            )
        if path:
            check_source(path, task.name)


def _check_model(config: RunConfig, file: str) -> None:
    from cluster.models import check_context_length, load_adapter, resolve_model

    model = resolve_model(
        config.model.path, materialise=False, label=f"{file}: model.path {config.model.path}"
    )
    if config.model.is_endpoint:
        return
    check_context_length(model, config.model.max_model_len)
    if config.model.lora is not None:
        load_adapter(config.model.lora, Path(model.path), config.model.max_lora_rank)
