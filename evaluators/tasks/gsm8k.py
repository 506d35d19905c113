"""GSM8K grade-school math, prompted and scored exactly like lm-eval's `gsm8k` task (v3)."""

from __future__ import annotations

from evaluators.data import load_rows
from evaluators.errors import DataError
from evaluators.tasks.base import (
    DataSourceInfo,
    MetricSpec,
    MetricValue,
    Prompt,
    Sample,
    Task,
    TaskDefaults,
)

HUB = "hf://openai/gsm8k:main"
STRICT_PATTERN = r"#### (\-?[0-9\.\,]+)"
FLEXIBLE_PATTERN = r"(-?[$0-9.,]{2,})|(-?[0-9]+)"
IGNORED = [",", "\\$", "(?s).*#### ", "\\.$"]


class GSM8K(Task):
    name = "gsm8k"
    version = "3.0"
    description = "Grade-school math word problems; exact match on the final number (strict and flexible)"
    metrics = (
        MetricSpec("exact_match", "strict-match"),
        MetricSpec("exact_match", "flexible-extract"),
    )
    defaults = TaskDefaults(max_tokens=256, num_fewshot=0, stop=("Question:", "</s>", "<|im_end|>"))
    source = DataSourceInfo(
        description=f"--data-path (JSONL/Parquet of the test split), else {HUB}",
        required_fields=("question", "answer"),
    )

    def load_samples(self, data_path: str | None) -> list[Sample]:
        rows = load_rows(data_path or HUB, self.name, self.source.required_fields, split="test")
        return [Sample(i, row) for i, row in enumerate(rows)]

    def load_fewshot(self, data_path: str | None) -> list[Sample]:
        if data_path is None:
            raise DataError(
                "Task 'gsm8k': few-shot examples come from the train split, and no `fewshot_path` was given. "
                "Set `fewshot_path` in the task's config to a local train.jsonl, or use --num-fewshot 0."
            )
        rows = load_rows(data_path, self.name, self.source.required_fields, split="train")
        return [Sample(i, row) for i, row in enumerate(rows)]

    def build_prompt(self, sample: Sample, fewshot: list[Sample]) -> Prompt:
        shots = "".join(f"{_question(s)} {s.doc['answer']}\n\n" for s in fewshot)
        text = shots + _question(sample)
        return Prompt.user_turn(text)

    def target(self, sample: Sample) -> str:
        return str(sample.doc["answer"])

    def score(self, sample: Sample, output: str) -> dict[str, MetricValue]:
        from lm_eval.api.metrics import exact_match_hf_evaluate
        from lm_eval.filters.extraction import RegexFilter

        scores: dict[str, MetricValue] = {}
        for metric, regex in zip(
            self.metrics, (RegexFilter(STRICT_PATTERN), RegexFilter(FLEXIBLE_PATTERN, -1)), strict=True
        ):
            extracted = list(regex.apply([[output]], [sample.doc]))[0][0]
            match = exact_match_hf_evaluate(
                predictions=[extracted],
                references=[self.target(sample)],
                regexes_to_ignore=IGNORED,
                ignore_case=True,
                ignore_punctuation=False,
            )["exact_match"]
            scores[metric.key] = MetricValue(float(match))
        return scores


def _question(sample: Sample) -> str:
    return f"Question: {sample.doc['question']}\nAnswer:"
