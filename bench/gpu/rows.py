"""The JSON row a configuration's process prints last (and the driver reads back): throughput over the
generation window, one row for several repeats or for two sides' paired turns, and where rayeval's
dispatcher spent the time. Every row that measured generation has `began_at` and `ended_at` (`time.time()`),
the window over which the driver reports CPU and GPU use."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from bench.gpu.settings import A_DTYPE, A_REPEATS

if TYPE_CHECKING:
    from sharding.dispatcher import DispatchStats


def throughput(name: str, seconds: float, tokens: int, requests: int, start_s: float) -> dict:
    """A row's throughput fields: `tokens` output tokens of `requests` requests in `seconds` of generation."""
    return {
        "config": name,
        "generation_s": round(seconds, 2),
        "output_tokens": tokens,
        "requests": requests,
        "output_tok_per_s": round(tokens / seconds, 1),
        "engine_start_s": round(start_s, 1),
        "dtype": A_DTYPE,  # workload B's rows replace it with what their engines ran in
    }


def repeated(name: str, repeats: list[dict], start_s: float, **extra: object) -> dict:
    """One row for a configuration's repeats: the mean generation time of a repeat (every repeat is the same
    amount of work), each repeat's time, and the span from the first start to the last end."""
    mean_s = sum(r["seconds"] for r in repeats) / len(repeats)
    row = throughput(name, mean_s, repeats[0]["tokens"], repeats[0]["requests"], start_s)
    row.update(
        repeat_generation_s=[round(r["seconds"], 2) for r in repeats],
        began_at=repeats[0]["began_at"],
        ended_at=repeats[-1]["began_at"] + repeats[-1]["seconds"],
        **extra,
    )
    return row


def as_one_turn(turns: list[dict]) -> dict:
    """Turns of several processes that started together, as one: first start to last end, summed output."""
    began_at = min(t["began_at"] for t in turns)
    return {
        "began_at": began_at,
        "seconds": max(t["began_at"] + t["seconds"] for t in turns) - began_at,
        "tokens": sum(t["tokens"] for t in turns),
        "requests": sum(t["requests"] for t in turns),
        "each_s": [round(t["seconds"], 2) for t in turns],
    }


def paired_row(name: str, sides: dict[str, list[dict]], **extra: object) -> dict:
    """One row for two sides' turns (`sides` in A, B order): each turn's time, each side's mean output tok/s
    and requests/s, and B's speed over A's for every pair."""
    from bench.paired import pair_ratios

    (a, a_turns), (b, b_turns) = sides.items()
    turns = a_turns + b_turns
    row: dict = {"config": name}
    for side, side_turns in sides.items():
        row[f"{side}_s"] = [round(t["seconds"], 2) for t in side_turns]
        seconds = sum(t["seconds"] for t in side_turns)
        row[f"{side}_tok_per_s"] = round(sum(t["tokens"] for t in side_turns) / seconds, 1)
        row[f"{side}_requests_per_s"] = round(sum(t["requests"] for t in side_turns) / seconds, 1)
    row[f"{b}_over_{a}"] = pair_ratios([t["seconds"] for t in a_turns], [t["seconds"] for t in b_turns])
    row.update(
        pairs=len(a_turns),
        pairs_asked=A_REPEATS,  # more than `pairs` when the configuration's share of --budget-s ran out first
        requests_per_turn=a_turns[0]["requests"],
        failed=sum(t.get("failed", 0) for t in turns),
        began_at=min(t["began_at"] for t in turns),
        ended_at=max(t["began_at"] + t["seconds"] for t in turns),
        **extra,
    )
    return row


def dispatch_timeline(
    stats: DispatchStats | None, start: float | None = None, sequences_before: dict[str, int] | None = None
) -> dict:
    """Where the generation time went, from the dispatcher's clock: hand-outs, the tail after the last
    hand-out (replicas draining with nothing left to pull), and when each replica finished. `start` and
    `sequences_before` cut out one repeat of several on the same dispatcher (its stats add up over runs)."""
    if (
        stats is None
        or stats.tail_s is None
        or stats.first_handout_at is None
        or stats.last_handout_at is None
    ):
        return {}
    start = start or stats.first_handout_at
    before = sequences_before or {}
    return {
        "began_at": start,
        "ended_at": stats.last_finish_at,
        "handout_span_s": round(stats.last_handout_at - start, 2),
        "tail_s": round(stats.tail_s, 2),
        "replica_finished_s": {
            name: round(r.last_finish_at - start, 2)
            for name, r in stats.per_replica.items()
            if r.last_finish_at is not None and r.last_finish_at >= start
        },
        "per_replica": {name: r.sequences - before.get(name, 0) for name, r in stats.per_replica.items()},
    }


def result_row(stdout: str) -> dict | None:
    """The JSON line a `--config` process prints last, if it printed one."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None
