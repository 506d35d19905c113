"""IFEval scored with lm-eval's reference checkers on hand-made responses, offline."""

from __future__ import annotations

import pytest

from evaluators.sentence_splitting import load_ifeval_utils, offline_punkt
from evaluators.tasks.base import Sample
from evaluators.tasks.ifeval import IFEval


def doc(instructions: list[str], kwargs: list[dict]) -> Sample:
    return Sample(0, {"key": 1, "prompt": "p", "instruction_id_list": instructions, "kwargs": kwargs})


def score(sample: Sample, output: str) -> dict[str, tuple[float, float]]:
    return {k: (v.value, v.weight) for k, v in IFEval().score(sample, output).items()}


def test_all_instructions_followed():
    sample = doc(
        ["punctuation:no_comma", "length_constraints:number_sentences"],
        [{}, {"relation": "less than", "num_sentences": 3}],
    )
    result = score(sample, "Hello there. Goodbye now.")
    assert result["prompt_level_strict_acc,none"] == (1.0, 1.0)
    assert result["inst_level_strict_acc,none"] == (2.0, 2.0)


def test_instruction_level_counts_each_instruction():
    sample = doc(
        ["punctuation:no_comma", "length_constraints:number_sentences"],
        [{}, {"relation": "less than", "num_sentences": 2}],
    )
    result = score(sample, "One sentence. Two sentences. Three sentences.")
    assert result["prompt_level_strict_acc,none"] == (0.0, 1.0)
    assert result["inst_level_strict_acc,none"] == (1.0, 2.0)


def test_loose_forgives_a_chatty_last_line():
    sample = doc(["punctuation:no_comma"], [{}])
    result = score(sample, "No commas in the answer itself\nHope this helps, friend")
    assert result["prompt_level_strict_acc,none"] == (0.0, 1.0)
    assert result["prompt_level_loose_acc,none"] == (1.0, 1.0)


def test_word_tokenize_based_checker_works_offline():
    sample = doc(
        ["change_case:capital_word_frequency"], [{"capital_relation": "at least", "capital_frequency": 2}]
    )
    assert score(sample, "THIS is VERY loud.")["prompt_level_strict_acc,none"] == (1.0, 1.0)
    assert score(sample, "only ONE here.")["prompt_level_strict_acc,none"] == (0.0, 1.0)


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("Dr. Smith went home. He was tired.", 2),
        ("It cost $3.50 at the U.S. store. Then we left!", 2),
        ("One. Two? Three!", 3),
    ],
)
def test_offline_punkt_splits_like_nltk_english(text, sentences):
    assert len(offline_punkt().tokenize(text)) == sentences
    assert load_ifeval_utils() is load_ifeval_utils()


def test_packaged_data_has_all_541_prompts():
    samples = IFEval().load_samples(None)
    assert len(samples) == 541
    assert samples[0].doc["instruction_id_list"]
