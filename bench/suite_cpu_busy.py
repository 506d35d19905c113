"""A pytest plugin that records, for each test, its seconds and how busy the machine's cores were meanwhile.

    CI=true SUITE_CPU_BUSY=rows.jsonl PYTEST_ADDOPTS="-p bench.suite_cpu_busy" bash .ci/run

Reads the first line of /proc/stat (every core's time by state) before and after each test's setup, call and
teardown; the busy fraction is one minus the share of idle and iowait time. It is system-wide: it counts the
test run's own clusters, engines and servers, which run in other processes. Rows are appended to the file
SUITE_CPU_BUSY names (default suite-cpu-busy.jsonl in the working directory): test, began (Unix time),
seconds, busy.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest


def _cpu_times() -> tuple[int, int]:
    """(all, idle + iowait) clock ticks of every core since boot."""
    with open("/proc/stat", encoding="ascii") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    return sum(ticks), ticks[3] + ticks[4]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    began, (total_before, idle_before) = time.time(), _cpu_times()
    yield
    total_after, idle_after = _cpu_times()
    busy = 1 - (idle_after - idle_before) / max(1, total_after - total_before)
    row = {
        "test": item.nodeid,
        "began": round(began, 3),
        "seconds": round(time.time() - began, 3),
        "busy": round(busy, 3),
    }
    with open(os.environ.get("SUITE_CPU_BUSY", "suite-cpu-busy.jsonl"), "a", encoding="utf-8") as out:
        out.write(json.dumps(row) + "\n")
