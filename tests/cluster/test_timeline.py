"""The run's timeline: a moment keeps its first time, except those marked as the latest (the last result of
a run that dispatches several batches, as lm-eval's request types one after the other)."""

from __future__ import annotations

import time

from cluster import timeline


def test_a_moment_keeps_its_first_time_unless_marked_latest():
    now = time.time()
    timeline.mark("test: first handed out", now)
    timeline.mark("test: first handed out", now + 5)
    timeline.mark("test: last result", now + 1, latest=True)
    timeline.mark("test: last result", now + 7, latest=True)
    moments = timeline.moments()
    assert round(moments["test: last result"] - moments["test: first handed out"], 2) == 7.0
