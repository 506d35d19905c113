"""The judged tasks by name."""

from __future__ import annotations

from evaluators.judging.alpaca_eval import AlpacaEval
from evaluators.judging.arena_hard import ArenaHard
from evaluators.judging.base import JudgeTask
from evaluators.judging.healthbench import HealthBench
from evaluators.judging.writingbench import WritingBench

JUDGE_TASKS: dict[str, type[JudgeTask]] = {
    task.name: task for task in (AlpacaEval, ArenaHard, HealthBench, WritingBench)
}
