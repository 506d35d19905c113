"""Sharding overhead: rayeval (1 and 2 replicas) against one plain `vllm.LLM.generate` call.

Same 200 prompts (IFEval, chat template applied), same sampling (greedy, fixed max_tokens), same engine
settings, in the dtype rayeval's `--dtype auto` resolves to on this CPU (bench/dtypes.py; each result records
it). Each configuration runs in its own process so they do not share an engine or memory.

    python bench/overhead.py                 # all three, prints a Markdown table and writes bench/out/*.json
    python bench/overhead.py --mode vllm     # one configuration only (what the driver calls)

Generation wall time excludes engine start for both (the engine is up before the clock starts); engine
start is reported on its own. Driver peak RSS is the rayeval process's own ru_maxrss (engines live in
Ray actor processes and are not counted there).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench.dtypes, when run as `python bench/overhead.py`
OUT = REPO / "bench" / "out"
PROMPTS = 200
MAX_TOKENS = 128
MAX_NUM_SEQS = 64
MAX_MODEL_LEN = 2048
DTYPE = "auto"  # rayeval's --dtype; `LLM.generate` gets what rayeval resolves it to


def plan_prompts() -> tuple[str, list[str]]:
    from cluster.config import RunConfig, SamplingOptions, TaskOptions
    from cluster.models import PromptRenderer
    from cluster.plan import build_plan

    config = RunConfig(
        tasks=[TaskOptions(name="ifeval", limit=PROMPTS)], sampling=SamplingOptions(max_tokens=MAX_TOKENS)
    )
    plan = build_plan(config, device="cpu")
    renderer = PromptRenderer(plan.model, None)
    task = plan.tasks[0]
    return plan.model.path, [renderer.render(task.task.build_prompt(s, [])) for s in task.samples]


def run_vllm() -> dict:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    from bench.dtypes import side_dtype

    model, prompts = plan_prompts()
    began = time.perf_counter()
    llm = LLM(model=model, max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS, dtype=side_dtype(DTYPE, "cpu"),
              enable_prefix_caching=True)  # fmt: skip
    start_s = time.perf_counter() - began
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, seed=1234)
    began = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - began
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"mode": "vllm", "generation_s": wall, "engine_start_s": start_s, "output_tokens": tokens,
            "dtype": side_dtype(DTYPE, "cpu")}  # fmt: skip


def run_rayeval(replicas: int) -> dict:
    from cluster.api import evaluate
    from cluster.config import ClusterOptions, ModelOptions, RunConfig, SamplingOptions, TaskOptions

    run_id = f"overhead-{replicas}r-{int(time.time())}"
    config = RunConfig(
        model=ModelOptions(max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS, dtype=DTYPE),
        tasks=[TaskOptions(name="ifeval", limit=PROMPTS)],
        sampling=SamplingOptions(max_tokens=MAX_TOKENS),
        cluster=ClusterOptions(replicas=replicas),
        output_dir=str(OUT / "runs"),
        run_id=run_id,
    )
    result = evaluate(config, progress=False)
    return {
        "mode": f"rayeval-{replicas}",
        "generation_s": result.generation_s,
        "engine_start_s": max(e.start_s for e in result.engines),
        "output_tokens": result.output_tokens,
        "total_wall_s": result.wall_s,
        "driver_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "dtype": result.engines[0].dtype,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["vllm", "rayeval-1", "rayeval-2", "all"], default="all")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if args.mode != "all":
        result = run_vllm() if args.mode == "vllm" else run_rayeval(int(args.mode.split("-")[1]))
        result["tok_per_s"] = result["output_tokens"] / result["generation_s"]
        (OUT / f"{args.mode}.json").write_text(json.dumps(result, indent=2))
        print(json.dumps(result))
        return
    results = {}
    for mode in ("vllm", "rayeval-1", "rayeval-2"):
        subprocess.run([sys.executable, __file__, "--mode", mode], check=True, stdout=subprocess.DEVNULL)
        results[mode] = json.loads((OUT / f"{mode}.json").read_text())
    base = results["vllm"]["generation_s"]
    print(
        "| configuration | generation s | ratio to vLLM | output tok/s | engine start s | driver peak RSS MiB |"
    )
    print("|---|---|---|---|---|---|")
    for mode, r in results.items():
        rss = f"{r['driver_peak_rss_mib']:.0f}" if "driver_peak_rss_mib" in r else "-"
        print(f"| {mode} | {r['generation_s']:.1f} | {r['generation_s'] / base:.3f} | {r['tok_per_s']:.0f} | "
              f"{r['engine_start_s']:.1f} | {rss} |")  # fmt: skip


if __name__ == "__main__":
    main()
