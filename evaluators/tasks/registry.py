"""Name → task lookup, with close-match suggestions for typos."""

from __future__ import annotations

import difflib

from evaluators.errors import EvalInputError
from evaluators.judging.tasks import JUDGE_TASKS
from evaluators.tasks.base import Task
from evaluators.tasks.gsm8k import GSM8K
from evaluators.tasks.ifeval import IFEval

TASKS: dict[str, type[Task]] = {task.name: task for task in (IFEval, GSM8K)} | JUDGE_TASKS


def get_task(name: str) -> Task:
    try:
        return TASKS[name]()
    except KeyError:
        close = difflib.get_close_matches(name, TASKS, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise EvalInputError(
            f"Unknown task '{name}'.{hint} Known tasks: {', '.join(sorted(TASKS))} "
            "(`rayeval tasks` lists them with their data sources)."
        ) from None


def all_tasks() -> list[Task]:
    return [TASKS[name]() for name in sorted(TASKS)]
