"""A run that joins a warm pool two other runs already share: when its first result comes, with the pool's
in-flight window shared among the runs sending to it (this checkout) and, with --base, without (an older
checkout, in turn on its own cluster).

    git worktree add /tmp/base-cea67ec cea67ec      # the commit before the window was shared
    python bench/pool_join.py --out bench/results/pool-join-cpu.jsonl --base /tmp/base-cea67ec --repeats 2

Each side: a fresh `ray start` cluster of this machine and a one-replica pool (`rayeval up`, the embedded
model, `--max-num-seqs` small so the windows matter: 16 sequences a batch, a window of 32), then runs A and B
started together (`--limit` IFEval prompts each, sampled with their own seeds, so no answer is reused), and
after `--join-after` seconds run C (4 prompts). A row per side: each run's wall, C's first result after its
own start (its `--profile-startup` timeline), each run's peak in flight on the replica and, where the
checkout records it, the most runs it saw sending at once. A and B hand out their whole window at their start
either way; what differs is what they hold once they know of each other, so C joins behind one window
(shared) or behind one each (not shared). Every side asks the same requests.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.rows import commit_of, write_row  # noqa: E402
from bench.warm_pool import Cluster  # noqa: E402

ENGINE = ["--max-model-len", "1024", "--max-num-seqs", "16", "--enforce-eager", "--kv-cache-gib", "1"]
JOINING_PROMPTS = 4


def run_argv(cluster: Cluster, work: Path, run_id: str, limit: int, seed: int, max_tokens: int) -> list[str]:
    return [sys.executable, "-m", "cluster.cli", "run", "--address", cluster.address, "--tasks", "ifeval",
            "--limit", str(limit), "--max-tokens", str(max_tokens), "--temperature", "0.7", "--seed", str(seed),
            *ENGINE, "--no-progress", "--profile-startup", "--output-dir", str(work), "--run-id", run_id]  # fmt: skip


def outcome(work: Path, run_id: str, process: subprocess.Popen[bytes]) -> dict:
    """What a run left; its wall and first result are its own (`summary.json`), not when this loop saw it end."""
    process.wait(timeout=900)
    if process.returncode != 0:
        return {"failed": (work / f"{run_id}.log").read_text()[-2000:]}
    run = json.loads((work / run_id / "summary.json").read_text())["run"]
    per_replica = run["dispatch"]["per_replica"]
    return {"wall_s": run["wall_s"], "first_result_s": run["timeline"].get("first result"),
            "generation_s": run["generation_s"], "requests": run["requests"],
            "peak_in_flight": max(r["peak_in_flight"] for r in per_replica.values()),
            "runs_sharing_at_most": run["engines_source"].get("runs_sharing_at_most")}  # fmt: skip


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("w") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)


def side(checkout: Path, args: argparse.Namespace, turn: int) -> dict:
    """One side on a fresh cluster whose commands run from `checkout` (its code on every process)."""
    os.chdir(checkout)
    os.environ["PYTHONPATH"] = str(checkout)  # the cluster's workers (the pool's registry, its engines) too
    work = args.work / f"{checkout.name}-{turn}"
    work.mkdir(parents=True)
    cluster = Cluster()
    try:
        up = cluster.rayeval("up", *ENGINE, "--name", "join", "--idle-timeout", "10m")
        if up.returncode != 0:
            return {"failed": up.stderr[-2000:]}
        runs = {
            name: start(
                run_argv(cluster, work, name, args.limit, seed, args.max_tokens),
                cluster.env,
                work / f"{name}.log",
            )
            for name, seed in (("a", 1), ("b", 2))
        }
        time.sleep(args.join_after)
        runs["c"] = start(run_argv(cluster, work, "c", JOINING_PROMPTS, 3, args.max_tokens), cluster.env,
                          work / "c.log")  # fmt: skip
        return {name: outcome(work, name, process) for name, process in runs.items()}
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="JSONL file the rows are appended to")
    parser.add_argument("--base", type=Path, help="another checkout to run in turn with this one")
    parser.add_argument("--repeats", type=int, default=2, help="turns per checkout")
    parser.add_argument("--limit", type=int, default=96, help="IFEval prompts of runs A and B each")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--join-after", type=float, default=15.0, help="seconds between A and B's start and C's"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/rayeval-pool-join"))
    args = parser.parse_args()
    args.out = args.out.resolve()
    args.work = args.work.resolve()
    shutil.rmtree(args.work, ignore_errors=True)
    checkouts = [REPO, *([args.base.resolve()] if args.base else [])]
    for turn in range(args.repeats):
        for checkout in checkouts:
            row = side(checkout, args, turn)
            settings = {"limit": args.limit, "max_tokens": args.max_tokens, "join_after_s": args.join_after,
                        "joining_prompts": JOINING_PROMPTS, "engine": ENGINE}  # fmt: skip
            write_row(args.out, {"commit": commit_of(checkout), "turn": turn, **settings, **row})


if __name__ == "__main__":
    main()
