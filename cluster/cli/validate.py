"""`rayeval validate FILE`: check a YAML run config and name every bad field, loading nothing heavy."""

from __future__ import annotations

import argparse

from evaluators.errors import EvalInputError


def add_parser(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser("validate", help="check a YAML run config and name every bad field")
    v.set_defaults(handler=cmd_validate)
    v.add_argument("config", metavar="FILE")


def cmd_validate(args: argparse.Namespace) -> int:
    """Check a config without loading data or starting anything: its fields, task names, the model, the
    judge model, and that local data paths and task folders exist."""
    from cluster.config import build_config, load_config_file
    from cluster.models import resolve_model
    from cluster.plan import lm_eval_catalog
    from evaluators.data import check_source
    from evaluators.lm_eval_tasks import resolve_task_name
    from evaluators.tasks.registry import TASKS

    config = build_config(load_config_file(args.config), {}, args.config)
    catalog = lm_eval_catalog(config.lm_eval.include_path)
    for task in config.tasks:
        resolved = resolve_task_name(task.name, TASKS, catalog)
        for path in (task.data_path, task.fewshot_path):
            if path and resolved.source == "lm_eval":
                raise EvalInputError(
                    f"{args.config}: task '{task.name}' is an lm-eval task, so data_path / fewshot_path do not "
                    "apply (its task YAML names its data). Remove them, or give a task folder with --include-path."
                )
            if path:
                check_source(path, task.name)
    resolve_model(
        config.model.path, materialise=False, label=f"{args.config}: model.path {config.model.path}"
    )
    if config.judge.kind == "local":
        resolve_model(
            config.judge.target, materialise=False, label=f"{args.config}: judge.model {config.judge.model}"
        )
    names = ", ".join(t.name + ("" if t.enabled else " (disabled)") for t in config.tasks)
    print(
        f"{args.config} is valid: tasks {names}; {config.cluster.replicas} replica(s); N={config.num_samples}"
    )
    return 0
