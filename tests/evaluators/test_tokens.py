"""A run's token counts from its records: each request once, reused outputs in the totals only, and the
tokens per second over the generation seconds of what this run generated."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from evaluators.records import SampleRecord
from evaluators.report import render_table, summarize_task
from evaluators.tasks.gsm8k import GSM8K
from evaluators.tokens import TokenCounts, run_tokens


def record(
    task: str, doc: int, sample: int, request: str, replica: str, prompt: int, output: int
) -> SampleRecord:
    return SampleRecord(task, doc, sample, request, "p", "o", "t", replica=replica, prompt_tokens=prompt,
                        output_tokens=output)  # fmt: skip


RECORDS = [
    # gsm8k: question 0's two samples generated now on two replicas, question 1 read back from the store
    record("gsm8k", 0, 0, "g00", "replica-0", 10, 100),
    record("gsm8k", 0, 1, "g01", "replica-1", 10, 50),
    record("gsm8k", 1, 0, "g10", "replica-0", 20, 7),
    # ifeval, greedy: N = 2 asked is one draw, two records of one request, generated now
    record("ifeval", 0, 0, "i0", "replica-1", 30, 40),
    record("ifeval", 0, 1, "i0", "replica-1", 30, 40),
    # an lm-eval document: its two choices' requests in one record, on both replicas, generated now
    record("arc_easy", 0, 0, "a0,a1", "replica-0,replica-1", 24, 2),
]
# each request generated now, with its own tokens (the lm-eval document's two split its 24 and 2)
GENERATED = {"g00": TokenCounts(10, 100), "g01": TokenCounts(10, 50), "i0": TokenCounts(30, 40),
             "a0": TokenCounts(12, 1), "a1": TokenCounts(12, 1)}  # fmt: skip


def test_each_request_counts_once_and_read_back_outputs_only_in_the_totals():
    tokens = run_tokens(RECORDS, GENERATED, generation_s=4.0)
    assert tokens.per_task == {
        "gsm8k": TokenCounts(40, 157),
        "ifeval": TokenCounts(30, 40),  # one request, not two
        "arc_easy": TokenCounts(24, 2),
    }
    assert tokens.total == TokenCounts(94, 199)
    assert tokens.generated == TokenCounts(74, 192)  # g10 came from the store
    assert tokens.per_replica == {
        "replica-0": TokenCounts(10, 100),
        "replica-1": TokenCounts(40, 90),
        "replica-0,replica-1": TokenCounts(24, 2),
    }
    assert tokens.output_tokens_per_s == pytest.approx(192 / 4.0)
    body = tokens.to_json()
    assert body["output_tokens"] == 199 and body["generated"] == {"prompt_tokens": 74, "output_tokens": 192}
    assert body["output_tokens_per_s"] == 48.0 and body["generation_s"] == 4.0
    assert body["per_replica"]["replica-1"] == {"prompt_tokens": 40, "output_tokens": 90}
    assert "a resumed run's outputs read back from its store count in the totals only" in body["counted"]
    assert tokens.footer() == (
        "tokens: 94 prompt, 199 output; generated in this run: 192 output tokens in 4.0 s of generation "
        "= 48.0 tokens/s (the rest read back from the run's store)"
    )


def test_an_lm_eval_document_resumed_part_way_counts_only_its_requests_generated_now():
    """Its record holds the tokens of all its requests (400 prompt, 4 output over a, b, c, d); a run that
    generated only `a` (the others read back from its store) generated a's tokens alone. Counting the whole
    record once said 450 prompt and 204 output tokens generated, 102 tokens/s where 100.5 is right."""
    records = [record("mmlu", 0, 0, "a,b,c,d", "replica-0", 400, 4),
               record("gsm8k", 0, 0, "g", "replica-0", 50, 200)]  # fmt: skip
    generated = {"a": TokenCounts(100, 1), "g": TokenCounts(50, 200)}
    tokens = run_tokens(records, generated, generation_s=2.0)
    assert tokens.total == TokenCounts(450, 204)
    assert tokens.generated == tokens.per_replica["replica-0"] == TokenCounts(150, 201)
    assert tokens.output_tokens_per_s == pytest.approx(100.5)


def test_a_run_that_generated_nothing_has_totals_but_no_tokens_per_second():
    tokens = run_tokens(RECORDS, {}, generation_s=0.0)
    assert tokens.total == TokenCounts(94, 199) and tokens.generated == TokenCounts()
    assert tokens.per_replica == {} and tokens.output_tokens_per_s is None
    assert tokens.to_json()["output_tokens_per_s"] is None
    assert tokens.footer() == "tokens: 94 prompt, 199 output; no output tokens generated in this run"


def test_the_footer_is_the_tables_last_line():
    records = [r for r in RECORDS if r.task == "gsm8k"]
    tokens = run_tokens(records, {"g00": TokenCounts(10, 100), "g01": TokenCounts(10, 50),
                                  "g10": TokenCounts(20, 7)}, generation_s=2.0)  # fmt: skip
    summary = summarize_task(GSM8K(), records, num_runs=2, num_fewshot=0, num_available=2)
    table = render_table([summary], tokens.footer())
    assert table.splitlines()[-1] == (
        "tokens: 40 prompt, 157 output; generated in this run: 157 output tokens in 2.0 s of generation "
        "= 78.5 tokens/s"
    )
    assert table == render_table([summary]) + tokens.footer() + "\n"


@given(output=st.integers(1, 10**8), seconds=st.floats(0.0005, 1e5, allow_nan=False))
@example(output=445, seconds=20.0)  # 22.25 exactly, rounded half to even: 22.2, half a last place away
def test_the_reported_rate_is_the_reported_tokens_over_the_reported_seconds(output: int, seconds: float):
    """What a reader recomputes from summary.json (generated output tokens over generation_s) agrees with its
    output_tokens_per_s to that figure's rounding (half its last place, and the float that holds it),
    however short the generation."""
    records = [record("t", 0, 0, "r", "replica-0", 1, output)]
    body = run_tokens(records, {"r": TokenCounts(1, output)}, generation_s=seconds).to_json()
    recomputed = body["generated"]["output_tokens"] / body["generation_s"]
    assert body["output_tokens_per_s"] == pytest.approx(recomputed, abs=0.05 + 1e-9, rel=1e-12)
