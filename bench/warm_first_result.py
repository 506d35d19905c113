"""The first result of a small run on a warm pool, from this checkout and, in turn, from another (`--base`).

    python3 bench/warm_first_result.py --address auto --base /tmp/base --out $OUT/first-result.jsonl \\
        --repeats 5 -- --model M --dtype auto --device gpu --max-model-len 2048 ...

The run is `rayeval run --address ADDRESS --tasks ifeval --limit 20 --max-tokens 256 --profile-startup` with
the flags after `--`: the engine flags of a pool already up (`rayeval up` with the same flags), and IFEval's
`--data-path` where the machine needs one. The pool answers, so what differs between the two checkouts is the
command's own time before its first request and after its last result. Turns alternate (base, this, base,
this...) after one untimed run that renders and caches the prompts. Each row: the side, its commit, the
process's wall time and its timeline (`--profile-startup`: CLI imported, planned, Ray joined, first request
out, first and last result).

`--cold`: no pool; each run starts its own local Ray cluster and engines (the flags after `--` are the
engines'), so the pairs measure an engine's cold start: rows add the marks "engine actors launched" and
"engines ready" and each engine's `import_s` (the actor's vLLM import) and `start_s` (the engine's build).
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

from bench.rows import commit_of, write_row  # noqa: E402

RUN = ["--tasks", "ifeval", "--limit", "20", "--max-tokens", "256", "--no-progress", "--profile-startup"]
MARKS = ("cli imported", "planned", "ray started", "first request handed out", "first result", "last result")
COLD_MARKS = ("engine actors launched", "engines ready")


def turn(checkout: Path, address: str | None, flags: list[str], work: Path, name: str) -> dict:
    """One run from `checkout` (its own modules first on the path: `python -m` from its root); `address`
    None: a cold run on a local cluster of its own."""
    where = ["--address", address] if address else []
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "cluster.cli", "run", *where, *RUN, *flags,
                           "--output-dir", str(work), "--run-id", name], cwd=checkout, capture_output=True,
                          text=True, check=False)  # fmt: skip
    wall = round(time.perf_counter() - began, 3)
    if done.returncode != 0:
        return {"run": name, "failed": done.stderr[-3000:]}
    run = json.loads((work / name / "summary.json").read_text())["run"]
    timeline = run.get("timeline", {})
    marks = MARKS if address else MARKS + COLD_MARKS
    row = {"run": name, "wall_s": wall, **{f"{m.replace(' ', '_')}_s": timeline.get(m) for m in marks}}
    if address:
        row["pool"] = next((line for line in done.stdout.splitlines() if "engines: warm" in line), "").strip()
    else:
        row["engines"] = [{k: e.get(k) for k in ("name", "import_s", "start_s")} for e in run["engines"]]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="JSONL file the rows are appended to")
    parser.add_argument("--address", default="auto", help="the Ray cluster with the warm pool")
    parser.add_argument("--cold", action="store_true", help="no pool: each run starts its own cluster")
    parser.add_argument("--base", type=Path, help="another checkout to run in turn with this one")
    parser.add_argument("--repeats", type=int, default=5, help="turns per checkout")
    parser.add_argument("--label", default="", help="what the rows measure (machine, workload)")
    parser.add_argument(
        "flags", nargs=argparse.REMAINDER, help="-- then the pool's engine flags (and a --data-path)"
    )
    args = parser.parse_args()
    flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags
    sides = [("base", args.base), ("this", REPO)] if args.base else [("this", REPO)]
    commits = {name: commit_of(path) for name, path in sides}
    address = None if args.cold else args.address
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        first = turn(REPO, address, flags, work, "render")  # renders and caches the prompts: not a turn
        write_row(args.out, {"side": "this", "commit": commits["this"], "untimed": "renders the prompts",
                             "label": args.label, **first})  # fmt: skip
        for repeat in range(args.repeats):
            for name, path in sides:
                row = turn(path, address, flags, work, f"{name}-{repeat}")
                write_row(args.out, {"side": name, "commit": commits[name], "label": args.label, **row})


if __name__ == "__main__":
    main()
