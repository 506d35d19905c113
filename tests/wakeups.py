"""How often a process's threads of one name woke up over a while: their voluntary context switches, read from
/proc (a thread that waits on a 10 ms timeout switches about a hundred times a second)."""

from __future__ import annotations

import time
from pathlib import Path


def _switches(pid: int, thread_name: str) -> dict[str, int]:
    counts = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().strip() != thread_name:
                continue
            status = (task / "status").read_text().splitlines()
        except OSError:  # the thread ended meanwhile
            continue
        counts[task.name] = next(int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt"))
    return counts


def wakeups_per_second(pid: int, thread_name: str, seconds: float = 2.0) -> dict[int, float]:
    """Each thread named `thread_name` in process `pid`, by thread id: its wake-ups per second over
    `seconds`."""
    before = _switches(pid, thread_name)
    time.sleep(seconds)
    after = _switches(pid, thread_name)
    return {int(tid): (after[tid] - before[tid]) / seconds for tid in before if tid in after}


def timer_slack_ns(pid: int, thread_name: str) -> dict[int, int] | None:
    """Each thread named `thread_name` in process `pid`, by thread id: its timer slack as the kernel holds it;
    None where the kernel refuses to say (another thread's slack is read only with CAP_SYS_NICE)."""
    slack = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == thread_name:
                slack[int(task.name)] = int(Path(f"/proc/{task.name}/timerslack_ns").read_text())
        except PermissionError:
            return None
        except OSError:  # the thread ended meanwhile
            continue
    return slack
