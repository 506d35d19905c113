"""`rayeval serve`'s settings refused before anything starts (no Ray, no engine)."""

from __future__ import annotations

import pytest

from tests.runs import rayeval


@pytest.mark.parametrize(
    ("lora", "message"),
    [
        (["--lora", "tuned"], "'tuned' is not NAME=PATH"),
        (["--lora", "base:tuned=/tmp"], "NAME without ':'"),
        (["--lora", "tuned=/no/such/adapter"], "adapter 'tuned': /no/such/adapter is not a folder"),
        (["--lora", "a=/tmp", "--lora", "a=/tmp"], "adapter names repeat (a, a)"),
    ],
)
def test_bad_adapters_are_refused_before_anything_starts(lora: list[str], message: str) -> None:
    done = rayeval("serve", *lora, timeout=120)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]
    assert "--lora" in done.stderr and "Traceback" not in done.stderr
