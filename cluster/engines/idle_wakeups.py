"""Fewer idle wake-ups from the torch.distributed process groups of an engine core.

vLLM sets up its process groups (world, tensor-, pipeline-, data-, expert-parallel, ...) on gloo in a CPU
engine's core even when the engine is one process. Each group's gloo device runs a thread that waits on epoll
with a 10 ms timeout, so an idle engine core wakes several hundred times a second: about 1.7 CPU-seconds
a minute per engine on a 2-core VM (bench/idle_cpu.py), for as long as a warm pool stays up.

A thread starts with its creator's timer slack (Linux `prctl(PR_SET_TIMERSLACK)`), the time by which the
kernel may let a timeout run late. Process groups created through `quiet_process_groups()` start their threads with
`GROUP_THREAD_SLACK_NS`, so those threads wake about nine times a second instead of a hundred. A message still
wakes them at once (epoll returns on the event, slack only delays timeouts), so collectives run as before. The
creating thread gets its own slack back after each group. The price: a group's thread takes up to that much
longer to stop when the group is destroyed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

PR_SET_TIMERSLACK = 29
PR_GET_TIMERSLACK = 30
GROUP_THREAD_SLACK_NS = 100_000_000  # 100 ms on gloo's 10 ms wait


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """glibc's prctl, which returns a C int: slack values up to 2.1 s read back whole, which covers these."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux
        return None


def current_timer_slack_ns() -> int | None:
    """The calling thread's timer slack, or None where the system has no prctl."""
    prctl = _prctl()
    return None if prctl is None else prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)


@contextlib.contextmanager
def timer_slack(slack_ns: int) -> Iterator[None]:
    """Inside, the calling thread's timer slack is `slack_ns`, and threads it starts keep that slack for their
    whole life; the calling thread's own slack is back afterwards. Where prctl is missing, nothing changes."""
    prctl, before = _prctl(), current_timer_slack_ns()
    changed = (
        prctl is not None
        and before is not None
        and before >= 0
        and prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(slack_ns), 0, 0, 0) == 0
    )
    try:
        yield
    finally:
        if changed and prctl is not None:
            prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(before), 0, 0, 0)


def quiet_process_groups(slack_ns: int = GROUP_THREAD_SLACK_NS) -> bool:
    """From now on in this process, every torch.distributed process group (the default one and each new group)
    is created inside `timer_slack(slack_ns)`. False where this torch creates its groups another way (they are
    then created as torch creates them)."""
    from torch.distributed import distributed_c10d

    create = getattr(distributed_c10d, "_new_process_group_helper", None)
    if create is None:
        log.warning(
            "torch.distributed has no _new_process_group_helper: its groups' threads keep their slack"
        )
        return False
    if getattr(create, "rayeval_slack_ns", None) is not None:
        return True

    @functools.wraps(create)
    def created_with_slack(*args: Any, **kwargs: Any) -> Any:
        with timer_slack(slack_ns):
            return create(*args, **kwargs)

    created_with_slack.rayeval_slack_ns = slack_ns  # type: ignore[attr-defined]
    distributed_c10d._new_process_group_helper = created_with_slack
    return True
