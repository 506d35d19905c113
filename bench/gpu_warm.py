"""On the lent GPU machine: the same run cold (its own engine) and warm (on a pool `rayeval up` started), with
where a cold run's time outside generation goes.

    python3 bench/gpu_warm.py --out $OUT/gpu-warm.jsonl        # after `python3 -m bench.gpu --config build`

The run is issue 42's: the random 1.1B Llama of `bench.gpu` (bf16, CUDA graphs), `--tasks ifeval --limit 541
--num-samples 4 --temperature 0.7 --max-tokens 256` (2,164 requests), on a `ray start` cluster of this
machine. Sides in this order: `cold` (`--no-warm-pools --keep-warm off`), then `rayeval up` (timed apart),
then `warm`. Each row: the process's wall time, its timeline (`--profile-startup`), generation seconds,
the time outside generation (wall minus generation), and for a cold run each engine's own build time,
vLLM's import in its actor and when the actor began its work, against the process's start.
IFEval's prompts come from RAYEVAL_IFEVAL_DATA (the shipped copy, as the other GPU benches read it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.gpu.workloads import RANDOM_MODEL  # noqa: E402
from bench.rows import write_row  # noqa: E402
from bench.serve_speed import free_port  # noqa: E402

RUN = [
    "--tasks",
    "ifeval",
    "--limit",
    "541",
    "--num-samples",
    "4",
    "--temperature",
    "0.7",
    "--max-tokens",
    "256",
]


def start_cluster(work: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    ray = [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]
    process = subprocess.Popen(
        [*ray, "start", "--head", "--block", f"--port={port}", f"--temp-dir={work / 'ray'}", "--include-dashboard=false",
         "--disable-usage-stats", f"--dashboard-agent-listen-port={free_port()}"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        probe = rayeval("pools", "--address", address)
        if probe.returncode == 0:
            return process, address
        time.sleep(2)
    raise SystemExit(f"the Ray cluster did not come up: {probe.stderr[-2000:]}")


def rayeval(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args], capture_output=True, text=True, check=False
    )


def side(address: str, work: Path, name: str, data: str, *extra: str) -> dict:
    started_at = time.time()
    began = time.perf_counter()
    done = rayeval("run", "--address", address, "--model", str(RANDOM_MODEL), "--data-path", f"ifeval={data}",
                   *RUN, *extra, "--no-progress", "--profile-startup", "--output-dir", str(work), "--run-id", name)  # fmt: skip
    wall = round(time.perf_counter() - began, 2)
    if done.returncode != 0:
        return {"side": name, "failed": done.stderr[-3000:]}
    run = json.loads((work / name / "summary.json").read_text())["run"]
    engines = [
        {"start_s": e["start_s"], "import_s": e.get("import_s"), "max_num_seqs": e["max_num_seqs"],
         "actor_began_after_s": round(e["actor_created_at"] - started_at, 2) if e.get("actor_created_at") else None}
        for e in run["engines"]
    ]  # fmt: skip
    return {"side": name, "wall_s": wall, "generation_s": run["generation_s"],
            "outside_generation_s": round(wall - run["generation_s"], 2), "timeline": run["timeline"],
            "engines": engines, "engines_source": run["engines_source"], "tokens": run.get("tokens")}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/rayeval-gpu-warm"))
    args = parser.parse_args()
    data = os.environ["RAYEVAL_IFEVAL_DATA"]
    args.work.mkdir(parents=True, exist_ok=True)
    process, address = start_cluster(args.work)
    try:
        write_row(args.out, side(address, args.work, "cold", data, "--no-warm-pools", "--keep-warm", "off"))
        began = time.perf_counter()
        up = rayeval("up", "--address", address, "--model", str(RANDOM_MODEL), "--name", "gpu")
        write_row(args.out, {"side": "up", "wall_s": round(time.perf_counter() - began, 2), "ok": up.returncode == 0,
                             "stdout": up.stdout[-500:], "stderr": up.stderr[-1500:] if up.returncode else ""})  # fmt: skip
        write_row(args.out, side(address, args.work, "warm", data))
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


if __name__ == "__main__":
    main()
