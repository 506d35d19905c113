"""A one-worker CPU engine's worker in a process of its own (vLLM's CPU default, its `mp` executor) against inside
the engine core (`uni`, what rayeval's replicas run): the engine's start and its generation, and whether the
answers are the same.

Each turn is one process: import vLLM, build `AsyncLLM` for the embedded SmolLM2 (eager, max_model_len 1024,
1 GiB KV cache, the engine's threads on this process's cores), generate greedily for GSM8K's first 64
questions (128 new tokens), exit. `uni` is set up as rayeval's engine actor does it: the executor chosen after
vLLM built the config, and the OpenMP variables vLLM's mp executor gives its worker process set for the
process whose engine core inherits them. Executors alternate in paired turns.

    python bench/cpu_executor.py --out bench/results/cpu-executor.jsonl --repeats 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.rows import commit_of  # noqa: E402

GSM8K = REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
EXECUTORS = ("mp", "uni")


async def turn(executor: str, dtype: str, answers_to: Path) -> dict:
    """One engine: its start and its generation, timed; the answers written to `answers_to`."""
    began = time.perf_counter()
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    from cluster.models import ensure_default_model

    imported = time.perf_counter() - began
    args = AsyncEngineArgs(model=str(ensure_default_model()), dtype=dtype, max_model_len=1024, enforce_eager=True,
                           enable_prefix_caching=True, disable_log_stats=True)  # fmt: skip
    config = args.create_engine_config(UsageContext.LLM_CLASS)
    if executor == "uni":
        config.parallel_config.distributed_executor_backend = "uni"
    started = time.perf_counter()
    engine = AsyncLLM.from_vllm_config(config, usage_context=UsageContext.LLM_CLASS, disable_log_stats=True)
    start_s = time.perf_counter() - started
    questions = [json.loads(line)["question"] for line in GSM8K.read_text().splitlines()[:64]]
    greedy = SamplingParams(max_tokens=128, temperature=0)

    async def answer(index: int, question: str) -> str:
        final = None
        async for output in engine.generate(f"Question: {question}\nAnswer:", greedy, request_id=str(index)):
            final = output
        return final.outputs[0].text

    generating = time.perf_counter()
    answers = await asyncio.gather(*(answer(i, q) for i, q in enumerate(questions)))
    generation_s = time.perf_counter() - generating
    engine.shutdown()
    answers_to.write_text(json.dumps(answers))
    return {
        "import_s": round(imported, 2),
        "engine_start_s": round(start_s, 2),
        "generation_s": round(generation_s, 2),
    }


def run_turn(executor: str, dtype: str, answers_to: Path) -> dict:
    """`turn` in a fresh process, sized and bound as rayeval's pool sizes and binds a one-worker CPU replica by
    default (1 GiB of KV cache through vLLM's variable here, an engine argument in rayeval)."""
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": cores}
    if executor == "uni":
        from cluster.engines import single_worker_omp_env

        env |= single_worker_omp_env(cores)
    began = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--turn", executor, "--dtype", dtype, "--answers", str(answers_to)],
                          capture_output=True, text=True, env=env, cwd=REPO, check=False)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the {executor} turn failed:\n{done.stderr[-3000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    return row | {"process_wall_s": round(time.perf_counter() - began, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="JSONL file the rows are appended to")
    parser.add_argument("--repeats", type=int, default=2, help="paired turns (mp then uni) per dtype")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--turn", choices=EXECUTORS, help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="bfloat16", help=argparse.SUPPRESS)
    parser.add_argument("--answers", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.turn:
        print(json.dumps(asyncio.run(turn(args.turn, args.dtype, args.answers))))
        return
    if args.out is None:
        parser.error("--out is required")
    commit = commit_of()
    with tempfile.TemporaryDirectory() as scratch:
        for dtype in args.dtypes.split(","):
            for repeat in range(args.repeats):
                for record in paired_turns(dtype, Path(scratch)):
                    record |= {"repeat": repeat, "commit": commit}
                    print(json.dumps(record), flush=True)
                    with args.out.open("a") as sink:
                        sink.write(json.dumps(record) + "\n")


def paired_turns(dtype: str, scratch: Path) -> list[dict]:
    """One turn of each executor, and how many of the 64 answers the two gave alike."""
    answers = {e: scratch / f"{e}.json" for e in EXECUTORS}
    rows = {e: run_turn(e, dtype, answers[e]) for e in EXECUTORS}
    mp, uni = (json.loads(answers[e].read_text()) for e in EXECUTORS)
    same = sum(a == b for a, b in zip(mp, uni, strict=True))
    machine = {"machine": platform.node(), "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}
    return [
        {"executor": e, "dtype": dtype, "same_answers": same, "questions": 64, **row, **machine}
        for e, row in rows.items()
    ]


if __name__ == "__main__":
    main()
