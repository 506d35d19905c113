"""A small run end to end: `rayeval run` against `vllm.LLM.chat` in one script and against `vllm serve` with
64 client threads, each a process (or two) timed from start to exit, in paired turns.

    python bench/small_run.py --out bench/results/small-run.jsonl                 # 100 IFEval prompts, 512 tokens
    python bench/small_run.py --out ... --limit 1000 --max-tokens 256 --repeats 1
    python bench/small_run.py --out ... --sides demo,help,dry-run                  # the CLI's own fixed costs

Same prompts (IFEval's first N, the model's chat template), greedy, same engine settings (the embedded
SmolLM2 in the dtype rayeval resolves `--dtype` to, default auto: bfloat16 where this CPU computes it natively,
else float32 (bench/dtypes.py); max_model_len 2048, max_num_seqs 64, eager, no chunked prefill, 1 GiB KV
cache, the engine's threads bound to this process's cores). Every row records the dtype and the CPU. Sides:
- `llm-chat`: one script: import vLLM, build `vllm.LLM`, `llm.chat` over the prompts, exit (no scoring);
- `vllm-serve`: `vllm serve` started, then a 64-thread `openai` client process; the wall is the server's start
  plus the client's (no scoring);
- `rayeval`: `rayeval run --tasks ifeval --limit N --max-tokens M` (scored, files written), its
  `--profile-startup` timeline kept in the row;
- `demo`: `rayeval run` as `make demo` runs it (the embedded demo's 20 prompts), twice: the first and a
  second run of the same command;
- `help`, `dry-run`: `rayeval run --help` and `rayeval run --dry-run`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.dtypes import check_engine_dtype, dtype_fields, side_dtype  # noqa: E402
from bench.rows import commit_of, write_row  # noqa: E402
from bench.serve_speed import (  # noqa: E402
    chat_messages,
    cpu_engine_env,
    output_tokens,
    printed,
    timed,
    vllm_serve_side,
)

LLM_CHAT = """
import json, sys
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    model, conversations, max_tokens, dtype = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    llm = LLM(model=model, dtype=dtype, max_model_len=2048, max_num_seqs=64, enforce_eager=True,
              enable_chunked_prefill=False, max_num_batched_tokens=2048)
    outputs = llm.chat(json.load(open(conversations)), SamplingParams(temperature=0, max_tokens=max_tokens),
                       use_tqdm=False)
    print("TOKENS", sum(len(o.outputs[0].token_ids) for o in outputs))
"""


def side_llm_chat(args: argparse.Namespace, work: Path) -> dict:
    from cluster.models import resolve_model

    conversations = work / "conversations.json"
    conversations.write_text(json.dumps(chat_messages(args.limit)))
    model = resolve_model(None).path
    wall, done = timed(
        [sys.executable, "-c", LLM_CHAT, model, str(conversations), str(args.max_tokens), args.engine_dtype],
        cpu_engine_env(),
    )
    return {"wall_s": wall, "output_tokens": int(printed(done.stdout, "TOKENS"))}


def side_vllm_serve(args: argparse.Namespace, work: Path) -> dict:
    return vllm_serve_side(work, args.limit, args.max_tokens, dtype=args.engine_dtype)


def side_rayeval(args: argparse.Namespace, work: Path) -> dict:
    run_id = f"r{time.time_ns()}"
    command = [sys.executable, "-m", "cluster.cli", "run", "--tasks", "ifeval", "--limit", str(args.limit),
               "--max-tokens", str(args.max_tokens), "--dtype", args.dtype, "--no-progress", "--profile-startup",
               "--output-dir", str(work), "--run-id", run_id]  # fmt: skip
    wall, _ = timed(command)
    run = json.loads((work / run_id / "summary.json").read_text())["run"]
    check_engine_dtype(run, args.engine_dtype)
    return {"wall_s": wall, "output_tokens": output_tokens(work / run_id), "timeline": run["timeline"]}


def side_demo(args: argparse.Namespace, work: Path) -> dict:
    command = [
        sys.executable,
        "-m",
        "cluster.cli",
        "run",
        "--no-progress",
        "--dtype",
        args.dtype,
        "--output-dir",
        str(work / "demo"),
    ]
    first, _ = timed([*command, "--run-id", "first"])
    second, _ = timed([*command, "--run-id", "second"])
    return {"first_s": first, "second_s": second}


def side_help(args: argparse.Namespace, work: Path) -> dict:
    return {"wall_s": timed([sys.executable, "-m", "cluster.cli", "run", "--help"])[0]}


def side_dry_run(args: argparse.Namespace, work: Path) -> dict:
    return {"wall_s": timed([sys.executable, "-m", "cluster.cli", "run", "--dry-run"])[0]}


SIDES = {
    "llm-chat": side_llm_chat,
    "vllm-serve": side_vllm_serve,
    "rayeval": side_rayeval,
    "demo": side_demo,
    "help": side_help,
    "dry-run": side_dry_run,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="JSONL file the rows are appended to")
    parser.add_argument("--sides", default="llm-chat,vllm-serve,rayeval")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument(
        "--dtype", default="auto", help="rayeval's --dtype; every side runs in what it resolves to"
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="turns; each turn runs every side, order rotated"
    )
    args = parser.parse_args()
    args.engine_dtype = side_dtype(args.dtype, "cpu")
    sides = args.sides.split(",")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    commit = commit_of()
    for turn in range(args.repeats):
        order = sides[turn % len(sides) :] + sides[: turn % len(sides)]
        for side in order:
            with tempfile.TemporaryDirectory(prefix="small-run-") as folder:
                row = {"side": side, "turn": turn, **SIDES[side](args, Path(folder))}
            row |= {"limit": args.limit, "max_tokens": args.max_tokens, "commit": commit,
                    **dtype_fields(args.dtype, "cpu")}  # fmt: skip
            write_row(args.out, row)


if __name__ == "__main__":
    main()
