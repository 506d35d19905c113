"""The CPU an idle warm pool costs: a `ray start` cluster with a one-replica pool (`rayeval up`) that has
served one small run, then every process of the cluster read from /proc over a window nobody uses it in.

    python bench/idle_cpu.py --out bench/results/idle-pool-cpu.jsonl            # one 60 s window
    python bench/idle_cpu.py --out ... --seconds 120 --repeats 2

Each row: one process kind (the engine core, its threads named gloo_tcp_loop apart, the engine actor, the
pool registry, Ray's daemons) and its CPU-seconds over the window, with the commit and this CPU's facts.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.rows import commit_of, write_row  # noqa: E402
from bench.warm_pool import ENGINE, Cluster, float32_pool  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cluster_pids(cluster: Cluster) -> list[int]:
    import psutil

    root = psutil.Process(cluster.process.pid)
    found = {p.pid for p in root.children(recursive=True)}
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == cluster.process.pid:
                found.add(process.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return sorted(found)


def kind_of(pid: int) -> str:
    comm = Path(f"/proc/{pid}/comm").read_text().strip()
    cmdline = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    if comm.startswith("VLLM::EngineCor"):
        return "engine core"
    for title in ("EngineActor", "PoolRegistry"):
        if cmdline.startswith(f"ray::{title}"):
            return f"ray::{title}"
    if "forkserver" in cmdline:
        return "engine core server"
    return "ray daemons and workers"


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU-seconds of each thread of `pid` so far, by thread id and name (`TID name`)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[f"{task.name} {name}"] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


def sample(pids: list[int]) -> dict[int, dict[str, float]]:
    taken = {}
    for pid in pids:
        try:
            taken[pid] = thread_cpu(pid)
        except OSError:
            continue
    return taken


def idle_window(cluster: Cluster, seconds: float) -> dict[str, float]:
    pids = cluster_pids(cluster)
    kinds = {}
    for pid in pids:
        with contextlib.suppress(OSError):  # a process that ended since the listing
            kinds[pid] = kind_of(pid)
    before = sample(pids)
    time.sleep(seconds)
    after = sample(pids)
    spent: dict[str, float] = collections.Counter()
    for pid, threads in after.items():
        if pid not in kinds:
            continue
        for thread, cpu in threads.items():
            used = cpu - before.get(pid, {}).get(thread, 0.0)
            gloo = kinds[pid] == "engine core" and thread.endswith(" gloo_tcp_loop")
            spent[f"{kinds[pid]}: gloo_tcp_loop threads" if gloo else kinds[pid]] += used
    return dict(spent)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    from cluster.engines.settings import cpu_has_native_bf16

    commit = commit_of()
    with float32_pool("idle") as cluster:
        run = cluster.rayeval("run", "--tasks", "ifeval", "--limit", "4", "--max-tokens", "32", "--dtype",
                              "float32", *ENGINE, "--no-progress", "--output-dir", str(cluster.temp / "runs"),
                              "--address", cluster.address)  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        time.sleep(15)  # the run's processes gone, the engine's threads idle
        for turn in range(args.repeats):
            for kind, cpu in sorted(idle_window(cluster, args.seconds).items()):
                row = {"bench": "idle-pool-cpu", "commit": commit, "turn": turn,
                       "window_s": args.seconds, "process_kind": kind, "cpu_s": round(cpu, 3),
                       "native_bf16": cpu_has_native_bf16()}  # fmt: skip
                write_row(args.out, row)


if __name__ == "__main__":
    main()
