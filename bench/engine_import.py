"""What an engine process's vLLM import costs, with and without scikit-learn (cluster/engines/lean_imports.py),
in fresh processes, paired turns alternating which side goes first.

    python bench/engine_import.py --out bench/results/engine-import-sklearn.jsonl --repeats 3

Each side imports what an engine actor and its engine-core server import (`vllm`, `AsyncLLM`, vLLM's engine
core); `lean` imports cluster.engines.lean_imports first. Each row: the side, the wall seconds of the imports
in that process, whether scikit-learn and pandas were loaded, the commit and this CPU's facts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.serve_speed import write_row  # noqa: E402

IMPORTS = """
import json, sys, time
began = time.perf_counter()
if sys.argv[1] == "lean":
    import cluster.engines.lean_imports
import vllm
from vllm.v1.engine.async_llm import AsyncLLM
import vllm.v1.engine.core
print(json.dumps({"import_s": round(time.perf_counter() - began, 3), "sklearn_loaded": "sklearn" in sys.modules,
                  "pandas_loaded": "pandas" in sys.modules}))
"""


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
    parser.add_argument("--repeats", type=int, default=3, help="turns; each imports on both sides")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    common = {"commit": commit.stdout.strip(), "cpu_native_bf16": cpu_has_native_bf16()}
    sides = ["with-sklearn", "lean"]
    for turn in range(args.repeats):
        for side in sides[turn % 2 :] + sides[: turn % 2]:
            write_row(args.out, {"turn": turn, "side": side, **one_side(side), **common})


if __name__ == "__main__":
    main()
