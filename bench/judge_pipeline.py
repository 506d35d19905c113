"""Generate-then-judge against the pipelined run, on the same prompts, model and local judge.

    python bench/judge_pipeline.py [--limit 48] [--tasks alpaca_eval] [--out bench/out/judge_pipeline.json]

Sequential is what two-phase tools do: `rayeval run --inference-only` (generation only), then
`rayeval run --judge-only` on the stored outputs. Pipelined is one `rayeval run --judge local:...`, where
judging starts on the first finished outputs. Each mode gets fresh run folders (nothing cached) and the
same engine flags; the summary's timeline gives the generation and judging intervals of the pipelined run.
Both the model under test and the judge are the embedded SmolLM2-135M-Instruct, one replica each.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from cluster.models import ensure_default_model


def rayeval(*args: str, cores: str | None = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Run the CLI; `cores` pins it (and the Ray cluster and engines it starts) to those cores."""
    pin = ["taskset", "-c", cores] if cores else []
    began = time.perf_counter()
    done = subprocess.run([*pin, sys.executable, "-m", "cluster.cli", *args], capture_output=True, text=True)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"rayeval {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall, done


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", default="alpaca_eval")
    parser.add_argument("--limit", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--judge-max-tokens", type=int, default=128)
    parser.add_argument("--eager", action="store_true", help="--enforce-eager engines (start faster)")
    parser.add_argument(
        "--same-cores",
        action="store_true",
        help="pin the sequential phases to the cores each engine has in the pipelined run (generation on "
        "core 0, judging on core 1), as when the model and the judge own separate GPUs; without it each "
        "sequential phase has the whole machine",
    )
    parser.add_argument("--out", default="bench/out/judge_pipeline.json")
    parser.add_argument("--runs-dir", default="bench/out/runs")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    judge = f"local:{ensure_default_model()}"
    stamp = str(int(time.time()))
    common = [
        "--tasks", args.tasks, "--limit", str(args.limit), "--max-tokens", str(args.max_tokens),
        "--judge-max-tokens", str(args.judge_max_tokens), "--max-model-len", "4096",
        "--output-dir", args.runs_dir, "--no-progress", *(["--enforce-eager"] if args.eager else []),
    ]  # fmt: skip

    seq_id = f"judge-seq-{stamp}"
    gen_cores, judge_cores = ("0", "1") if args.same_cores else (None, None)
    gen_wall, _ = rayeval("run", *common, "--run-id", seq_id, "--inference-only", cores=gen_cores)
    gen_summary = json.loads((Path(args.runs_dir) / seq_id / "summary.json").read_text())
    judge_wall, _ = rayeval(
        "run", *common, "--run-id", seq_id, "--judge-only", "--judge", judge, cores=judge_cores
    )
    seq_summary = json.loads((Path(args.runs_dir) / seq_id / "summary.json").read_text())

    pipe_id = f"judge-pipe-{stamp}"
    pipe_wall, _ = rayeval("run", *common, "--run-id", pipe_id, "--judge", judge)
    pipe_summary = json.loads((Path(args.runs_dir) / pipe_id / "summary.json").read_text())
    result = compare(args, gen_wall, judge_wall, pipe_wall, gen_summary, seq_summary, pipe_summary)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def compare(args, gen_wall, judge_wall, pipe_wall, gen_summary, seq_summary, pipe_summary) -> dict:
    """The sequential phases against the pipelined run, from their wall times and summaries."""
    seq_judge = seq_summary["run"]["judge"]
    timeline = pipe_summary["run"]["judge"]
    sequential = gen_wall + judge_wall
    return {
        "command": " ".join(["python", "bench/judge_pipeline.py", *sys.argv[1:]]),
        "tasks": args.tasks,
        "sequential_phases_pinned": "generation core 0, judging core 1" if args.same_cores else "no",
        "limit": args.limit,
        "sequential_wall_s": round(sequential, 1),
        "sequential_generate_wall_s": round(gen_wall, 1),
        "sequential_judge_wall_s": round(judge_wall, 1),
        "sequential_generation_active_s": gen_summary["run"]["generation_s"],
        "sequential_engine_start_s": gen_summary["run"]["engines"][0]["start_s"],
        "sequential_judge_start_s": seq_judge["start_s"],
        # judging_s starts at the first judge request, before the judge engine started: subtract the start
        "sequential_judging_active_s": round(seq_judge["judging_s"][1] - seq_judge["start_s"], 1),
        "pipelined_wall_s": round(pipe_wall, 1),
        "pipelined_over_sequential": round(pipe_wall / sequential, 3),
        "pipelined_timeline": {k: timeline[k] for k in ("generation_s", "judging_s", "overlap_s")},
        "pipelined_judge_start_s": timeline["start_s"],
        "pipelined_engine_start_s": pipe_summary["run"]["engines"][0]["start_s"],
        "pipelined_active_s": round(max(timeline["generation_s"][1], timeline["judging_s"][1]), 1),
        "judge_requests": timeline["requests"],
        "judge_failed": timeline["failed"],
        "samples_failed": {t: s["failed"] for t, s in pipe_summary["tasks"].items()},
    }


if __name__ == "__main__":
    main()
