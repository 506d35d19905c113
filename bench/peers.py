"""rayeval against its peers: same model, prompts, engine settings and machine, in paired turns.

    python bench/peers.py --out bench/results/peers.jsonl                      # CPU: every comparison
    python bench/peers.py --out $OUT/peers.jsonl --device gpu --model PATH --replicas 2 --comparisons lm-eval \
        --lm-eval-tasks gsm8k_mean4_local,gsm8k_mc_local --gsm8k data/gsm8k.jsonl --limit 200 --pairs 1

Each comparison alternates a peer and rayeval (ABBA order, `--pairs` pairs); every turn is its own processes,
timed from the first one's start to scored results (or, for peers that do not score, to their outputs), and
the row of a pair gives rayeval's wall time over the peer's. Comparisons:
- `lm-eval`: `lm_eval --model vllm` (its `simple_evaluate`, as its CLI calls it; data_parallel_size =
  `--replicas`) against `rayeval run --replicas R` over the same lm-eval task definitions on local data:
  GSM8K mean@4 (`repeats: 4`, generate_until), GSM8K multiple choice (log-likelihood) and lm-eval's IFEval
  (generation, 256 tokens). Both sides with rayeval's engine settings (the dtype rayeval resolves `--dtype`
  to, bench/dtypes.py; max_model_len 2048, max_num_seqs 64; on CPU eager, no chunked prefill, 1 GiB KV cache,
  bound cores). The row counts, per task, the documents whose prediction (text, or likeliest choice)
  equals the other side's.
- `seed-tools`: `vllm serve` plus 64 threads of the `openai` client over IFEval's first `--limit` chat
  prompts, scored with rayeval's IFEval scorer in the client's process (the wall: server start + client),
  against `rayeval run --tasks ifeval`; rayeval's CPU engine settings on both (eager, no chunked prefill).
- `ray-data`: Ray Data LLM (`ray.data.llm.build_processor` over a `vLLMEngineProcessorConfig`, concurrency =
  `--replicas`) over the same chat prompts (no scoring, no store), against `rayeval run --tasks ifeval`.
Every side runs in the dtype rayeval resolves `--dtype` to (default auto: on CPU bfloat16 where the CPU computes
it natively, else float32); each row records it and the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.dtypes import check_engine_dtype, dtype_fields, side_dtype  # noqa: E402
from bench.lm_eval_speed import run_lm_eval, run_rayeval  # noqa: E402
from bench.paired import abba, pair_ratios  # noqa: E402
from bench.rows import write_row  # noqa: E402
from bench.serve_speed import (  # noqa: E402
    IFEVAL_DATA,
    chat_messages,
    cpu_engine_env,
    output_tokens,
    printed,
    timed,
    vllm_serve_side,
)

LM_EVAL_TASKS = ("gsm8k_mean4_local", "gsm8k_mc_local", "ifeval_local")
SHARED_GSM8K = REPO.parent / "shared" / "data" / "gsm8k" / "test.jsonl"

RAY_DATA = """
import json, os, sys, time
if __name__ == "__main__":
    import ray
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig
    model, conversations, max_tokens, replicas, device = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    env, dtype = json.loads(sys.argv[6]), sys.argv[7]
    engine = dict(dtype=dtype, max_model_len=2048, max_num_seqs=64)
    extra = {}
    if device == "cpu":  # no GPU asked for: one CPU bundle per engine, rayeval's CPU engine settings
        engine |= dict(enforce_eager=True, enable_chunked_prefill=False, max_num_batched_tokens=2048,
                       distributed_executor_backend="mp")
        extra = dict(placement_group_config={"bundle_per_worker": {"CPU": 1}},
                     chat_template_stage={"num_cpus": 0.25}, tokenize_stage={"num_cpus": 0.25})
    else:  # vLLM's Ray metrics need packages the GPU upload lacks (prometheus); rayeval's engines log none either
        extra = dict(log_engine_metrics=False)
    ray.init(num_cpus=2 * os.cpu_count() if device == "cpu" else None, log_to_driver=False)
    config = vLLMEngineProcessorConfig(model_source=model, engine_kwargs=engine, concurrency=replicas,
                                       batch_size=16, runtime_env={"env_vars": env}, detokenize_stage=False,
                                       **extra)
    processor = build_processor(
        config,
        preprocess=lambda row: dict(messages=row["messages"],
                                    sampling_params=dict(temperature=0.0, max_tokens=max_tokens)),
        postprocess=lambda row: dict(text=row["generated_text"], tokens=row["num_generated_tokens"]),
    )
    began = time.perf_counter()
    rows = processor(ray.data.from_items([{"messages": m} for m in json.load(open(conversations))])).take_all()
    print("EXECUTE_S", time.perf_counter() - began)
    print("TOKENS", sum(int(r["tokens"]) for r in rows))
    print("ROWS", len(rows))
"""


def rayeval_ifeval(args: argparse.Namespace, work: Path) -> dict:
    run_id = f"r{time.time_ns()}"
    command = [sys.executable, "-m", "cluster.cli", "run", "--tasks", "ifeval", "--limit", str(args.limit),
               "--max-tokens", str(args.max_tokens), "--replicas", str(args.replicas), "--no-progress",
               "--output-dir", str(work), "--run-id", run_id, "--max-model-len", "2048", "--max-num-seqs", "64",
               "--dtype", args.dtype, *(["--model", args.model] if args.model else []),
               *(["--data-path", IFEVAL_DATA] if IFEVAL_DATA else [])]  # fmt: skip
    wall, _ = timed(command)
    run_dir = work / run_id
    run = json.loads((run_dir / "summary.json").read_text())["run"]
    check_engine_dtype(run, args.engine_dtype)
    tokens = output_tokens(run_dir)
    results = json.loads((run_dir / "results.json").read_text())["results"]["ifeval"]
    return {"wall_s": wall, "generation_s": run["generation_s"], "output_tokens": tokens,
            "prompt_level_strict_acc": results.get("prompt_level_strict_acc,none")}  # fmt: skip


def seed_tools(args: argparse.Namespace, work: Path) -> dict:
    return vllm_serve_side(
        work, args.limit, args.max_tokens, args.model, args.engine_dtype, args.device, score=True
    )


def ray_data(args: argparse.Namespace, work: Path) -> dict:
    from cluster.models import resolve_model

    conversations = work / "conversations.json"
    conversations.write_text(json.dumps(chat_messages(args.limit)))
    env = {"HF_HUB_OFFLINE": "1", **(cpu_engine_env() if args.device == "cpu" else {})}
    command = [sys.executable, "-c", RAY_DATA, resolve_model(args.model).path, str(conversations),
               str(args.max_tokens), str(args.replicas), args.device, json.dumps(env), args.engine_dtype]  # fmt: skip
    wall, done = timed(command, env)
    return {"wall_s": wall, "execute_s": round(float(printed(done.stdout, "EXECUTE_S")), 2),
            "output_tokens": int(printed(done.stdout, "TOKENS")), "rows": int(printed(done.stdout, "ROWS"))}  # fmt: skip


def lm_eval_peer(args: argparse.Namespace, work: Path) -> dict:
    from cluster.models import resolve_model

    engine = f",dtype={args.engine_dtype}"
    if (
        args.device == "cpu"
    ):  # rayeval's CPU engine settings, and its core binding (lm-eval passes os.environ on)
        engine += ",enforce_eager=True,enable_chunked_prefill=False,max_num_batched_tokens=2048"
        os.environ.update(cpu_engine_env())
    row = run_lm_eval(resolve_model(args.model).path, args.tasks_dir, args.limit, args.replicas, work,
                      timeout=3600, tasks=args.lm_eval_tasks, engine_args=engine)  # fmt: skip
    return _lm_eval_row(row)


def rayeval_lm_eval(args: argparse.Namespace, work: Path) -> dict:
    extra = ["--dtype", args.dtype, *(["--model", args.model] if args.model else [])]
    return _lm_eval_row(
        run_rayeval(args.tasks_dir, args.limit, args.replicas, work, args.lm_eval_tasks, extra)
    )


def _lm_eval_row(row: dict) -> dict:
    if "error" in row:
        raise SystemExit(f"{row['config']}: {row['error']}\n{row.get('log_tail', '')}")
    metrics = {
        task: {k: v for k, v in values.items() if isinstance(v, float)}
        for task, values in row["results"].items()
    }
    kept = ("wall_s", "engine_load_s", "evaluate_s", "generation_s", "outputs")
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items() if k in kept} | {
        "metrics": metrics
    }


Side = Callable[[argparse.Namespace, Path], dict]
COMPARISONS: dict[str, tuple[Side, Side]] = {
    "lm-eval": (lm_eval_peer, rayeval_lm_eval),
    "seed-tools": (seed_tools, rayeval_ifeval),
    "ray-data": (ray_data, rayeval_ifeval),
}


def agreement(peer: dict, ours: dict) -> dict[str, str]:
    """Per task, how many documents got the same prediction on both sides."""
    counts = {}
    for task, theirs in peer.get("outputs", {}).items():
        mine = ours.get("outputs", {}).get(task, [])
        counts[task] = f"{sum(a == b for a, b in zip(theirs, mine, strict=False))} of {len(theirs)}"
    return counts


def compare(name: str, args: argparse.Namespace, work: Path) -> dict:
    peer_side, our_side = COMPARISONS[name]
    turns: dict[str, list[dict]] = {"peer": [], "rayeval": []}
    for k, order in enumerate(abba(args.pairs)):
        for who in order if args.first == "peer" else order[::-1]:
            side = "peer" if who == "a" else "rayeval"
            folder = work / f"{name}-{side}-{k}"
            folder.mkdir(parents=True)
            turns[side].append((peer_side if side == "peer" else our_side)(args, folder))
            print(f"{name} pair {k + 1} {side}: {turns[side][-1]['wall_s']} s", file=sys.stderr, flush=True)
    same = agreement(turns["peer"][0], turns["rayeval"][0])
    for row in (*turns["peer"], *turns["rayeval"]):
        row.pop("outputs", None)
    ratio = pair_ratios([r["wall_s"] for r in turns["rayeval"]], [r["wall_s"] for r in turns["peer"]])
    return {"comparison": name, "rayeval_over_peer_wall": ratio, "same_predictions": same, **turns}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="JSONL file one row per comparison is appended to"
    )
    parser.add_argument("--comparisons", default=",".join(COMPARISONS), help=f"of {', '.join(COMPARISONS)}")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument(
        "--first", default="peer", choices=("peer", "rayeval"), help="the side of the first turn"
    )
    parser.add_argument("--limit", type=int, default=100, help="documents per task")
    parser.add_argument(
        "--max-tokens", type=int, default=256, help="IFEval's new tokens (seed-tools, ray-data)"
    )
    parser.add_argument(
        "--replicas", type=int, default=1, help="engines per side (lm-eval's data_parallel_size)"
    )
    parser.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument(
        "--dtype", default="auto", help="rayeval's --dtype; every side runs in what it resolves to"
    )
    parser.add_argument(
        "--lm-eval-tasks", default=",".join(LM_EVAL_TASKS), help="the lm-eval comparison's tasks"
    )
    parser.add_argument("--gsm8k", type=Path, default=SHARED_GSM8K, help="GSM8K's test split (JSONL)")
    args = parser.parse_args()
    args.lm_eval_tasks = tuple(args.lm_eval_tasks.split(","))
    args.engine_dtype = side_dtype(args.dtype, args.device)
    from tests.lm_eval_local import write_local_tasks

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="peers-") as folder:
        work = Path(folder)
        args.tasks_dir = write_local_tasks(work / "tasks", args.gsm8k, args.limit)
        for name in args.comparisons.split(","):
            row = compare(name, args, work)
            row |= {"limit": args.limit, "max_tokens": args.max_tokens, "replicas": args.replicas,
                    "device": args.device, **dtype_fields(args.dtype, args.device)}  # fmt: skip
            write_row(args.out, row)


if __name__ == "__main__":
    main()
