"""Two runs sharing one warm pool (issue 48): started together on the pool, against the same two one after
the other on the pool, and against two cold runs one after the other.

    # one H200 (after `python3 -m bench.gpu --config build`; see docs/BENCHMARKS.md, "How to re-run"):
    python3 bench/pool_sharing.py --out $OUT/pool-sharing.jsonl --model /tmp/rayeval-gpu-bench/random-llama-1b \\
        --ifeval-data ~/gw/x/gpu-extras/ifeval.jsonl --gsm8k-data .gpu/gsm8k/test.jsonl --replicas 1
    # this machine's CPU, the embedded model, smaller runs:
    python bench/pool_sharing.py --out bench/results/pool-sharing-cpu.jsonl --replicas 2 --limit-a 40 \\
        --limit-b 40 --samples 2 --max-tokens 64 --gsm8k-data ../shared/data/gsm8k/test.jsonl

Run A is IFEval (541 prompts by default) and run B GSM8K from a local file (500), each `--samples` samples at
temperature 0.7. On a `ray start` cluster of this machine, in this order: `cold` (A then B, each starting and
stopping its own engines), `rayeval up` (one pool of `--replicas`, timed apart), then `--repeats` rounds of
`pool-sequential` (A then B on the pool) and `pool-together` (A and B started at once on it). Every row holds
each run's wall time, when its first sample record appeared (seconds after the side began: a run that waited
for the other to finish would show it), its records against the samples asked (each sample once), and, where
NVIDIA's tools exist, the GPUs' busy fraction (NVML's utilization, sampled every 0.5 s) over the side.
The pool's engines keep their prefix cache between sides: the first pool side meets the prompts for the first
time, later ones do not, so compare sides of the same round after the first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.gpu_warm import rayeval, start_cluster  # noqa: E402
from bench.rows import write_row  # noqa: E402

SAMPLING = ["--temperature", "0.7", "--no-progress"]


@dataclass(frozen=True)
class Run:
    """One of the two runs: its task, data file and size."""

    name: str
    task: str
    data: str
    limit: int

    def argv(self, args: argparse.Namespace, address: str, work: Path, run_id: str) -> list[str]:
        model = ["--model", args.model] if args.model else []
        return ["run", "--address", address, *model, "--tasks", self.task, "--data-path", f"{self.task}={self.data}",
                "--limit", str(self.limit), "--num-samples", str(args.samples), "--max-tokens", str(args.max_tokens),
                "--replicas", str(args.replicas), *SAMPLING, "--output-dir", str(work), "--run-id", run_id]  # fmt: skip


class GpuBusy:
    """NVML's utilization of every GPU, sampled by `nvidia-smi` every 0.5 s while the side runs."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> GpuBusy:
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _sample(self) -> None:
        query = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            out = subprocess.run(query, capture_output=True, text=True, check=False).stdout.split()
            if out:
                self.samples.append(sum(float(v) for v in out) / len(out) / 100)
            self._stop.wait(0.5)

    def fraction(self) -> float | None:
        return round(sum(self.samples) / len(self.samples), 3) if self.samples else None


def start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """The run's output goes to a file: a pipe nobody reads until the end fills up and stops the run."""
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cluster.cli", *argv], stdout=out, stderr=subprocess.STDOUT
        )


def records_of(work: Path, run_id: str) -> list[dict]:
    return [
        json.loads(line)
        for path in (work / run_id / "samples").glob("*/*.jsonl")
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def finished(work: Path, run_id: str, returncode: int, asked: int) -> dict:
    """What an ended run left: its records against the samples asked, or the end of its output."""
    if returncode != 0:
        return {"failed": (work / f"{run_id}.log").read_text()[-2000:]}
    found = records_of(work, run_id)
    summary = json.loads((work / run_id / "summary.json").read_text())["run"]
    return {"records": len(found), "distinct_samples": len({(r["doc_id"], r["sample_index"]) for r in found}),
            "asked": asked, "engines_source": summary.get("engines_source"),
            "generation_s": summary.get("generation_s")}  # fmt: skip


def side(name: str, launches: list[list[tuple[Run, str, list[str]]]], work: Path, samples: int) -> dict:
    """Each inner list starts together; the lists run one after the other. Returns the side's row."""
    began = time.perf_counter()
    runs: dict[str, dict] = {}
    with GpuBusy() as busy:
        for together in launches:
            procs = {
                run_id: (run, start(argv, work / f"{run_id}.log"), time.perf_counter())
                for run, run_id, argv in together
            }
            pending = set(procs)
            while pending:
                for run_id in list(pending):
                    run, proc, started = procs[run_id]
                    row = runs.setdefault(run_id, {"run": run.name, "started_s": round(started - began, 2)})
                    if "first_record_s" not in row and records_of(work, run_id):
                        row["first_record_s"] = round(time.perf_counter() - began, 2)
                    if proc.poll() is not None:
                        row |= {"ended_s": round(time.perf_counter() - began, 2),
                                "wall_s": round(time.perf_counter() - started, 2)}  # fmt: skip
                        row |= finished(work, run_id, proc.returncode, run.limit * samples)
                        pending.discard(run_id)
                time.sleep(0.2)
    return {"side": name, "wall_s": round(time.perf_counter() - began, 2), "gpu_busy_fraction": busy.fraction(),
            "gpu_busy_samples": len(busy.samples), "runs": runs}  # fmt: skip


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/rayeval-pool-sharing"))
    parser.add_argument("--model", help="model folder (default: the embedded one)")
    parser.add_argument("--ifeval-data", help="IFEval's prompts (default: the installed package's)")
    parser.add_argument("--gsm8k-data", required=True, help="GSM8K's test set as JSON lines")
    parser.add_argument("--limit-a", type=int, default=541)
    parser.add_argument("--limit-b", type=int, default=500)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-cold", action="store_true", help="leave out the cold side")
    parser.add_argument(
        "--budget-s", type=float, default=0, help="start no new pool round after this (0: none)"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    ifeval = args.ifeval_data or _installed_ifeval()
    a = Run("ifeval", "ifeval", ifeval, args.limit_a)
    b = Run("gsm8k", "gsm8k", str(Path(args.gsm8k_data).resolve()), args.limit_b)
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    began = time.perf_counter()
    process, address = start_cluster(args.work)
    common = {"replicas": args.replicas, "samples": args.samples, "max_tokens": args.max_tokens,
              "limits": [a.limit, b.limit], "model": args.model or "embedded"}  # fmt: skip
    try:
        cold = ["--no-warm-pools", "--keep-warm", "off"]
        launches = [
            [(r, f"cold-{r.name}", [*r.argv(args, address, args.work, f"cold-{r.name}"), *cold])]
            for r in (a, b)
        ]
        if not args.no_cold:
            write_row(args.out, common | side("cold-sequential", launches, args.work, args.samples))
        up_began = time.perf_counter()
        model = ["--model", args.model] if args.model else []
        up = rayeval("up", "--address", address, *model, "--replicas", str(args.replicas), "--name", "shared")
        write_row(args.out, common | {"side": "up", "wall_s": round(time.perf_counter() - up_began, 2),
                                      "ok": up.returncode == 0, "stderr": up.stderr[-1500:] if up.returncode else ""})  # fmt: skip
        for round_ in range(args.repeats):
            if args.budget_s and time.perf_counter() - began > args.budget_s:
                break
            ids = {r.name: f"r{round_}-seq-{r.name}" for r in (a, b)}
            launches = [[(r, ids[r.name], r.argv(args, address, args.work, ids[r.name]))] for r in (a, b)]
            write_row(
                args.out,
                common | {"round": round_} | side("pool-sequential", launches, args.work, args.samples),
            )
            ids = {r.name: f"r{round_}-together-{r.name}" for r in (a, b)}
            launches = [[(r, ids[r.name], r.argv(args, address, args.work, ids[r.name])) for r in (a, b)]]
            write_row(
                args.out,
                common | {"round": round_} | side("pool-together", launches, args.work, args.samples),
            )
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def _installed_ifeval() -> str:
    from evaluators.data import package_data_file
    from evaluators.tasks.ifeval import PACKAGED

    return str(package_data_file(*PACKAGED))


if __name__ == "__main__":
    main()
