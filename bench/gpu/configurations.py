"""What each configuration runs, in the process `--config NAME` starts (`run_config`): `LLM.generate` on
one GPU (vllm) and on two in two processes (vllm-2); rayeval's real runner with 1 or 2 replicas or 1 of
tensor parallel 2 (rayeval-1, rayeval-2, rayeval-tp2, each also -unpinned); the pieces between them
(engine-one-call, asyncllm, ray-calls); workload B through `cluster.api.evaluate` (ifeval-N, ifeval-2-stats);
and the paired comparisons (the -vs- names), whose sides take turns on engines that stay up: rayeval against
`LLM.generate` and vLLM's own scaling here, replica counts and tensor-parallel layouts in bench.gpu.layouts.
Each returns its JSON row (bench.gpu.rows)."""

from __future__ import annotations

import os
import resource
import subprocess
import time
from typing import TYPE_CHECKING

from bench.gpu.layouts import gpus_for, is_layout_config, run_layout_config
from bench.gpu.placement import place_sides, side_env, visible_gpus
from bench.gpu.rows import as_one_turn, dispatch_timeline, paired_row, repeated, result_row, throughput
from bench.gpu.settings import A_DTYPE, A_REPEATS, DEADLINE, GPU_MEMORY, SAFE_ENV, SMOKE, WORK, config_command
from bench.gpu.turns import TURNS, rayeval_generate, rayeval_runner, take_turns
from bench.gpu.workloads import (
    A_MAX_MODEL_LEN,
    A_OUTPUT_TOKENS,
    A_PROMPT_TOKENS,
    A_PROMPTS,
    MAX_NUM_SEQS,
    RANDOM_MODEL,
    a_llm,
    build_random_model,
    ifeval_config,
    random_prompts,
    rayeval_a_plan,
    rayeval_a_requests,
)

if TYPE_CHECKING:
    from vllm import LLM

    from bench.paired import Referee


CONFIGS = {
    # vllm-2: two LLM.generate processes, one per GPU, half the prompts each: vLLM's own scaling on this host.
    # Not in the default list, to find where rayeval-1 loses to LLM.generate (`--configs`): asyncllm (vLLM's
    # AsyncLLM in a plain process, everything submitted at once) and engine-one-call (rayeval's engine actor
    # given everything in one call, no dispatcher), and rayeval names ending in -unpinned.
    # The paired comparisons (rayeval-1-vs-vllm, vllm-2-vs-1, and bench.gpu.layouts' rayeval-N-vs-1 and
    # layout-RxT-vs-RxT) are chosen with --configs.
    "A": ["vllm", "vllm-2", "rayeval-1", "rayeval-2", "rayeval-tp2"],
    # ifeval-2-stats: the 2-replica run again with vLLM's engine stats logged every 2 s (running / waiting
    # requests per engine), to see where the time goes; kept out of the ratios (logging costs a little).
    # ray-calls: the dispatcher and Ray actor calls alone (no-op actors), what orchestration costs per request.
    # ifeval-N-vs-1 (with --configs): B's generation on one replica against N, in paired turns (bench.gpu.layouts).
    "B": ["ifeval-2", "ifeval-1", "ray-calls", "ifeval-2-stats"],
}


def _llm_generate(llm: LLM, prompts: list[list[int]]) -> dict:
    """One `LLM.generate` over token-id prompts: when it began, how long it took, tokens and requests out."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=A_OUTPUT_TOKENS, ignore_eos=True)
    began_at, began = time.time(), time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - began
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"began_at": began_at, "seconds": seconds, "tokens": tokens, "requests": len(outputs)}


def run_vllm(shard: int = 0, shards: int = 1) -> dict:
    """`vllm.LLM.generate` over the prompts (or shard `shard` of `shards`, for the two-GPU reference)."""
    began = time.perf_counter()
    llm = a_llm()
    start_s = time.perf_counter() - began
    if shards > 1:
        _barrier(shard, shards)
    repeats = [
        _llm_generate(llm, random_prompts(repeat)[shard::shards])
        for repeat in range(A_REPEATS if shards == 1 else 1)  # the two-process reference starts together once
    ]
    return repeated("vllm" if shards == 1 else f"vllm-shard-{shard}", repeats, start_s)


def _barrier(index: int, count: int) -> None:
    """Wait until every one of `count` processes has its engine up, so their generation starts together."""
    folder = WORK / "barrier"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / str(index)).touch()
    while len(list(folder.iterdir())) < count:
        time.sleep(0.01)


def run_vllm_data_parallel() -> dict:
    """The reference for replica scaling: two independent `LLM.generate` processes, one per GPU, each on
    half the prompts, generating from the same moment; throughput over the span from first start to last end."""
    import shutil

    shutil.rmtree(WORK / "barrier", ignore_errors=True)
    env = {**os.environ, **SAFE_ENV}
    places = place_sides(["shard-0", "shard-1"], gpus_for("vllm-2", 2))
    children = [
        subprocess.Popen(
            config_command(f"vllm-shard-{i}"),
            env={**env, **side_env(places[f"shard-{i}"])},
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    rows = []
    for child in children:
        out, _ = child.communicate()
        row = result_row(out) if child.returncode == 0 else None
        if row is None:
            raise RuntimeError(f"a vllm shard failed (exit {child.returncode})")
        rows.append(row)
    span = max(r["ended_at"] for r in rows) - min(r["began_at"] for r in rows)
    row = throughput(
        "vllm-2", span, sum(r["output_tokens"] for r in rows), sum(r["requests"] for r in rows),
        max(r["engine_start_s"] for r in rows),
    )  # fmt: skip
    row.update(
        shard_generation_s=[r["generation_s"] for r in rows],
        began_at=min(r["began_at"] for r in rows),
        ended_at=max(r["ended_at"] for r in rows),
    )
    return row


# Paired configurations (bench/paired.py): both sides' engines start once, then `--repeats` pairs of turns
# (fewer if the configuration's share of `--budget-s` runs out first: `pairs` in the row) in ABBA order, fresh
# prompts each turn; each pair gives one ratio (its median and range in the row).
# rayeval-1-vs-vllm: `LLM.generate` against one rayeval replica (two processes): each on a GPU of its own where
# two are visible, else both on the one GPU with half its memory each, started one after the other
# (bench.gpu.placement); the row says where (`gpus`, `gpu_memory_utilization`).
# vllm-2-vs-1: two `LLM` processes, one per GPU; each pair, one of them alone on all the prompts (which one
# alternates) and both at once on half each. rayeval-N-vs-1, ifeval-N-vs-1 and the layout-RxT-vs-RxT
# comparisons (replicas against tensor parallel): bench.gpu.layouts.


def serve_vllm_turns() -> dict:
    """Child: an `LLM` on this process's GPU; each turn generates shard `shard` of `shards` of `seed`'s prompts."""
    from bench.paired import serve_turns

    began = time.perf_counter()
    llm = a_llm()
    start_s = round(time.perf_counter() - began, 1)

    def turn(order: dict) -> dict:
        prompts = random_prompts(order["seed"])[order["shard"] :: order["shards"]]
        return {**_llm_generate(llm, prompts), "engine_start_s": start_s}

    served = serve_turns(TURNS, os.environ["RAYEVAL_TURN_ROLE"], turn)
    return {"config": "vllm-turns", "turns": served}


def run_rayeval_vs_vllm() -> dict:
    from bench.paired import pairs_before

    def play(referee: Referee) -> dict:
        turns: dict[str, list[dict]] = {"vllm": [], "rayeval-1": []}
        for k, order in pairs_before(DEADLINE, A_REPEATS):
            for role in ("vllm" if side == "a" else "rayeval-1" for side in order):
                turns[role].append(referee.turn({role: {"seed": k, "shard": 0, "shards": 1}})[role])
        return turns

    gpus = visible_gpus()
    places = place_sides(["rayeval-1", "vllm"], gpus)
    turns = take_turns({role: (f"{role}-turns", places[role]) for role in ("vllm", "rayeval-1")}, play)
    return paired_row(
        "rayeval-1-vs-vllm", turns,
        engine_start_s={side: round(t[0]["engine_start_s"], 1) for side, t in turns.items()},
        dtype=A_DTYPE,
        gpus_visible=len(gpus),
        gpus={role: place.gpu for role, place in places.items()},
        gpu_memory_utilization={role: place.gpu_memory_utilization for role, place in places.items()},
        engine_core_cpus=turns["rayeval-1"][0]["engine_core_cpus"],
        dispatch_per_turn=[t["dispatch"] for t in turns["rayeval-1"]],
    )  # fmt: skip


def run_vllm_scaling_paired() -> dict:
    from bench.paired import pairs_before

    def play(referee: Referee) -> dict:
        turns: dict[str, list[dict]] = {"vllm-1": [], "vllm-2": []}
        for k, order in pairs_before(DEADLINE, A_REPEATS):
            for side in order:
                if side == "a":
                    role = f"gpu{k % 2}"
                    result = referee.turn({role: {"seed": 2 * k, "shard": 0, "shards": 1}})[role]
                    turns["vllm-1"].append({**result, "gpu": k % 2})
                else:
                    orders = {f"gpu{i}": {"seed": 2 * k + 1, "shard": i, "shards": 2} for i in range(2)}
                    turns["vllm-2"].append(as_one_turn(list(referee.turn(orders).values())))
        return turns

    places = place_sides(["gpu0", "gpu1"], gpus_for("vllm-2-vs-1", 2))
    turns = take_turns({role: ("vllm-turns", place) for role, place in places.items()}, play)
    return paired_row(
        "vllm-2-vs-1", turns,
        dtype=A_DTYPE,
        alone_on_gpu=[t["gpu"] for t in turns["vllm-1"]],
        each_gpu_s=[t["each_s"] for t in turns["vllm-2"]],
    )  # fmt: skip


def run_rayeval_a(replicas: int, tp: int, name: str, pin_engine_core: bool = True) -> dict:
    with rayeval_runner(rayeval_a_plan(replicas, tp, pin_engine_core)) as runner:
        repeats = [
            rayeval_generate(runner, name, rayeval_a_requests(runner.model_path, repeat))
            for repeat in range(A_REPEATS)
        ]
    engine = runner.stats.engines[0]
    errors = [r["first_error"] for r in repeats if r["first_error"] is not None]
    return repeated(
        name, repeats, max(e.start_s for e in runner.stats.engines),
        failed=sum(r["failed"] for r in repeats), first_error=errors[0] if errors else None,
        vllm_version=engine.vllm_version,
        max_num_batched_tokens=engine.max_num_batched_tokens, async_scheduling=engine.async_scheduling,
        dispatch_per_repeat=[r["dispatch"] for r in repeats],
        engine_core_cpus=[list(e.engine_core_cpus) for e in runner.stats.engines],
    )  # fmt: skip


def run_engine_one_call() -> dict:
    """rayeval's engine actor handed all of workload A in ONE call (no dispatcher): every request reaches the
    engine at once, as with `LLM.generate`. Against rayeval-1 (one call per request through the dispatcher)
    it isolates what the hand-out costs; against `asyncllm` what the Ray actor costs."""
    import ray

    from cluster.engines import ReplicaPool, engine_settings
    from cluster.session import ray_session
    from sharding.requests import build_group

    plan = rayeval_a_plan(1, 1)
    requests = rayeval_a_requests(plan.model.path)
    options = plan.config.model
    with ray_session(None, plan.replica, 1, verbose=False):
        pool = ReplicaPool(engine_settings(options, plan.model.path, plan.device), plan.replica, 1,
                           options.cpu_kv_cache_gib, verbose=False)  # fmt: skip
        try:
            info = pool.start(plan.config.cluster.placement_timeout_s)[0]
            began_at, began = time.time(), time.perf_counter()
            completions = ray.get(pool.actors[0].generate.remote(build_group("all", requests)))
            seconds = time.perf_counter() - began
        finally:
            pool.shutdown()
    tokens = sum(c.output_tokens for c in completions)
    row = throughput("engine-one-call", seconds, tokens, len(completions), info.start_s)
    row.update(failed=sum(not c.ok for c in completions), began_at=began_at, ended_at=began_at + seconds)
    return row


def run_asyncllm() -> dict:
    """vLLM's AsyncLLM in this process (no Ray), built as rayeval's engine actor builds it, all of workload A
    submitted at once with final-only outputs: the engine's own speed without Ray or the dispatcher."""
    import asyncio

    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(model=str(RANDOM_MODEL), dtype=A_DTYPE, max_model_len=A_MAX_MODEL_LEN,
                           max_num_seqs=MAX_NUM_SEQS, enable_prefix_caching=True, enforce_eager=SMOKE,
                           gpu_memory_utilization=GPU_MEMORY, disable_log_stats=True)  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=A_OUTPUT_TOKENS, ignore_eos=True,
                            output_kind=RequestOutputKind.FINAL_ONLY)  # fmt: skip

    async def generate_all() -> dict:
        began = time.perf_counter()
        engine = AsyncLLM.from_engine_args(args, usage_context=UsageContext.LLM_CLASS)
        start_s = time.perf_counter() - began

        async def one(index: int, prompt: list[int]) -> int:
            final = None
            async for output in engine.generate(TokensPrompt(prompt_token_ids=prompt), params, f"a-{index}"):
                final = output
            return len(final.outputs[0].token_ids) if final is not None else 0

        try:
            began_at, began = time.time(), time.perf_counter()
            counts = await asyncio.gather(*(one(i, p) for i, p in enumerate(random_prompts())))
            seconds = time.perf_counter() - began
        finally:
            engine.shutdown()
        row = throughput("asyncllm", seconds, sum(counts), len(counts), start_s)
        row.update(began_at=began_at, ended_at=began_at + seconds)
        return row

    return asyncio.run(generate_all())


def run_ray_calls() -> dict:
    """Orchestration alone: workload A's 2,048 one-request groups through the real dispatcher and
    `replica_call` to Ray actors that return at once, with 1 and 2 actors (round trips per second)."""
    import asyncio

    import ray

    from cluster.engines import replica_call
    from sharding.dispatcher import Dispatcher, Replica
    from sharding.requests import Completion, SamplingSpec, group_prompts, make_request

    @ray.remote(num_cpus=0)
    class NoOpEngine:
        async def generate(self, group):  # noqa: ANN001, ANN202 - bench-only stand-in for the engine
            return [Completion(r.request_id, output_tokens=A_OUTPUT_TOKENS) for r in group.requests]

    spec = SamplingSpec(temperature=0.0, max_tokens=A_OUTPUT_TOKENS)
    prompts = [tuple(range(i, i + A_PROMPT_TOKENS)) for i in range(A_PROMPTS)]
    groups = group_prompts([make_request("m", "", spec, 0, 0, prompt_token_ids=p) for p in prompts])
    row: dict = {"config": "ray-calls", "groups": len(groups)}
    ray.init(include_dashboard=False, log_to_driver=False)
    try:
        for count in (1, 2):
            actors = [NoOpEngine.remote() for _ in range(count)]
            ray.get([a.generate.remote(groups[0]) for a in actors])
            replicas = [Replica(f"noop-{i}", replica_call(a, f"noop-{i}"), 2 * MAX_NUM_SEQS)
                        for i, a in enumerate(actors)]  # fmt: skip
            loop = asyncio.new_event_loop()
            began = time.perf_counter()
            loop.run_until_complete(Dispatcher(replicas).run(groups))
            seconds = time.perf_counter() - began
            loop.close()
            row[f"actors_{count}_s"] = round(seconds, 3)
            row[f"actors_{count}_calls_per_s"] = round(len(groups) / seconds)
    finally:
        ray.shutdown()
    return row


def run_ifeval(replicas: int, name: str, engine_stats: bool = False) -> dict:
    from cluster.api import evaluate

    config = ifeval_config(replicas, name)
    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    began = time.perf_counter()
    if engine_stats:
        os.environ["VLLM_LOG_STATS_INTERVAL"] = "2"  # the engines inherit it from the local Ray cluster
        os.environ["RAY_DEDUP_LOGS"] = "0"  # every engine's line, not "repeated 2x across cluster"
    result = evaluate(config, progress=False, verbose=engine_stats)
    wall = time.perf_counter() - began
    usage = resource.getrusage(resource.RUSAGE_SELF)
    row = throughput(name, result.generation_s, result.output_tokens, result.requests_generated,
                      max(e.start_s for e in result.engines))  # fmt: skip
    strict = result.summaries[0].metrics["prompt_level_strict_acc,none"]
    row.update(
        wall_s=round(wall, 1),
        requests_per_s=round(result.requests_generated / result.generation_s, 1),
        prepare_s=round(result.prepare_s, 2),
        scoring_s=round(result.scoring_s, 2),
        driver_cpu_s=round(
            usage.ru_utime + usage.ru_stime - usage_before.ru_utime - usage_before.ru_stime, 1
        ),
        driver_peak_rss_mib=round(usage.ru_maxrss / 1024),
        failed=result.requests_failed,
        prompt_level_strict_acc=round(strict.mean, 4),
        engine_core_cpus=[list(e.engine_core_cpus) for e in result.engines],
        dtype=result.engines[0].dtype,
        **dispatch_timeline(result.dispatch),
    )
    return row


# A rayeval-1 / rayeval-2 / rayeval-tp2 name ending in -unpinned leaves the engine cores where the OS puts
# them (--no-pin-engine-core) instead of on cores of their own (cluster.engines.affinity).
UNPINNED = "-unpinned"


def run_rayeval_variant(name: str) -> dict:
    layout = name.removesuffix(UNPINNED)
    tp = 2 if layout == "rayeval-tp2" else 1
    replicas = 1 if tp == 2 else int(layout.split("-")[1])
    return run_rayeval_a(replicas, tp, name, pin_engine_core=not name.endswith(UNPINNED))


def run_config(name: str) -> dict:
    runners = {
        "build": build_random_model,
        "vllm": run_vllm,
        "vllm-2": run_vllm_data_parallel,
        "ray-calls": run_ray_calls,
        "engine-one-call": run_engine_one_call,
        "asyncllm": run_asyncllm,
        "rayeval-1-vs-vllm": run_rayeval_vs_vllm,
        "vllm-2-vs-1": run_vllm_scaling_paired,
        "vllm-turns": serve_vllm_turns,
    }
    if name in runners:
        return runners[name]()
    if is_layout_config(name):
        return run_layout_config(name)
    if name.startswith("vllm-shard-"):
        return run_vllm(int(name.rsplit("-", 1)[1]), 2)
    if name.startswith("rayeval-"):
        return run_rayeval_variant(name)
    return run_ifeval(int(name.split("-")[1]), name, engine_stats=name.endswith("-stats"))
