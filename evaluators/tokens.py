"""A run's token counts, from its per-sample records: prompt and output tokens per task, per replica and for
the run, and the output tokens per second of its generation phase.

Each request counts once: records that share a request (a greedy question's N samples are one draw; two tasks
may pose the same prompt) share its tokens. A record of an lm-eval document names all of its requests (one per
answer choice) and holds their summed tokens; it counts as one request under that joined id.

A resumed run reads some outputs back from its store instead of generating them. Those count in the task and
run totals (the results are made of them) but not in `generated`, `per_replica` or the tokens per second, which
count only what this run's replicas generated, over this run's generation seconds: an lm-eval document only
some of whose requests were generated now counts those requests' own tokens there.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from evaluators.records import SampleRecord

GENERATION_S_DIGITS = 3  # summary.json's seconds are rounded to the millisecond


@dataclass(frozen=True)
class TokenCounts:
    prompt_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: TokenCounts) -> TokenCounts:
        return TokenCounts(self.prompt_tokens + other.prompt_tokens, self.output_tokens + other.output_tokens)


@dataclass(frozen=True)
class RunTokens:
    total: TokenCounts  # every request behind the run's records, read back or generated
    generated: TokenCounts  # the requests this run generated
    generation_s: float  # the run's generation seconds (its dispatch phases, summed)
    per_task: dict[str, TokenCounts] = field(default_factory=dict)  # read back or generated
    # generated in this run, by the record's replica (an lm-eval document whose requests ran on several
    # replicas counts under their joined names)
    per_replica: dict[str, TokenCounts] = field(default_factory=dict)

    @property
    def reported_generation_s(self) -> float:
        """The generation seconds as summary.json holds them (to the millisecond)."""
        return round(self.generation_s, GENERATION_S_DIGITS)

    @property
    def output_tokens_per_s(self) -> float | None:
        """Output tokens generated in this run per second of its generation, over the seconds as reported, so
        that summary.json's output tokens over its generation seconds give its rate to the rate's last digit
        (over the unrounded seconds, a run of a few seconds would differ from it by more); None when it
        generated none."""
        seconds = self.reported_generation_s
        if self.generated.output_tokens == 0 or seconds <= 0:
            return None
        return self.generated.output_tokens / seconds

    def to_json(self) -> dict[str, object]:
        """summary.json's `run.tokens`."""
        rate = self.output_tokens_per_s
        return {
            "prompt_tokens": self.total.prompt_tokens,
            "output_tokens": self.total.output_tokens,
            "generated": _counts_json(self.generated),
            "generation_s": self.reported_generation_s,
            "output_tokens_per_s": None if rate is None else round(rate, 1),
            "per_replica": {name: _counts_json(counts) for name, counts in sorted(self.per_replica.items())},
            "counted": "each request once; generated, per_replica and output_tokens_per_s count only the "
            "requests this run generated (a resumed run's outputs read back from its store count in the "
            "totals only), over this run's generation seconds",
        }

    def footer(self) -> str:
        """The results table's last line: the run's tokens and the generation phase's speed."""
        head = f"tokens: {self.total.prompt_tokens:,} prompt, {self.total.output_tokens:,} output"
        rate = self.output_tokens_per_s
        if rate is None:
            return f"{head}; no output tokens generated in this run"
        generated = self.generated.output_tokens
        part = "" if generated == self.total.output_tokens else " (the rest read back from the run's store)"
        return (
            f"{head}; generated in this run: {generated:,} output tokens in {self.generation_s:.1f} s of "
            f"generation = {rate:,.1f} tokens/s{part}"
        )


def _counts_json(counts: TokenCounts) -> dict[str, int]:
    return {"prompt_tokens": counts.prompt_tokens, "output_tokens": counts.output_tokens}


def request_key(record: SampleRecord) -> str:
    """The request (or, for an lm-eval document, the requests) behind a record; a record without one stands
    for itself."""
    return record.request_id or f"{record.task}/{record.doc_id}/{record.sample_index}"


def generated_now(record: SampleRecord, generated_ids: Collection[str]) -> bool:
    """Whether this run generated the record's output (any of its requests, for an lm-eval document)."""
    return any(part in generated_ids for part in _request_ids(record))


def _request_ids(record: SampleRecord) -> list[str]:
    """The ids of the requests behind a record (several for an lm-eval document, joined by commas)."""
    return [part for part in record.request_id.split(",") if part]


def _generated_part(record: SampleRecord, generated_tokens: Mapping[str, TokenCounts]) -> SampleRecord:
    """The record as far as this run generated it: whole, or for an lm-eval document some of whose requests
    were read back from the store, with the tokens of the requests generated now only."""
    parts = _request_ids(record)
    if all(part in generated_tokens for part in parts):
        return record
    now = sum((generated_tokens[part] for part in parts if part in generated_tokens), TokenCounts())
    return replace(record, prompt_tokens=now.prompt_tokens, output_tokens=now.output_tokens)


def sum_tokens(records: Iterable[SampleRecord]) -> TokenCounts:
    """The tokens of the records' requests, each request once."""
    unique = {request_key(r): TokenCounts(r.prompt_tokens, r.output_tokens) for r in records}
    return sum(unique.values(), TokenCounts())


def run_tokens(
    records: list[SampleRecord], generated_tokens: Mapping[str, TokenCounts], generation_s: float
) -> RunTokens:
    """The run's token counts from its records; `generated_tokens` holds the tokens of each request this run
    generated, by request id (the rest were read back from its store)."""
    generated = [_generated_part(r, generated_tokens) for r in records if generated_now(r, generated_tokens)]
    by_task: dict[str, list[SampleRecord]] = {}
    by_replica: dict[str, list[SampleRecord]] = {}
    for record in records:
        by_task.setdefault(record.task, []).append(record)
    for record in generated:
        by_replica.setdefault(record.replica, []).append(record)
    return RunTokens(
        total=sum_tokens(records),
        generated=sum_tokens(generated),
        generation_s=generation_s,
        per_task={task: sum_tokens(rows) for task, rows in by_task.items()},
        per_replica={replica: sum_tokens(rows) for replica, rows in by_replica.items()},
    )
