"""The dispatcher and the result store alone, at 10k to 1M requests, with replicas that answer at once.

    python bench/dispatch_scale.py --out bench/results/dispatch-scale.jsonl
    python bench/dispatch_scale.py --sizes 10000 --modes dispatcher+store --keep-store
    python bench/dispatch_scale.py --out bench/results/dispatch-scale.jsonl --modes real-run   # ~21k requests

What rayeval's own machinery costs per request once engines are out of the picture: each size runs in its
own process (so peak memory is that size's), builds its requests with `make_request` (real request ids) and
`group_prompts`, then runs one `Dispatcher` over in-process replicas whose call returns a short completion
at once (a benchmark device, not a stand-in for a product part: nothing here claims a run works). Modes:
- `dispatcher`: completions are counted and dropped;
- `dispatcher+store`: each finished group's completions are appended to a `ResultStore` (the resume file),
  as a run does.
- `real-run`: a real `rayeval run` on this machine's CPU engines with many short requests: GSM8K's 1,319
  questions 0-shot, 16 samples each, 8 new tokens (21,104 requests; greedy: sampled at temperature 0.7 with
  seeds, a 320-request trial generated ~100 tokens/s, which would make this a half-hour run); the row gives the
  driver's (the `rayeval` process's) peak resident memory, its wall time and the run's timeline (start to
  first result). The recorded row was measured while greedy samples were still one request each; since they
  are one request per question (one draw), this mode runs 1,319 requests.
Each other row: the time to build the requests, the dispatch time and microseconds per request, the process's
resident memory after building (the input) and its growth while dispatching, sampled at each quarter of the
requests done (growth that follows what is done, not what is in flight, shows as a rising curve), and the
peak resident memory of the process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PAGE = os.sysconf("SC_PAGE_SIZE")
MODES = ("dispatcher", "dispatcher+store", "real-run")
GSM8K = REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl"  # the hub is out of reach here
REAL_RUN = ["--tasks", "gsm8k", "--data-path", str(GSM8K), "--limit", "1319", "--num-fewshot", "0", "--num-samples", "16", "--temperature", "0",
            "--max-tokens", "8", "--no-progress", "--profile-startup"]  # fmt: skip


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE / 2**20


def build_groups(size: int, samples: int) -> list:
    from sharding.requests import SamplingSpec, group_prompts, make_request

    sampling = SamplingSpec(temperature=1.0 if samples > 1 else 0.0, max_tokens=8)
    requests = [
        make_request("bench-model", f"Question {prompt}: what is {prompt} + 1?", sampling, 1234, index)
        for prompt in range(size // samples)
        for index in range(samples)
    ]
    return group_prompts(requests)


def replica(name: str, window: int):
    from sharding.dispatcher import Replica
    from sharding.requests import Completion

    async def generate(group) -> list:
        return [Completion(r.request_id, text=" 42", prompt_tokens=12, output_tokens=2, replica=name)
                for r in group.requests]  # fmt: skip

    return Replica(name, generate, max_in_flight=window, batch_size=window // 2)


def measure(size: int, mode: str, replicas: int, window: int, samples: int, store_dir: Path) -> dict:
    from sharding.dispatcher import Dispatcher
    from sharding.store import ResultStore

    began = time.perf_counter()
    groups = build_groups(size, samples)
    build_s = time.perf_counter() - began
    base = rss_mib()
    store = ResultStore(store_dir / "completions.jsonl") if mode == "dispatcher+store" else None
    quarters = [size * q // 4 for q in (1, 2, 3, 4)]
    growth: list[float] = []
    done = 0

    def on_done(group, completions) -> None:
        nonlocal done
        if store is not None:
            store.add(completions)
        done += len(completions)
        while quarters and done >= quarters[0]:
            quarters.pop(0)
            growth.append(round(rss_mib() - base, 1))

    dispatcher = Dispatcher([replica(f"r{i}", window) for i in range(replicas)], on_group_done=on_done)
    began = time.perf_counter()
    stats = asyncio.run(dispatcher.run(groups))
    dispatch_s = time.perf_counter() - began
    if store is not None:
        store.close()
    return {"requests": done, "groups": len(groups), "build_s": round(build_s, 2),
            "dispatch_s": round(dispatch_s, 2), "us_per_request": round(dispatch_s / done * 1e6, 2),
            "rss_after_build_mib": round(base, 1), "rss_growth_by_quarter_mib": growth,
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "peak_in_flight": max(s.peak_in_flight for s in stats.per_replica.values()),
            "groups_failed": stats.groups_failed}  # fmt: skip


def real_run() -> dict:
    with tempfile.TemporaryDirectory(prefix="dispatch-real-") as folder:
        command = ["/usr/bin/time", "-f", "MAXRSS_KIB %M", sys.executable, "-m", "cluster.cli", "run", *REAL_RUN,
                   "--output-dir", folder, "--run-id", "real"]  # fmt: skip
        began = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=False)
        wall = time.perf_counter() - began
        if done.returncode != 0:
            raise SystemExit(f"the real run failed:\n{done.stderr[-3000:]}")
        run = json.loads((Path(folder) / "real" / "summary.json").read_text())["run"]
    peak_kib = int(
        next(line for line in done.stderr.splitlines() if line.startswith("MAXRSS_KIB")).split()[1]
    )
    return {"requests": run["requests"], "wall_s": round(wall, 1), "generation_s": run["generation_s"], "driver_peak_rss_mib": round(peak_kib / 1024, 1),
            "timeline": run.get("timeline")}  # fmt: skip


def child(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="dispatch-scale-") as folder:
        store_dir = Path(args.keep_store) if args.keep_store else Path(folder)
        row = measure(args.size, args.mode, args.replicas, args.window, args.samples, store_dir)
    print(json.dumps(row))


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10000,100000,1000000", help="requests per row, comma-separated")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--window", type=int, default=128, help="sequences in flight per replica")
    parser.add_argument("--samples", type=int, default=1, help="requests per prompt (mean@N's N)")
    parser.add_argument("--out", type=Path, help="append one JSON row per size and mode to this file")
    parser.add_argument("--keep-store", help="write the store here instead of a temporary folder")
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)  # the child process's one size
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse()
    if args.size:
        child(args)
        return
    common = ["--replicas", str(args.replicas), "--window", str(args.window), "--samples", str(args.samples)]
    for mode in args.modes.split(","):
        if mode == "real-run":
            emit({"mode": mode, "command": "rayeval run " + " ".join(REAL_RUN).replace(str(REPO.parent), ".."),
                  **real_run()}, args.out)  # fmt: skip
            continue
        for size in (int(s) for s in args.sizes.split(",")):
            command = [sys.executable, __file__, "--size", str(size), "--mode", mode, *common]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            emit({"mode": mode, "replicas": args.replicas, "window": args.window, "samples": args.samples,
                  **json.loads(done.stdout)}, args.out)  # fmt: skip


def emit(row: dict, out: Path | None) -> None:
    row = {"benchmark": "dispatch-scale", **row, "machine": f"{platform.node()} ({os.cpu_count()} cores)",
           "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M")}  # fmt: skip
    print(json.dumps(row), flush=True)
    if out:
        with out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
