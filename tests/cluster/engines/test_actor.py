"""The engine actor: outputs decoded once instead of token by token, and its per-device settings.

The fast tests check which requests are decoded how; the slow ones run one real SmolLM2 engine actor on CPU
(through the same calls the dispatcher makes) and check that decoding once gives exactly the text vLLM's
incremental detokenizer gives.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from cluster.engines.actor import defer_detokenization, sampling_params
from cluster.plan import RunPlan
from sharding.requests import (
    Completion,
    GenerationRequest,
    PromptGroup,
    SamplingSpec,
    build_group,
    make_request,
)

PROMPTS = [
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
    "Réponds en français : quelle est la capitale de l'Italie ?",
    "Write one line of Python that prints a dictionary with emoji keys like 🐍.",
]


def test_only_requests_without_stop_strings_skip_incremental_detokenization():
    assert defer_detokenization(())
    assert not defer_detokenization(("\n\n",))


def test_sampling_params_ask_vllm_for_text_only_where_it_is_needed():
    plain = make_request("m", "p", SamplingSpec(max_tokens=8), 0, 0)
    stopped = make_request("m", "p", SamplingSpec(max_tokens=8, stop=("Q:",)), 0, 0)
    forced = make_request("m", "p", SamplingSpec(max_tokens=8, engine_options=(("detokenize", True),)), 0, 0)
    assert sampling_params(plain).detokenize is False
    assert sampling_params(stopped).detokenize is True
    assert sampling_params(forced).detokenize is True  # the task's own engine options win


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[RunPlan, object]]:
    """One real engine actor (SmolLM2 on CPU) in a local Ray cluster, shared by the slow tests."""
    from cluster.config import ClusterOptions, ModelOptions, RunConfig
    from cluster.engines import ReplicaPool, engine_settings
    from cluster.plan import build_model_plan
    from cluster.session import ray_session

    config = RunConfig(
        # float32: the tests compare texts of requests that may run in different batches, and bfloat16 CPU
        # kernels are not batch-invariant (a greedy token can flip); lm-eval comparisons use float32 too.
        model=ModelOptions(dtype="float32", max_model_len=512, enforce_eager=True, cpu_kv_cache_gib=0.25),
        cluster=ClusterOptions(replicas=1, device="cpu"),
    )
    plan = build_model_plan(config, device="cpu")
    options = plan.config.model
    with ray_session(None, plan.replica, 1, verbose=False):
        pool = ReplicaPool(engine_settings(options, plan.model.path, plan.device), plan.replica, 1,
                           options.cpu_kv_cache_gib, verbose=False)  # fmt: skip
        try:
            pool.start(plan.config.cluster.placement_timeout_s)
            yield plan, pool.actors[0]
        finally:
            pool.shutdown()


def one_call_per_group(actor: object, groups: list[PromptGroup]) -> list[list[Completion]]:
    from cluster.engines import replica_call

    call = replica_call(actor, "replica-0")  # type: ignore[arg-type]

    async def all_groups() -> list[list[Completion]]:
        return list(await asyncio.gather(*(call(group) for group in groups)))

    return asyncio.run(all_groups())


def greedy_request(plan: RunPlan, prompt: str, spec: SamplingSpec) -> GenerationRequest:
    return make_request(plan.model.path, prompt, spec, seed=0, sample_index=0)


@pytest.mark.slow
def test_decoding_once_gives_the_text_of_incremental_detokenization(engine):
    plan, actor = engine
    once = SamplingSpec(temperature=0.0, max_tokens=64)
    incremental = SamplingSpec(temperature=0.0, max_tokens=64, engine_options=(("detokenize", True),))
    groups = [
        build_group(prompt, [greedy_request(plan, prompt, spec)])
        for prompt in PROMPTS
        for spec in (once, incremental)
    ]
    results = one_call_per_group(actor, groups)
    for decoded_once, streamed in zip(results[::2], results[1::2], strict=True):
        assert decoded_once[0].ok and streamed[0].ok
        assert decoded_once[0].output_tokens == streamed[0].output_tokens > 0
        assert decoded_once[0].text == streamed[0].text


@pytest.mark.slow
@pytest.mark.usefixtures("engine")
def test_a_one_worker_cpu_engine_runs_its_worker_inside_the_engine_core_on_the_replicas_cores():
    """...and that engine core was forked from the actor's forkserver (cluster.engines.forkserver), under
    vLLM's process title, with the OpenMP environment the pool gave the actor."""
    import os
    from pathlib import Path

    import psutil

    from tests.runs import engine_actor_pids

    (actor_pid,) = engine_actor_pids()  # the fixture's one engine actor
    processes = psutil.Process(actor_pid).children(recursive=True)
    tree = [(p.pid, p.ppid(), " ".join(p.cmdline())[:100]) for p in processes]
    assert not any("Worker" in line for *_, line in tree), tree  # no worker process beside the engine core
    servers = [p for p in processes if "multiprocessing.forkserver" in " ".join(p.cmdline())]
    assert len(servers) == 1 and servers[0].ppid() == actor_pid, tree
    server = servers[0]
    # its one preload imports vLLM's engine core with the collector paused (cluster.engines.core_preload)
    assert "['cluster.engines.core_preload']" in " ".join(server.cmdline()), server.cmdline()
    (core,) = server.children()
    comm = Path(f"/proc/{core.pid}/comm").read_text().strip()
    assert comm == "VLLM::EngineCor", tree  # the kernel's 15 characters: what `ps` and the GPU pinning see
    threads = str(len(os.sched_getaffinity(0)))
    assert core.environ()["OMP_NUM_THREADS"] == threads and core.environ()["OMP_PROC_BIND"] == "true"
    # the KV cache's size reached vLLM as an engine argument: its whole-GiB variable is not there to override it
    assert "VLLM_CPU_KVCACHE_SPACE" not in core.environ()
    # scikit-learn, which transformers imports with vLLM where it is installed, is loaded in none of the engine's
    # processes (cluster.engines.lean_imports): its compiled modules are mapped in none of them
    for process in (psutil.Process(actor_pid), server, core):
        assert "/sklearn/" not in Path(f"/proc/{process.pid}/maps").read_text(), process.cmdline()[:3]


def test_a_fractional_kv_cache_size_becomes_vllms_engine_argument(monkeypatch):
    from cluster.engines import cpu_kv_cache_env
    from cluster.engines.settings import cpu_kv_cache_args

    for name, value in cpu_kv_cache_env(0.25).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "8")  # a node's own setting, which would override the size
    assert cpu_kv_cache_args() == {"kv_cache_memory_bytes": 268435456}
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ


@pytest.mark.slow
def test_a_reload_is_checked_and_a_stale_engine_is_caught_and_rebuilt(engine, tmp_path):
    """A fault injected on purpose: the second move forces an in-place reload (`how`) onto a checkpoint whose
    tied embeddings changed, which vLLM's layerwise reload cannot refresh on the output side (the move
    `swap_kind` would make is a rebuild); the check after the reload catches the stale engine and rebuilds
    it. The first move is an ordinary reload, whose check passes."""
    import ray
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cluster.models import SwapKind
    from tests.cluster.sweep.test_full_sweep import save_copy

    plan, actor = engine
    layers = save_copy(tmp_path / "layers", "layers")
    info = ray.get(actor.load_checkpoint.remote(str(layers)))
    assert info.loaded_by == "reload" and info.load_note.endswith("the reload check passed"), info.load_note
    embeddings = save_copy(tmp_path / "embeddings", "embeddings")
    info = ray.get(actor.load_checkpoint.remote(str(embeddings), SwapKind.RELOAD))
    assert info.loaded_by == "rebuild" and info.load_note.startswith("the reload check failed: "), (
        info.load_note
    )

    # the rebuilt engine answers as the checkpoint does: greedy continuations computed here by transformers
    tokenizer = AutoTokenizer.from_pretrained(embeddings)
    model = AutoModelForCausalLM.from_pretrained(embeddings, dtype=torch.float32)
    spec = SamplingSpec(temperature=0.0, max_tokens=12)
    for prompt in PROMPTS[:2]:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        expected = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1] :]
        request = make_request(str(embeddings), prompt, spec, 0, 0, prompt_token_ids=tuple(ids[0].tolist()))
        ((served,),) = one_call_per_group(actor, [build_group(prompt, [request])])
        assert served.text == tokenizer.decode(expected, skip_special_tokens=True), prompt


def test_cpu_engines_run_eagerly_and_without_chunked_prefill_unless_asked():
    from cluster.config import ModelOptions
    from cluster.engines import engine_chunked_prefill, engine_settings

    cpu, gpu = (engine_settings(ModelOptions(), "m", device) for device in ("cpu", "gpu"))
    assert cpu.enforce_eager is True and gpu.enforce_eager is False
    assert engine_settings(ModelOptions(enforce_eager=False), "m", "cpu").enforce_eager is False
    assert engine_chunked_prefill(cpu) is False and engine_chunked_prefill(gpu) is None


def test_max_num_seqs_is_vllms_default_for_the_card_on_gpu_and_64_on_cpu_unless_asked():
    from vllm.engine.arg_utils import AsyncEngineArgs

    from cluster.config import CPU_MAX_NUM_SEQS, ModelOptions
    from cluster.engines import engine_args, engine_settings
    from cluster.models import ensure_default_model

    model = str(ensure_default_model())  # a local folder: vLLM's arguments resolve a bare name on the hub
    cpu, gpu = (engine_settings(ModelOptions(), model, device) for device in ("cpu", "gpu"))
    assert cpu.max_num_seqs == CPU_MAX_NUM_SEQS == 64 and gpu.max_num_seqs is None
    for device in ("cpu", "gpu"):
        assert engine_settings(ModelOptions(max_num_seqs=256), model, device).max_num_seqs == 256
    # vLLM's own engine arguments, as the actor builds them: on GPU the choice is left to vLLM, which fills
    # it in for the card when the actor creates the engine config (LLM class: 1024 on an H100 or H200)
    on_cpu, on_gpu = AsyncEngineArgs(**engine_args(cpu)), AsyncEngineArgs(**engine_args(gpu))
    assert on_cpu.max_num_seqs == 64 and on_gpu.max_num_seqs is None
    assert on_gpu.max_num_batched_tokens is None and on_gpu.enforce_eager is False
    assert on_cpu.enforce_eager is True and on_cpu.enable_chunked_prefill is False
    # 32-token blocks on CPU, so that the prefix cache holds prompts under vLLM's CPU default of 128 tokens
    assert on_cpu.block_size == 32 and on_gpu.block_size is None


def test_auto_dtype_on_cpu_is_bfloat16_only_where_the_cpu_computes_it_natively(tmp_path):
    from dataclasses import replace

    from cluster.config import ModelOptions
    from cluster.engines import cpu_has_native_bf16, engine_dtype, engine_settings

    cpu, gpu = (engine_settings(ModelOptions(), "m", device) for device in ("cpu", "gpu"))
    assert engine_dtype(gpu) == "auto"  # vLLM takes the model's own dtype
    assert engine_dtype(replace(cpu, dtype="bfloat16")) == "bfloat16"  # asked for: kept
    assert engine_dtype(cpu) == ("bfloat16" if cpu_has_native_bf16() else "float32")
    avx2, amx = tmp_path / "avx2", tmp_path / "amx"
    avx2.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    amx.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n")
    assert not cpu_has_native_bf16(str(avx2)) and cpu_has_native_bf16(str(amx))
    assert not cpu_has_native_bf16(str(tmp_path / "missing"))


def test_a_reload_whose_reference_does_not_fit_in_memory_is_not_trusted(tmp_path):
    """A checkpoint too large for transformers to decode beside the engine (only its safetensors header is
    written here: 10^12 float32 values): the reload check cannot run, so the engine is rebuilt, saying why."""
    import json
    import struct

    from cluster.engines.reload_check import Calibration, ReloadCheck, reference_room

    header = json.dumps(
        {"w": {"dtype": "F32", "shape": [1_000_000, 1_000_000], "data_offsets": [0, 0]}}
    ).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    assert reference_room(str(tmp_path), "float32").startswith("its reference needs 3725.3 GiB of memory")
    problem = asyncio.run(ReloadCheck().problem(Calibration(0.0), None, None, str(tmp_path), "float32"))
    assert problem.startswith("the check could not run: its reference needs 3725.3 GiB")
