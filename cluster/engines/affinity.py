"""CPU cores of their own for the vLLM engine cores of GPU replicas.

On a GPU, vLLM's engine core (one Python process per replica: scheduler, input preparation, output
serialisation) sets the pace for small models: on 2 x H100 with a 1.1B model the GPU ran
kernels under half of the time. Left to the kernel's scheduler, that process's busy thread moved between two
or three cores within seconds; pinned to two cores of its own, the replica generated about 10 % faster
(docs/BENCHMARKS.md). Each replica's engine core therefore gets cores of its own, disjoint
from the other replicas' on the node, taken from the top of the node's range (away from core 0, where the
driver, Ray's daemons and interrupts tend to run). Only the engine core's process is pinned; the Ray actor
that talks to it, tensor-parallel workers and everything else stay where the scheduler puts them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

ENGINE_CORE_PROCESS = "VLLM::EngineCor"  # vLLM's process title, as /proc/<pid>/comm truncates it (15 chars)
CORES_PER_ENGINE_CORE = 2  # the busy scheduling loop, and its input and output socket threads beside it


def engine_core_cpus(
    local_index: int, local_count: int, cpus: list[int], per_engine: int = CORES_PER_ENGINE_CORE
) -> list[int]:
    """The CPUs for the engine core of replica `local_index` of `local_count` on one node, given the CPUs
    this node lets us use; empty when there are too few for each replica to have one of its own."""
    per_engine = min(per_engine, len(cpus) // max(1, local_count))
    if per_engine < 1 or not 0 <= local_index < local_count:
        return []
    top_down = sorted(cpus, reverse=True)
    return sorted(top_down[local_index * per_engine : (local_index + 1) * per_engine])


def pin_descendants(parent_pid: int, cpus: list[int], name_prefix: str = ENGINE_CORE_PROCESS) -> list[int]:
    """Every thread of each process below `parent_pid` whose name starts with `name_prefix` onto `cpus`
    (threads it starts later inherit it). Returns the pids pinned; Linux only (elsewhere nothing happens)."""
    if not cpus or not hasattr(os, "sched_setaffinity") or not Path("/proc").is_dir():
        return []
    pinned = []
    for pid in descendants(parent_pid):
        if not _comm(pid).startswith(name_prefix):
            continue
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                os.sched_setaffinity(int(tid), cpus)
        except OSError as error:  # a thread that ended meanwhile, or a container that forbids it
            log.warning("could not pin process %d to CPUs %s: %s", pid, cpus, error)
            continue
        pinned.append(pid)
    return pinned


def descendants(root: int) -> list[int]:
    """Every process below `root`, from the parent ids in /proc/<pid>/stat (also how bench/gpu/driver.py finds what
    a configuration started, to stop it)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])  # field 4, after the name
        parents.setdefault(ppid, []).append(int(entry))
    found, frontier = [], [root]
    while frontier:
        children = [c for pid in frontier for c in parents.get(pid, [])]
        found += children
        frontier = children
    return found


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
