"""What an engine process's vLLM import costs, with and without scikit-learn (cluster/engines/lean_imports.py)
and with and without the collector paused (cluster/engines/import_gc.py), in fresh processes, paired turns
rotating which side goes first.

    python bench/engine_import.py --out bench/results/engine-import-sklearn.jsonl --repeats 3
    python bench/engine_import.py --out bench/results/engine-import-gc.jsonl --sides lean,lean-gc-paused

Each side imports what an engine actor and its engine-core server import (`vllm`, `AsyncLLM`, vLLM's engine
core); `lean` imports cluster.engines.lean_imports first; `lean-gc-paused` does so with the collector paused,
as the engine processes do. Each row: the side, the wall and CPU seconds of the imports in that process,
whether scikit-learn and pandas were loaded, the commit and this CPU's facts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.rows import commit_of, write_row  # noqa: E402

IMPORTS = """
import contextlib, json, sys, time
began, cpu_began = time.perf_counter(), time.process_time()
side = sys.argv[1]
paused = contextlib.nullcontext()
if side.endswith("gc-paused"):
    from cluster.engines.import_gc import collector_paused
    paused = collector_paused()
with paused:
    if side.startswith("lean"):
        import cluster.engines.lean_imports
    import vllm
    from vllm.v1.engine.async_llm import AsyncLLM
    import vllm.v1.engine.core
print(json.dumps({"import_s": round(time.perf_counter() - began, 3),
                  "import_cpu_s": round(time.process_time() - cpu_began, 3),
                  "sklearn_loaded": "sklearn" in sys.modules, "pandas_loaded": "pandas" in sys.modules}))
"""
SIDES = ("with-sklearn", "lean", "lean-gc-paused")


def one_side(side: str) -> dict:
    done = subprocess.run([sys.executable, "-c", IMPORTS, side], capture_output=True, text=True, cwd=REPO,
                          check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    from cluster.engines import cpu_has_native_bf16

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="JSONL file the rows are appended to")
    parser.add_argument("--repeats", type=int, default=3, help="turns; each imports on every side")
    parser.add_argument(
        "--sides", default="with-sklearn,lean", help=f"comma-separated, of {', '.join(SIDES)}"
    )
    args = parser.parse_args()
    common = {"commit": commit_of(), "cpu_native_bf16": cpu_has_native_bf16()}
    sides = args.sides.split(",")
    unknown = sorted(set(sides) - set(SIDES))
    if unknown:
        parser.error(f"--sides: unknown {', '.join(unknown)}; choose from {', '.join(SIDES)}")
    for turn in range(args.repeats):
        first = turn % len(sides)
        for side in sides[first:] + sides[:first]:
            write_row(args.out, {"turn": turn, "side": side, **one_side(side), **common})


if __name__ == "__main__":
    main()
