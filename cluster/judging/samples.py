"""Judged tasks' samples: each output becomes judge requests, and the judge's answers a scored record.

Every output ends either scored or failed with its reason (generation failed, the judge call failed, the
verdict could not be parsed); none is dropped. Identical judge prompts (two greedy samples with the same
output) are asked once and the answer reaches every sample waiting on it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from cluster.judging.backends import JudgeBackend
from cluster.plan import TaskPlan
from evaluators.failures import FailureKind, is_judge_failure
from evaluators.judging.base import JudgedItem, JudgedSample, JudgeParseError, JudgeTask, TaskStatistic
from evaluators.reasoning import answer_part
from evaluators.records import SampleRecord
from evaluators.tasks.base import MetricValue, Sample
from sharding.requests import Completion, GenerationRequest, SamplingSpec

Submit = Callable[[Sequence[GenerationRequest]], None]
SampleKey = tuple[str, int, int]  # task, doc id, sample index


@dataclass
class _Waiting:
    task: JudgeTask
    sample: Sample
    record: SampleRecord
    request_of: dict[str, str]  # judgment key -> judge request id
    answers: dict[str, Completion] = field(default_factory=dict)


class JudgedSamples:
    def __init__(
        self,
        backend: JudgeBackend,
        judge_max_tokens: int | None,
        temperature: float,
        directory: Path,
        task_plans: list[TaskPlan],
        think_end_token: str | None = None,
    ) -> None:
        self.backend = backend
        self.think_end_token = think_end_token  # a reasoning model's outputs are judged on what follows it
        self.judge_max_tokens = judge_max_tokens
        self.temperature = temperature
        self.directory = directory
        self.submit: Submit = lambda requests: None
        self._lock = threading.Lock()
        self._waiting: dict[SampleKey, _Waiting] = {}
        self._waiters_of: dict[str, list[SampleKey]] = {}  # judge request id -> samples waiting on it
        self._answers: dict[str, Completion] = {}
        self.records: dict[SampleKey, SampleRecord] = {}
        directory.mkdir(parents=True, exist_ok=True)
        self._handles = {
            t.task.name: (directory / f"{t.task.name}.jsonl").open("w", encoding="utf-8") for t in task_plans
        }

    def add_output(self, task: JudgeTask, sample: Sample, record: SampleRecord) -> None:
        """A generated (or failed) output of a judged task; called from the generation thread."""
        judged = replace(record, judge=self.backend.identity.name)
        key: SampleKey = (record.task, record.doc_id, record.sample_index)
        if record.error is not None:
            with self._lock:
                self._finish(key, judged)
            return
        sampling = SamplingSpec(
            temperature=self.temperature, max_tokens=self.judge_max_tokens or task.judge_max_tokens
        )
        requests = {
            p.key: self.backend.make_request(p.messages, sampling)
            for p in task.judge_prompts(
                sample, answer_part(record.output, self.think_end_token, task.defaults.stop)
            )
        }
        waiting = _Waiting(task, sample, judged, {k: r.request_id for k, r in requests.items()})
        with self._lock:
            self._waiting[key] = waiting
            for judgment, request in requests.items():
                known = self._answers.get(request.request_id)
                if known is not None:
                    waiting.answers[judgment] = known
                else:
                    waiters = self._waiters_of.setdefault(request.request_id, [])
                    if key not in waiters:  # two judgments of one prompt (an output equal to the reference)
                        waiters.append(key)
            # each prompt asked once: its answer fills every judgment that asked it
            missing = list(
                {r.request_id: r for k, r in requests.items() if k not in waiting.answers}.values()
            )
            if not missing:
                self._score(key, waiting)
        self.submit(missing)

    def on_answer(self, completion: Completion) -> None:
        """A judge answer (or failure); called from the judge thread."""
        with self._lock:
            self._answers[completion.request_id] = completion
            for key in self._waiters_of.pop(completion.request_id, []):
                waiting = self._waiting[key]
                for judgment, request_id in waiting.request_of.items():
                    if request_id == completion.request_id:
                        waiting.answers[judgment] = completion
                if len(waiting.answers) == len(waiting.request_of):
                    self._score(key, waiting)

    @property
    def unfinished(self) -> int:
        with self._lock:
            return len(self._waiting)

    def _score(self, key: SampleKey, waiting: _Waiting) -> None:
        record = waiting.record
        record.judge_outputs = {k: c.text for k, c in sorted(waiting.answers.items()) if c.ok}
        failed = sorted((k, c) for k, c in waiting.answers.items() if not c.ok)
        if failed:
            judgment, completion = failed[0]
            reason = completion.error or "unknown"
            if not is_judge_failure(reason):
                reason = f"Judge{reason}"
            record.error = f"{reason} (judgment {judgment}; {len(failed)} of {len(waiting.answers)} failed)"
        else:
            try:
                judged = waiting.task.judge_score(
                    waiting.sample,
                    answer_part(record.output, self.think_end_token, waiting.task.defaults.stop),
                    {k: c.text for k, c in waiting.answers.items()},
                )
            except JudgeParseError as exc:
                answer = waiting.answers.get(exc.key)
                record.error = (  # the unreadable answer is one the judge's limit cut off
                    FailureKind.JUDGE_TRUNCATED.error(
                        f"judgment {exc.key} reached the judge's token limit (--judge-max-tokens, or a local judge's "
                        f"context, --judge-max-model-len) before its verdict: {exc}"
                    )
                    if answer is not None and answer.finish_reason == "length"
                    else FailureKind.JUDGE_PARSE.error(str(exc))
                )
            else:
                for metric, value in judged.scores.items():
                    record.scores[metric] = value.value / value.weight if value.weight else 0.0
                    record.weights[metric] = value.weight
                record.verdicts = judged.verdicts
                record.features = judged.features
        self._finish(key, record)

    def _finish(self, key: SampleKey, record: SampleRecord) -> None:
        self._waiting.pop(key, None)
        self.records[key] = record
        handle = self._handles[record.task]
        handle.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
        handle.flush()

    def task_records(self, task: str) -> list[SampleRecord]:
        with self._lock:
            return [r for (name, _, _), r in self.records.items() if name == task]

    def fail_unanswered(self, reason: str) -> None:
        """Samples still waiting when judging stopped are failed, with the reason, never dropped."""
        with self._lock:
            for key, waiting in list(self._waiting.items()):
                waiting.record.error = reason
                self._finish(key, waiting.record)

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()


def task_statistics(task: JudgeTask, records: list[SampleRecord], seed: int) -> list[TaskStatistic]:
    """The task's own statistics (length-controlled win rate, bootstrap CIs) over its judged records."""
    items = [
        JudgedItem(
            r.doc_id,
            r.sample_index,
            JudgedSample(
                scores={k: MetricValue(v * r.weights[k], r.weights[k]) for k, v in r.scores.items()},
                verdicts=r.verdicts,
                features=r.features,
            ),
        )
        for r in records
        if r.error is None
    ]
    return task.statistics(items, seed) if items else []
