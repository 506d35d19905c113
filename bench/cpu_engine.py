"""CPU engine settings end to end, as a user runs `rayeval run`: eager against compiled, bfloat16 against float32.

Workloads: the embedded demo (`rayeval run`: 20 IFEval prompts, IFEval's own max_tokens 1280), the same
prompts with max_tokens 256 (`demo-256`), and a 500-prompt IFEval run (max_tokens 256). Each configuration is one `rayeval run` process timed from start to
exit, with the engine start and generation time read from its summary.json:

- `eager-*`: `--enforce-eager` (no torch.compile, no CUDA-graph-like capture);
- `compiled-cold-*`: compiled, with an empty vLLM compile cache (a user's first run);
- `compiled-warm-*`: compiled again over the cache the cold run left (every later run);
- `*-bf16` / `*-fp32`: the weights in bfloat16 or float32.

    python bench/cpu_engine.py                     # every workload and configuration; rows to bench/results/
    python bench/cpu_engine.py --workloads demo-256 --configs eager-bf16,eager-fp32 --repeats 2

Rows go to bench/results/cpu-engine.jsonl, one JSON object per run, with the machine and commit. (Rows
without a `dtype` field were measured in bfloat16, the CPU default then, under the config names `eager`,
`compiled-cold` and `compiled-warm`.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.rows import commit_of  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "cpu-engine.jsonl"
WORKLOADS = {
    "demo": [],
    "demo-256": [
        "--max-tokens",
        "256",
    ],  # the demo's prompts with shorter answers: generation rate per config
    "ifeval-500": ["--tasks", "ifeval", "--limit", "500", "--max-tokens", "256"],
}
CONFIGS = {
    "eager-bf16": ["--enforce-eager", "--dtype", "bfloat16"],
    "eager-fp32": ["--enforce-eager", "--dtype", "float32"],
    "compiled-cold-fp32": ["--no-enforce-eager", "--dtype", "float32"],
    "compiled-warm-fp32": ["--no-enforce-eager", "--dtype", "float32"],
}


def run_once(workload: str, config: str, cache_root: Path, out: Path) -> dict:
    run_id = f"{workload}-{config}-{time.strftime('%H%M%S')}"
    argv = [sys.executable, "-m", "cluster.cli", "run", *WORKLOADS[workload], *CONFIGS[config],
            "--no-progress", "--output-dir", str(out), "--run-id", run_id]  # fmt: skip
    env = {**os.environ, "VLLM_CACHE_ROOT": str(cache_root)}
    began = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{workload}/{config} failed:\n{done.stderr[-3000:]}")
    summary = json.loads((out / run_id / "summary.json").read_text())["run"]
    return {
        "workload": workload,
        "config": config,
        "process_wall_s": round(wall, 2),
        "dtype": summary["engines"][0]["dtype"],
        "engine_start_s": round(summary["engines"][0]["start_s"], 2),
        "generation_s": summary["generation_s"],
        "requests": summary["requests"],
        "output_tokens": output_tokens(out / run_id),
    }


def output_tokens(run_dir: Path) -> int:
    total = 0
    for path in (run_dir / "samples").rglob("*.jsonl"):
        total += sum(json.loads(line)["output_tokens"] for line in path.read_text().splitlines() if line)
    return total


def machine() -> dict:
    commit = commit_of()
    return {
        "cpus": len(os.sched_getaffinity(0)),
        "cpu": platform.processor() or platform.machine(),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="comma-separated: demo, demo-256, ifeval-500"
    )
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, in this order")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of every configuration")
    args = parser.parse_args()
    for name, known in (("workloads", WORKLOADS), ("configs", CONFIGS)):
        unknown = set(getattr(args, name).split(",")) - set(known)
        if unknown:
            parser.error(f"--{name}: unknown {sorted(unknown)}; known: {', '.join(known)}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    info = machine()
    with tempfile.TemporaryDirectory() as scratch:
        for workload in args.workloads.split(","):
            for repeat in range(args.repeats):
                cache = Path(scratch) / f"vllm-cache-{workload}-{repeat}"  # empty: the cold run compiles
                for config in args.configs.split(","):
                    row = run_once(workload, config, cache, Path(scratch) / "runs") | {
                        "repeat": repeat,
                        **info,
                    }
                    print(json.dumps(row), flush=True)
                    with RESULTS.open("a") as handle:
                        handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
