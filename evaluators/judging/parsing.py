"""Reading verdicts out of judge answers, strictly: a verdict is found once (or repeated unchanged) or the
answer is rejected with a JudgeParseError that names the judgment, what was expected and what was found."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from evaluators.judging.base import JudgeParseError

QUOTE_CHARS = 120
# Short contents only: longer [[...]] spans are code or links in the judge's reasoning, never a verdict.
_BRACKETED = re.compile(r"\[\[([^\[\]\n]{1,40})\]\]")
_INTEGER = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)")


def quote(text: str, limit: int = QUOTE_CHARS, tail: bool = False) -> str:
    """`text` on one line, cut to `limit` characters (keeping the end when `tail`), in quotes."""
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = "..." + flat[-limit:] if tail else flat[:limit] + "..."
    return repr(flat)


def parse_error(key: str, expected: str, found: str) -> JudgeParseError:
    return JudgeParseError(f"judgment '{key}': expected {expected}; found {found}", key)


def answer_for(answers: Mapping[str, str], key: str) -> str:
    """The judge's answer to judgment `key`; a missing one is unreadable like any other."""
    answer = answers.get(key)
    if answer is None:
        raise parse_error(key, "an answer from the judge", "no answer under that key")
    return answer


def template_digest(*templates: str) -> str:
    """A short fingerprint of judge templates, put into task versions so that editing a template shows."""
    return hashlib.sha256("\x00".join(templates).encode("utf-8")).hexdigest()[:8]


def _squash(label: str) -> str:
    return "".join(label.split()).upper()


def bracket_verdict(text: str, allowed: Sequence[str], key: str) -> str:
    """The one `[[label]]` of `allowed` in `text` (whitespace inside the brackets ignored).

    Bracketed text that is no allowed label is ignored (judges quote code such as bash's `[[ -f x ]]`),
    unless nothing else is there. Two different allowed labels are ambiguous and rejected.
    """
    by_squashed = {_squash(label): label for label in allowed}
    found = [_squash(content) for content in _BRACKETED.findall(text)]
    verdicts = list(dict.fromkeys(by_squashed[f] for f in found if f in by_squashed))
    expected = "exactly one verdict among " + " ".join(f"[[{label}]]" for label in allowed)
    if not verdicts:
        if found:
            labels = ", ".join(f"[[{f}]]" for f in dict.fromkeys(found))
            raise parse_error(key, expected, f"only the unknown label(s) {quote(labels)}")
        raise parse_error(key, expected, f"no [[...]] verdict in {quote(text, tail=True)}")
    if len(verdicts) > 1:
        labels = ", ".join(f"[[{v}]]" for v in verdicts)
        raise parse_error(key, expected, f"conflicting verdicts {quote(labels)}")
    return verdicts[0]


def json_objects(text: str) -> list[dict[str, Any]]:
    """Every top-level JSON object in `text`, in order; fences and prose around them are skipped."""
    decoder = json.JSONDecoder()
    objects: list[dict[str, Any]] = []
    start = text.find("{")
    while start != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            objects.append(value)
        start = text.find("{", end)
    return objects


def extract_json_object(text: str, key: str, field: str) -> dict[str, Any]:
    """The JSON object in `text` that holds `field`; objects that disagree on it are rejected."""
    holding = [obj for obj in json_objects(text) if field in obj]
    expected = f'a JSON object with a "{field}" field'
    if not holding:
        raise parse_error(key, expected, f"none in {quote(text, tail=True)}")
    distinct = {json.dumps(obj[field], sort_keys=True) for obj in holding}
    if len(distinct) > 1:
        raise parse_error(key, expected, f"objects that disagree on it: {quote(', '.join(sorted(distinct)))}")
    return holding[-1]


_BARE_RATING = re.compile(r"\bRating:\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_ANCHORED_RATING = re.compile(r"\bRating:\s*\[\[([^\[\]\n]{1,40})\]\]", re.IGNORECASE)


def _numbers(found: list[str]) -> list[tuple[str, int | None]]:
    """Each distinct rating as found (a JSON score as JSON gives it), with its integer or None for a number
    that is no integer; a non-number (`true`, a word in brackets) is none."""
    shown = [_squash(c) for c in found]
    return [
        (c, int(c) if _INTEGER.fullmatch(c) else None) for c in dict.fromkeys(shown) if _NUMBER.fullmatch(c)
    ]


def integer_rating(text: str, key: str, low: int = 1, high: int = 10) -> int:
    """An integer score given as asked, `Rating: [[X]]`; where the answer has none, the one its other forms
    agree on: any `[[X]]` with a number, JSON {"score": X}, a bare `Rating: X` (small judges drop the
    brackets). Forms that disagree are no rating (a `[[2]]` quoted from the text beside `Rating: 8` or
    `{"score": 9}`): parsing never picks one."""
    expected = f'a rating "Rating: [[X]]" (or JSON {{"score": X}}) with X an integer {low}-{high}'
    candidates = _numbers(_ANCHORED_RATING.findall(text))
    if not candidates:
        scores = {  # a JSON score of another type ("7", 7.5, true) is a rating given wrong: said as such
            json.dumps(obj["score"]): obj["score"] if type(obj["score"]) is int else None
            for obj in json_objects(text)
            if "score" in obj
        }
        merged = dict(
            _numbers([*_BRACKETED.findall(text), *(m.group(1) for m in _BARE_RATING.finditer(text))])
        )
        for shown, score in scores.items():
            merged.setdefault(shown, score)
        candidates = list(merged.items())
    if not candidates:
        raise parse_error(key, expected, f"no rating in {quote(text, tail=True)}")
    if len(candidates) > 1:
        shown = ", ".join(c for c, _ in candidates)
        raise parse_error(key, expected, f"conflicting ratings {quote(shown)}")
    shown, rating = candidates[0]
    if rating is None:
        raise parse_error(key, expected, f"the non-integer rating {quote(shown)}")
    if not low <= rating <= high:
        raise parse_error(key, expected, f"the out-of-range rating {rating}")
    return rating
