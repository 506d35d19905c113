"""rayeval's endpoint path alone: `rayeval run --model openai:NAME` against a loopback server that answers every
request after a fixed latency (the API judge tests' stand-in, tests/judge_api_standin.py: a benchmark device,
no model), so what is measured is the client side (dispatcher, client actor, rate limiter, store, scoring).

    python bench/endpoint_overhead.py --out bench/results/endpoint-overhead.jsonl
    python bench/endpoint_overhead.py --out ... --latency 0.5 --limit 512 --rates 100,100000

Each row: the run's generation time (first request handed out to last result) against the ideal
ceil(limit / concurrency) x latency, at each `--requests-per-second` (the cluster-wide limiter spaces grants
1/rps apart, without bursts), and the most requests the server saw at once.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.rows import write_row  # noqa: E402
from bench.serve_speed import rayeval_cmd  # noqa: E402
from tests.judge_api_standin import JudgeApiStandin  # noqa: E402

ANSWER = "Hello. This answer has two sentences."


def measure(latency_s: float, limit: int, concurrency: int, rate: str) -> dict:
    with (
        JudgeApiStandin(answer=lambda _messages: ANSWER, latency_s=latency_s) as standin,
        tempfile.TemporaryDirectory(prefix="endpoint-overhead-") as out,
    ):
        command = rayeval_cmd(
            "run", "--model", "openai:standin", "--base-url", standin.base_url, "--tasks", "ifeval",
            "--limit", str(limit), "--no-progress", "--output-dir", out, "--run-id", "overhead",
            "--requests-per-second", rate, "--max-concurrency", str(concurrency),
        )  # fmt: skip
        began = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        wall = round(time.perf_counter() - began, 2)
        if done.returncode != 0:
            raise SystemExit(f"the run failed:\n{done.stderr[-3000:]}")
        run = json.loads((Path(out) / "overhead" / "summary.json").read_text())["run"]
        requests = len(standin.log())
    ideal = -(-requests // concurrency) * latency_s
    return {"benchmark": "endpoint-overhead", "requests_per_second": float(rate), "latency_s": latency_s,
            "requests": requests, "concurrency": concurrency, "wall_s": wall, "generation_s": run["generation_s"],
            "ideal_s": ideal, "peak_in_flight": standin.peak_in_flight}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="JSONL file the rows are appended to")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds the server takes per request")
    parser.add_argument("--limit", type=int, default=512, help="IFEval prompts (541 at most)")
    parser.add_argument("--concurrency", type=int, default=64, help="--max-concurrency")
    parser.add_argument("--rates", default="100,100000", help="--requests-per-second values, comma-separated")
    args = parser.parse_args()
    for rate in args.rates.split(","):
        write_row(args.out, measure(args.latency, args.limit, args.concurrency, rate))


if __name__ == "__main__":
    main()
