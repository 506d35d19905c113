"""What the `rayeval run` process itself costs on a warm pool: a `ray start` cluster with a one-replica pool
(`rayeval up`), then small IFEval runs on it one after the other, each timed from outside.

    python bench/cli_cpu.py --out bench/results/cli-cpu-warm-run.jsonl            # 4 runs of 4 prompts

Each row: one run's wall time from process start to exit, the CPU-seconds (user + system) of the CLI process
and its children, and its timeline (summary.json's run.timeline), with the commit and this CPU's facts.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.rows import commit_of, write_row  # noqa: E402
from bench.warm_pool import ENGINE, Cluster, float32_pool  # noqa: E402
from cluster.cli.front_paths import WARM_CLI_ENV  # noqa: E402


def small_run_argv(cluster: Cluster, run_id: str, prompts: int) -> list[str]:
    """A small IFEval run on the cluster's float32 pool (32 tokens), its files under the cluster's folder."""
    return [sys.executable, "-m", "cluster.cli", "run", "--tasks", "ifeval", "--limit", str(prompts),
            "--max-tokens", "32", "--dtype", "float32", *ENGINE, "--no-progress",
            "--address", cluster.address, "--output-dir", str(cluster.temp / "runs"),
            "--run-id", run_id]  # fmt: skip


def timed_run(cluster: Cluster, run_id: str, prompts: int) -> dict:
    argv = small_run_argv(cluster, run_id, prompts)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    # in its own process (not forked by the warm CLI server, whose children RUSAGE_CHILDREN does not see)
    done = subprocess.run(
        argv, capture_output=True, text=True, env={**cluster.env, WARM_CLI_ENV: "0"}, check=False
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((cluster.temp / "runs" / run_id / "summary.json").read_text())["run"]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 3), "cli_cpu_s": round(cpu, 3), "timeline": summary.get("timeline")}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4)
    args = parser.parse_args()
    from cluster.engines.settings import cpu_has_native_bf16

    commit = commit_of()
    with float32_pool("cli") as cluster:
        for turn in range(args.runs):
            row = {"bench": "cli-cpu-warm-run", "commit": commit, "turn": turn,
                   "prompts": args.prompts, "max_tokens": 32, "native_bf16": cpu_has_native_bf16(),
                   **timed_run(cluster, f"run-{turn}", args.prompts)}  # fmt: skip
            write_row(args.out, row)


if __name__ == "__main__":
    main()
