"""A judged sample whose judgments ask the judge the same prompt: the case where the model's output equals
the reference, so AlpacaEval's two orderings render one text. Plain Python: the samples' bookkeeping with the
real task and the real API judge backend's requests; the judge's answers are given by the test, as the
judge's dispatcher would deliver them (no server is asked)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from cluster.config.options import JudgeOptions
from cluster.judging.backends import ApiJudgeBackend
from cluster.judging.samples import JudgedSamples
from evaluators.judging.alpaca_eval import AlpacaEval
from evaluators.records import SampleRecord
from evaluators.tasks.base import Sample
from sharding.requests import Completion, GenerationRequest


def _judged_samples(folder: Path, task: AlpacaEval) -> tuple[JudgedSamples, list[GenerationRequest]]:
    backend = ApiJudgeBackend(JudgeOptions(model="openai:judge", base_url="http://127.0.0.1:9/v1"))
    judged = JudgedSamples(backend, None, 0.0, folder, [SimpleNamespace(task=task)])
    sent: list[GenerationRequest] = []
    judged.submit = sent.extend
    return judged, sent


def test_two_judgments_of_one_prompt_ask_it_once_and_both_take_its_answer(tmp_path):
    task = AlpacaEval()
    judged, sent = _judged_samples(tmp_path, task)
    sample = Sample(0, {"instruction": "Say hi", "output": "Hi!"})
    judged.add_output(task, sample, SampleRecord("alpaca_eval", 0, 0, "r0", "Say hi", "Hi!", "Hi!"))
    assert len(sent) == 1  # one prompt for both orderings, asked once
    judged.on_answer(Completion(sent[0].request_id, text="[[A]]"))
    # another sample with the same output arrives after the answer: it is scored from it, nothing is asked
    judged.add_output(task, sample, SampleRecord("alpaca_eval", 0, 1, "r1", "Say hi", "Hi!", "Hi!"))
    assert len(sent) == 1 and judged.unfinished == 0
    written = [json.loads(line) for line in (tmp_path / "alpaca_eval.jsonl").read_text().splitlines()]
    assert [(r["sample_index"], r["error"]) for r in written] == [(0, None), (1, None)]
    # "A" in both orderings: the model wins one and loses one, a tie
    assert all(r["verdicts"] == {"model_first": "A", "reference_first": "A"} for r in written)
    assert all(r["scores"]["win_rate,none"] == 0.5 for r in written)


def test_a_judgment_cut_at_the_token_limit_before_its_verdict_fails_as_truncated(tmp_path):
    """The judge's answer ended at max_tokens (finish_reason "length") with no verdict: JudgeTruncated, whose
    fix is a larger --judge-max-tokens; one that ended on its own without a verdict stays JudgeParseError."""
    task = AlpacaEval()
    judged, sent = _judged_samples(tmp_path, task)
    # (the first judgment's end, the second's): the second, unreadable, cut; ended; the first cut but read
    for index, (first_end, second_end) in enumerate(
        (("stop", "length"), ("stop", "stop"), ("length", "stop"))
    ):
        output = f"answer {index}"  # other than the reference: two prompts, one per ordering
        judged.add_output(task, Sample(index, {"instruction": "Say hi", "output": "Hi!"}),
                          SampleRecord("alpaca_eval", index, 0, f"r{index}", "Say hi", output, "Hi!"))  # fmt: skip
        first, second = sent[-2:]
        judged.on_answer(Completion(first.request_id, text="[[A]]", finish_reason=first_end))
        judged.on_answer(
            Completion(second.request_id, text="Let me think this through at", finish_reason=second_end)
        )
    written = [json.loads(line) for line in (tmp_path / "alpaca_eval.jsonl").read_text().splitlines()]
    assert (
        written[0]["error"].startswith("JudgeTruncated: judgment ")
        and "--judge-max-tokens" in written[0]["error"]
    )
    assert written[1]["error"].startswith("JudgeParseError: ")
    assert written[2]["error"].startswith("JudgeParseError: ")  # the cut answer is not the unreadable one
