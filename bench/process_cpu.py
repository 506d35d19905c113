"""Where a long command's CPU time goes, by process: samples every process's CPU time while the command runs.

    python bench/process_cpu.py --out bench/results/suite-cpu-by-process-COMMIT.jsonl -- bash .ci/run

Reads every process's CPU time and command line (psutil) every `--interval` seconds while the command runs
and writes one row per process seen: its command line (the last one other than Ray's idle-worker title, as
Ray renames a worker when it takes an actor, or the bare name an exiting process shows), parent, seconds of
CPU (user + system, the last reading), and when it was first and last seen (Unix times), with the commit of
the checkout it ran in and the machine's facts. A process that lives less than one interval is missed; one
that ends between two readings loses the CPU of its last interval. The rows' CPU adds up to close to the
machine's busy time when the interval is short against the processes' lives. Credentials a command line
carries are written as <redacted>. Summarise a rows file with `--summary`.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.rows import commit_of, machine_facts  # noqa: E402

# a credential a command line carries (a test's throwaway store key in a `python -c` script, an API key):
# written as <redacted>, so that no rows file holds one
CREDENTIAL = re.compile(r"((?:secret|access|api)[_-]?key|password|token)(['\"]?\s*[=:]\s*['\"]?)[^\s'\",)]+|sk-\w+",
                        re.IGNORECASE)  # fmt: skip
READ = ["ppid", "cmdline", "name", "cpu_times", "create_time"]  # psutil's names for what a reading takes


@dataclass
class Seen:
    pid: int
    ppid: int
    cmdline: str
    cpu_s: float
    first_s: float
    last_s: float


def redacted(cmdline: str) -> str:
    return CREDENTIAL.sub(lambda m: f"{m[1]}{m[2]}<redacted>" if m[1] else "<redacted>", cmdline)


def sample(seen: dict[tuple[int, float], Seen]) -> None:
    """One reading of every process, into `seen` (keyed by pid and start time: pids are reused)."""
    import psutil

    now = time.time()
    for process in psutil.process_iter(READ):
        info = process.info
        if info["cpu_times"] is None or info["create_time"] is None:  # gone meanwhile
            continue
        key = (process.pid, info["create_time"])
        # an exiting process (a zombie) shows no command line: its bare name, in brackets
        argv = redacted(" ".join(info["cmdline"] or [])) or f"[{info['name']}]"
        cpu_s = info["cpu_times"].user + info["cpu_times"].system
        entry = seen.get(key)
        if entry is None:
            seen[key] = Seen(process.pid, info["ppid"], argv, cpu_s, now, now)
            continue
        entry.cpu_s, entry.last_s = cpu_s, now
        # kept: a title Ray gave the worker for its actor, and any command line over the bare name
        if not argv.startswith(("ray::IDLE", "[")) or entry.cmdline.startswith("["):
            entry.cmdline = argv


def watch(command: list[str], interval: float) -> tuple[int, list[Seen]]:
    """Run `command`, reading every process meanwhile; its exit status and the processes it saw begin."""
    seen: dict[tuple[int, float], Seen] = {}
    sample(seen)
    before = set(seen)
    child = subprocess.Popen(command)
    while child.poll() is None:
        sample(seen)
        time.sleep(interval)
    sample(seen)
    # processes that were there before the command began are not the command's: left out
    return child.returncode, [entry for key, entry in seen.items() if key not in before]


def category(cmdline: str) -> str:
    """A coarse name for a command line, for the summary."""
    if cmdline.startswith(("ray::", "VLLM::", "[ray::", "[VLLM::")):
        return cmdline.strip("[]").split()[0].split(".")[0][:15]  # the kernel keeps 15 characters of a title
    for marker in ("pip install", "cluster.cli", "tests.lm_eval_reference", "pytest", "raylet", "gcs_server", "dashboard",
                   "log_monitor", "ray_client_server", "runtime_env", "weed", "mlflow", "chromium",
                   "multiprocessing.forkserver", "multiprocessing.spawn", "default_worker"):  # fmt: skip
        if marker in cmdline:
            return marker
    return cmdline.split()[0][-40:] if cmdline else "?"


def named(row: dict, by_pid: dict[int, dict]) -> str:
    """The row's category; a process seen only by its bare name (it exited before a reading showed its command
    line) is named by its parent: `python (child of ray::EngineActor)`."""
    name = category(row["cmdline"])
    if row["cmdline"].startswith("[") and not name.startswith(("ray::", "VLLM::")):
        parent = by_pid.get(row["ppid"])
        name = f"{name} (child of {category(parent['cmdline']) if parent else 'a process not seen'})"
    return name


def summary(rows: list[dict]) -> None:
    by_pid = {row["pid"]: row for row in rows}
    by_category, counts = Counter(), Counter()
    for row in rows:
        name = named(row, by_pid)
        by_category[name] += row["cpu_s"]
        counts[name] += 1
    total = sum(by_category.values())
    print(f"{total:9.1f} s CPU in {len(rows)} processes")
    for name, cpu_s in by_category.most_common(30):
        print(f"{cpu_s:9.1f} s {counts[name]:5d}  {name}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="JSON-lines file for the per-process rows")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between readings (default 0.2)")
    parser.add_argument(
        "--summary", type=Path, help="print the CPU by kind of process of a rows file, and exit"
    )
    parser.add_argument("command", nargs="*", help="the command to watch (after --)")
    args = parser.parse_args()
    if args.summary:
        summary([json.loads(line) for line in args.summary.read_text().splitlines()])
        return 0
    if not args.command or not args.out:
        parser.error("give --out and a command after --")
    status, seen = watch(args.command, args.interval)
    # the commit of the checkout the command ran in, and this machine's facts, on every row (bench/rows.py)
    common = {"commit": commit_of(Path.cwd()), "interval_s": args.interval, **machine_facts()}
    rows = [common | asdict(entry) for entry in seen]
    with args.out.open("w", encoding="utf-8") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)
    summary(rows)
    return status


if __name__ == "__main__":
    sys.exit(main())
