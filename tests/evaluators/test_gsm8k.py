"""GSM8K strict-match and flexible-extract, as lm-eval's gsm8k task scores them."""

from __future__ import annotations

import pytest

from evaluators.errors import DataError
from evaluators.tasks.base import Sample
from evaluators.tasks.gsm8k import GSM8K

ANSWER = "She sells 16 - 3 - 4 = 9 eggs.\nShe makes 9 * 2 = $18.\n#### 18"


def sample(answer: str = ANSWER) -> Sample:
    return Sample(0, {"question": "How much does she make?", "answer": answer})


@pytest.mark.parametrize(
    ("output", "strict", "flexible"),
    [
        ("9 * 2 = 18\n#### 18", 1.0, 1.0),
        ("#### 18.", 1.0, 1.0),  # trailing period is ignored
        ("#### $18", 0.0, 1.0),  # strict needs digits right after ####; flexible takes the last number
        ("The answer is 18.", 0.0, 1.0),
        ("She makes $18 a day, that is 1,8 tens. So 17", 0.0, 0.0),  # flexible takes the LAST number
        ("#### 1,800", 0.0, 0.0),
        ("I do not know", 0.0, 0.0),
    ],
)
def test_extraction(output, strict, flexible):
    scores = GSM8K().score(sample(), output)
    assert scores["exact_match,strict-match"].value == strict
    assert scores["exact_match,flexible-extract"].value == flexible


def test_commas_in_numbers_are_ignored_on_both_sides():
    scores = GSM8K().score(sample("so\n#### 1,800"), "#### 1800")
    assert scores["exact_match,strict-match"].value == 1.0


def test_prompt_matches_lm_eval_format():
    prompt = GSM8K().build_prompt(sample(), [Sample(1, {"question": "1+1?", "answer": "#### 2"})])
    assert prompt.text == "Question: 1+1?\nAnswer: #### 2\n\nQuestion: How much does she make?\nAnswer:"


def test_loads_the_shared_test_split(shared_gsm8k):
    samples = GSM8K().load_samples(str(shared_gsm8k))
    assert len(samples) == 1319
    assert samples[0].doc["answer"].endswith("#### 18")


def test_malformed_rows_are_named(tmp_path):
    bad = tmp_path / "test.jsonl"
    bad.write_text('{"question": "a", "answer": "#### 1"}\n{not json}\n')
    with pytest.raises(DataError, match=r"line 2 of .*test.jsonl is not valid JSON"):
        GSM8K().load_samples(str(bad))
    bad.write_text('{"question": "a", "answer": "#### 1"}\n{"question": "b"}\n')
    with pytest.raises(DataError, match=r"row 2 .* lacks the field\(s\) answer"):
        GSM8K().load_samples(str(bad))
    with pytest.raises(DataError, match="does not exist"):
        GSM8K().load_samples(str(tmp_path / "missing.jsonl"))


def test_fewshot_without_a_source_says_how_to_fix():
    with pytest.raises(DataError, match="fewshot_path"):
        GSM8K().load_fewshot(None)
