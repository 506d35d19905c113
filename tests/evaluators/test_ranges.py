"""Dataset ranges as OpenCompass and RD-Agent write them: the positions Python's own slicing gives, for
plain slices of any bounds and for RD-Agent's size-dependent ones; anything else is refused by name."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evaluators.errors import EvalInputError
from evaluators.ranges import DatasetRange

bounds = st.one_of(st.none(), st.integers(-50, 50))


@given(
    start=bounds,
    stop=bounds,
    step=st.one_of(st.none(), st.integers(-5, 5).filter(bool)),
    size=st.integers(0, 60),
)
def test_a_plain_slice_selects_what_python_slicing_selects(start, stop, step, size):
    text = "[" + ":".join("" if b is None else str(b) for b in (start, stop, step)) + "]"
    assert list(DatasetRange.parse(text).indices(size)) == list(range(size))[start:stop:step]


@pytest.mark.parametrize("size", [0, 7, 150, 1319])
def test_rdagents_validation_and_test_ranges_never_overlap(size):
    validation = DatasetRange.parse("[:min(100, len(index_list)//2)]").indices(size)
    test = DatasetRange.parse("[-min(100, len(index_list)//2):]").indices(size)
    assert len(validation) == min(100, size // 2)
    assert set(validation).isdisjoint(test) or size // 2 == 0


@pytest.mark.parametrize(
    "text",
    ["100", "[1, 2]", "[:x]", "[:len(other)]", "[:open('f')]", "[:2**10]", "[:1.5]", "[:'3']", "[::0]"],
)
def test_anything_but_a_slice_of_integers_is_refused(text):
    with pytest.raises(EvalInputError, match="test_range"):
        DatasetRange.parse(text).indices(10)
