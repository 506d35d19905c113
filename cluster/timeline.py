"""Where a process's wall time goes: named moments, in seconds since the process started (its start time as
the OS gives it, so the interpreter's own start and every import count), for `summary.json`'s
`run.timeline` and `rayeval run --profile-startup`.

A moment is kept the first time it is marked: a run's first result stays its first, whatever comes after.
Plain Python; one timeline per process (the driver's, or the coordinator actor's in a Ray client run).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


def process_start() -> float:
    """The wall-clock time this process started: its start in clock ticks since boot (/proc/self/stat) against
    the uptime now, to 10 ms. (psutil's create_time adds the boot time, which Linux gives in whole seconds.)"""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22, starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        import psutil

        return psutil.Process().create_time()


_STARTED_AT = process_start()  # wall clock (time.time()) of the process's start
_moments: dict[str, float] = {}
_lock = threading.Lock()


def started_at(when: float) -> None:
    """Count from `when` (wall clock) instead of this process's start: a command that the warm CLI server
    (cluster.cli.front) runs in a process forked for it counts from its client's start, where the user's
    wait began."""
    global _STARTED_AT
    _STARTED_AT = when


def mark(name: str, at: float | None = None, *, latest: bool = False) -> None:
    """Record moment `name` now, or at wall-clock time `at`, unless it was recorded before; with `latest`,
    over what was recorded (the last result of a run that dispatches several batches, as lm-eval's
    request types)."""
    with _lock:
        moment = (time.time() if at is None else at) - _STARTED_AT
        if latest:
            _moments[name] = moment
        else:
            _moments.setdefault(name, moment)


def moments() -> dict[str, float]:
    """Every moment so far, in the order they happened, in seconds since the process started."""
    with _lock:
        return {name: round(at, 3) for name, at in sorted(_moments.items(), key=lambda item: item[1])}


def since_start() -> float:
    return time.time() - _STARTED_AT


def format_moments(found: dict[str, float]) -> str:
    """One line per moment: when it came and how long after the one before."""
    lines, before = [], 0.0
    for name, at in found.items():
        lines.append(f"  {at:8.2f} s  (+{at - before:6.2f})  {name}")
        before = at
    return "\n".join(lines)
