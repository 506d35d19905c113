"""What a `rayeval run` forked by the warm CLI server costs in CPU: a `ray start` cluster with a one-replica
float32 pool (`rayeval up`, which starts the server), then small IFEval runs on it one after the other through
the server.

    python bench/warm_cli_run_cpu.py --out bench/results/warm-cli-run-cpu.jsonl --label HEAD   # 3 runs

The forked run is the server's child, not the client's: its CPU-seconds (user + system) are read as the growth
of the server's reaped children's time (/proc/PID/stat) over the run. Each row: the client's wall time from
process start to exit, that CPU, the server's pid, the commit, --label (say which code ran where the working
tree is not the commit) and this CPU's facts.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.cli_cpu import small_run_argv  # noqa: E402
from bench.rows import commit_of, write_row  # noqa: E402
from bench.warm_pool import Cluster, float32_pool  # noqa: E402

REAP_WAIT_S = 1.5  # the server reaps a finished command within its busy poll (0.5 s)


def server_pid() -> int:
    found = subprocess.run(
        ["pgrep", "-f", "cluster.cli.front_server"], capture_output=True, text=True, check=False
    ).stdout.split()
    if len(found) != 1:
        raise SystemExit(f"expected one warm CLI server on this machine, found {len(found)}: stop the others")
    return int(found[0])


def reaped_children_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime + cstime


def forked_run(cluster: Cluster, pid: int, run_id: str, prompts: int) -> dict:
    argv = small_run_argv(cluster, run_id, prompts)
    before = reaped_children_cpu_s(pid)
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=cluster.env, check=False)
    wall = time.perf_counter() - started
    time.sleep(REAP_WAIT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"wall_s": round(wall, 3), "forked_run_cpu_s": round(reaped_children_cpu_s(pid) - before, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--label", required=True, help="which code ran (the commit, or what differs from it)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    args = parser.parse_args()
    from cluster.engines.settings import cpu_has_native_bf16

    commit = commit_of()
    with float32_pool("cli") as cluster:
        pid = server_pid()
        for turn in range(args.runs):
            row = {"bench": "warm-cli-run-cpu", "commit": commit, "label": args.label, "turn": turn,
                   "prompts": args.prompts, "max_tokens": 32, "native_bf16": cpu_has_native_bf16(),
                   "server_pid": pid, **forked_run(cluster, pid, f"run-{turn}", args.prompts)}  # fmt: skip
            write_row(args.out, row)


if __name__ == "__main__":
    main()
