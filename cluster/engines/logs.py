"""Where an engine replica's log is, and the root error of an engine that failed, read back from it.

vLLM's engine core and its workers are child processes of the engine actor and write to the actor's own
stdout and stderr, which Ray sends to the worker's log files (`worker-*.out` / `.err` in the session's log
folder). When the engine dies, the exception the actor sees says only "EngineCore encountered an issue. See
stack trace (above)": the stack trace is in those files, so the root error is read back from them.

Those files are on the engine's node, which need not be the driver's machine: a live actor reads its own,
and for an actor whose process died `read_on_node` reads them with a task placed on that node. Every
message names the node beside the paths.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# vLLM's log prefix: "(EngineCore pid=12) ERROR 11-27 12:52:44 [core.py:123] "; Ray's: "(pid=12) ".
_LOG_PREFIX = re.compile(r"^(\([^)]*\)\s*)?([A-Z]+ \d\d-\d\d [\d:.]+ \[[^\]]*\]\s?)?")
# An exception line of a traceback: an unindented (dotted) class name ending in Error or Exception, a colon.
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))(: .*)?$")
_READ_LIMIT = 4 << 20  # bytes of a log read back at most (its end), so a huge log costs no time


@dataclass(frozen=True)
class LogPlace:
    """A log file and the byte offset from which it belongs to what is being watched."""

    path: str
    offset: int = 0


def own_log_files() -> list[str]:
    """The files this process's stdout and stderr go to (Ray's worker logs), if they are files."""
    found = []
    for fd in (1, 2):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/") and Path(target).is_file() and target not in found:
            found.append(target)
    return found


def mark(paths: Iterable[str]) -> list[LogPlace]:
    """Each file with its current size: what is written after this belongs to what comes next."""
    places = []
    for path in paths:
        try:
            places.append(LogPlace(path, os.path.getsize(path)))
        except OSError:
            places.append(LogPlace(path))
    return places


def first_exception(lines: Iterable[str]) -> str | None:
    """The first exception line of the first traceback in the lines, log prefixes taken off."""
    in_traceback = False
    for raw in lines:
        line = _LOG_PREFIX.sub("", raw.rstrip("\n"), count=1)
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
        elif in_traceback and (match := _EXCEPTION_LINE.match(line)):
            return match.group(0).strip()
    return None


def root_error(places: Iterable[LogPlace]) -> str | None:
    """The engine's first exception line written to the logs after their marks, if any can be read. A file
    now shorter than its mark was rotated or truncated since: all of it is after the mark."""
    for place in places:
        try:
            with open(place.path, "rb") as handle:
                size = handle.seek(0, os.SEEK_END)
                since = place.offset if place.offset <= size else 0
                handle.seek(max(since, size - _READ_LIMIT))
                text = handle.read().decode("utf-8", errors="replace")
        except OSError:
            continue
        if found := first_exception(text.splitlines()):
            return found
    return None


@dataclass(frozen=True)
class EngineLog:
    """An engine's log files, from where in each they concern it, and the node they are on."""

    places: tuple[LogPlace, ...]
    node_id: str = ""
    node_ip: str = ""


def describe_failure(
    message: str, places: Iterable[LogPlace], node_ip: str = "", root: str | None = None
) -> str:
    """The root error when the logs have one (else the message), and where the full log is: its paths and
    the node they are on. `root`: the root error already read (on the node); else the files are read here."""
    places = list(places)
    text = root or root_error(places) or message
    where = " and ".join(p.path for p in places)
    on = f" on node {node_ip}" if node_ip else ""
    return f"{text}; the engine's full log: {where}{on}" if where else text


async def read_on_node(log: EngineLog, timeout_s: float = 20.0) -> str | None:
    """The root error in the log files of `log`, read by a task on the log's own node (no CPU asked); None
    when the node is gone, does not answer in time, or the logs hold none."""
    import asyncio

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not log.node_id or not log.places:
        return None
    reader = ray.remote(num_cpus=0, max_retries=0)(root_error).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(log.node_id, soft=False)
    )
    try:
        return await asyncio.wait_for(
            asyncio.wrap_future(reader.remote(list(log.places)).future()), timeout_s
        )
    except Exception:  # noqa: BLE001 - the node may be the very thing that failed
        return None
