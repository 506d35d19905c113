"""`rayeval tasks`: the built-in tasks with their data and metrics, or lm-eval's task zoo."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    tasks = sub.add_parser("tasks", help="list the tasks with their data sources and metrics")
    tasks.set_defaults(handler=cmd_tasks)
    tasks.add_argument(
        "--lm-eval",
        nargs="?",
        const="",
        metavar="SUBSTRING",
        help="list lm-eval's tasks, groups and tags instead (those containing SUBSTRING)",
    )
    tasks.add_argument(
        "--include-path", action="append", metavar="DIR", help="with --lm-eval: extra task folders"
    )


def cmd_tasks(args: argparse.Namespace) -> int:
    from evaluators.tasks.registry import all_tasks

    if args.lm_eval is not None:
        from cluster.plan import lm_eval_catalog

        names = [n for n in lm_eval_catalog(args.include_path or []).manager.all_tasks if args.lm_eval in n]
        print("\n".join(names))
        print(f"({len(names)} lm-eval tasks, groups and tags; run any with --tasks NAME)", file=sys.stderr)
        return 0

    for task in all_tasks():
        metrics = ", ".join(m.key for m in task.metrics)
        print(f"{task.name} (v{task.version}): {task.description}")
        print(f"    data:    {task.source.description}")
        print(f"    fields:  {', '.join(task.source.required_fields)}")
        print(f"    metrics: {metrics}")
        print(f"    defaults: max_tokens={task.defaults.max_tokens} num_fewshot={task.defaults.num_fewshot}")
    print("\nlm-eval's task zoo runs too: `rayeval tasks --lm-eval [SUBSTRING]` lists it.")
    return 0
