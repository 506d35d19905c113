"""What one replica's engine is built with: the settings, derived from the run's model options in one
place, and the per-device choices vLLM's own defaults get wrong for an evaluation (dtype, eager, chunking)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cluster.config import CPU_MAX_NUM_SEQS, ModelOptions
from cluster.engines.placement import ExecutorKind
from cluster.engines.pushed_weights import WEIGHTS_EXTENSION
from cluster.models.checkpoints import MergedFrom, merged_from_of
from cluster.models.default import is_default_model


@dataclass(frozen=True)
class EngineSettings:
    """What one replica needs to build its engine; plain data so it travels to the actor."""

    model: str
    revision: str | None
    dtype: str
    max_model_len: int
    max_num_seqs: int | None  # None: vLLM's offline (LLM class) default for the device, read from the engine
    tensor_parallel_size: int
    pipeline_parallel_size: int
    gpu_memory_utilization: float
    enforce_eager: bool
    device: str
    max_num_batched_tokens: int | None = None  # None: vLLM's offline (LLM class) default for the device
    log_stats: bool = False  # vLLM's periodic engine stats (running / waiting, throughput) in the log
    # GPU only: the engine core process onto cores of its own among the node's replicas (engines.affinity).
    pin_engine_core: bool = True

    # None: off on CPU, vLLM's default elsewhere (see engine_chunked_prefill); True or False forces it.
    chunked_prefill: bool | None = None
    # None: vLLM's custom all-reduce within one node, NCCL's over nodes; True or False forces it.
    custom_all_reduce: bool | None = None
    # LoRA: the largest adapter rank the engine accepts (0: LoRA off) and how many adapters one batch holds.
    max_lora_rank: int = 0
    max_loras: int = 1
    # How the workers run; the pool sets it from the replica's layout on the cluster (one node or several)
    # when it launches the engine, so the rule lives in ReplicaPlan alone.
    executor: ExecutorKind = ExecutorKind.SINGLE
    # `model` is rayeval's embedded default, as the process that resolved it has it: a node without that
    # folder builds its own copy (`models.default_model_here`) instead of failing to find it.
    embedded_default: bool = False
    # `model` is a merged checkpoint (an adapter merged into a base model), as its folder records where the
    # run is coordinated: a node without that folder merges its own copy (`models.merge.merged_copy_here`).
    merged_from: MergedFrom | None = None


def engine_settings(
    options: ModelOptions,
    model_path: str,
    device: str,
    max_model_len: int | None = None,
    log_stats: bool = False,
) -> EngineSettings:
    return EngineSettings(
        model=model_path,
        revision=options.revision,
        dtype=options.dtype,
        max_model_len=max_model_len or options.max_model_len,
        max_num_seqs=engine_max_num_seqs(options, device),
        tensor_parallel_size=options.tensor_parallel_size,
        pipeline_parallel_size=options.pipeline_parallel_size,
        gpu_memory_utilization=options.gpu_memory_utilization,
        enforce_eager=eager_by_default(device) if options.enforce_eager is None else options.enforce_eager,
        device=device,
        max_num_batched_tokens=options.max_num_batched_tokens,
        log_stats=log_stats,
        pin_engine_core=options.pin_engine_core,
        custom_all_reduce=options.custom_all_reduce,
        max_lora_rank=options.max_lora_rank if options.lora else 0,
        embedded_default=is_default_model(model_path),
        merged_from=merged_from_of(Path(model_path)),
    )


def serving(
    s: EngineSettings, model_path: str, embedded_default: bool = False, merged_from: MergedFrom | None = None
) -> EngineSettings:
    """The settings with the engine serving `model_path` (a checkpoint it moves to): the embedded default
    only where `model_path` is this machine's folder of it (or `embedded_default` says it is the folder the
    planning machine gave for it), so a checkpoint a node lacks is never replaced by the default model;
    `merged_from` where it is a merged checkpoint."""
    embedded_default = embedded_default or is_default_model(model_path)
    return replace(s, model=model_path, embedded_default=embedded_default, merged_from=merged_from)


def engine_args(s: EngineSettings) -> dict[str, Any]:
    """vLLM's engine arguments (`AsyncEngineArgs`) for the settings. A None passes through as None, which vLLM
    reads as its own default: for max_num_seqs and max_num_batched_tokens, the offline (LLM class) defaults of
    the device the engine runs on, since the actor builds its config for that usage context."""
    return dict(
        model=s.model,
        revision=s.revision,
        dtype=engine_dtype(s),
        max_model_len=s.max_model_len,
        max_num_seqs=s.max_num_seqs,
        tensor_parallel_size=s.tensor_parallel_size,
        pipeline_parallel_size=s.pipeline_parallel_size,
        gpu_memory_utilization=s.gpu_memory_utilization,
        enforce_eager=s.enforce_eager,
        enable_prefix_caching=True,
        enable_chunked_prefill=engine_chunked_prefill(s),
        block_size=engine_block_size(s.device),
        distributed_executor_backend=None if s.executor is ExecutorKind.SINGLE else s.executor.value,
        disable_log_stats=not s.log_stats,
        max_num_batched_tokens=s.max_num_batched_tokens,
        # every engine can take weights pushed from a trainer (cluster.training); the class adds one method
        worker_extension_cls=WEIGHTS_EXTENSION,
        **engine_lora_args(s),
        # A replica over nodes: its tensor-parallel group spans nodes, where vLLM's custom all-reduce
        # (GPU peer access within one node) cannot serve it; raylets sharing one host would try it anyway.
        disable_custom_all_reduce=s.executor is ExecutorKind.RAY
        if s.custom_all_reduce is None
        else not s.custom_all_reduce,
    )


# The CPU engine's KV cache size, in bytes, from its pool to its actor: vLLM takes it as `kv_cache_memory_bytes`.
CPU_KV_CACHE_BYTES_ENV = "RAYEVAL_CPU_KV_CACHE_BYTES"


# vLLM's own variable for it holds whole GiB only and, where set, overrides the engine argument: the actor
# removes one its node's environment gave it, so the size asked for holds.
VLLM_CPU_KV_CACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"


def cpu_kv_cache_env(gib: float) -> dict[str, str]:
    """The environment that sizes a CPU engine's KV cache (read by the actor, `cpu_kv_cache_args`)."""
    return {CPU_KV_CACHE_BYTES_ENV: str(cpu_kv_cache_bytes(gib))}


def cpu_kv_cache_args() -> dict[str, int]:
    """In the engine's actor: vLLM's `kv_cache_memory_bytes` from the pool's size, vLLM's variable removed."""
    size = os.environ.get(CPU_KV_CACHE_BYTES_ENV)
    if not size:
        return {}
    os.environ.pop(VLLM_CPU_KV_CACHE_ENV, None)
    return {"kv_cache_memory_bytes": int(size)}


def cpu_kv_cache_bytes(gib: float) -> int:
    return int(gib * 2**30)


def engine_max_num_seqs(options: ModelOptions, device: str) -> int | None:
    """--max-num-seqs where given; else CPU_MAX_NUM_SEQS on CPU and, elsewhere, None: vLLM's offline default
    for the card, which only the engine knows (the pool sizes its dispatch windows from `EngineInfo`)."""
    if options.max_num_seqs is not None:
        return options.max_num_seqs
    return CPU_MAX_NUM_SEQS if device == "cpu" else None


def engine_lora_args(settings: EngineSettings) -> dict[str, object]:
    """vLLM's LoRA engine arguments: none where the run has no adapter (LoRA layers cost memory and time)."""
    if settings.max_lora_rank == 0:
        return {}
    return {"enable_lora": True, "max_lora_rank": settings.max_lora_rank, "max_loras": settings.max_loras}


def eager_by_default(device: str) -> bool:
    """Whether an engine runs eagerly when the config leaves `enforce_eager` unset: on CPU, yes. There,
    compiling adds 120 to 145 s to every engine start (the compile cache does not load back) and makes
    generation 7 to 11 % faster, so it pays only for runs with over 22 minutes of generation; on GPU,
    compiled engines with CUDA graphs pay back within seconds (docs/BENCHMARKS.md)."""
    return device == "cpu"


def engine_dtype(settings: EngineSettings) -> str:
    """The dtype to ask vLLM for. `auto` on CPU becomes bfloat16 only where the CPU computes it natively
    (AVX512-BF16 or AMX-BF16 in /proc/cpuinfo); elsewhere float32. On an AVX2-only CPU, oneDNN has no
    bfloat16 kernels and vLLM falls back to slow ones: float32 generated 3x the tokens per second there
    (docs/BENCHMARKS.md), and its CPU kernels are batch-invariant, so greedy outputs do not depend on
    which requests share a batch. Float16 is not offered on CPU."""
    if settings.device != "cpu" or settings.dtype != "auto":
        return settings.dtype
    return cpu_auto_dtype()


def cpu_auto_dtype() -> str:
    """What `--dtype auto` becomes on this machine's CPU (`engine_dtype`)."""
    return "bfloat16" if cpu_has_native_bf16() else "float32"


def auto_dtype_here(settings: EngineSettings) -> str:
    """What `--dtype auto` becomes for these settings on this node: the CPU's choice (`engine_dtype`), or ""
    on GPUs, where vLLM picks it from the model's config."""
    resolved = engine_dtype(replace(settings, dtype="auto"))
    return "" if resolved == "auto" else resolved


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as lines:
            flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags))


CPU_BLOCK_SIZE = 32


def engine_block_size(device: str) -> int | None:
    """Tokens per KV-cache block: 32 on CPU, vLLM's default elsewhere. vLLM's CPU default is 128, and its
    prefix cache keeps full blocks only, so a prompt under 128 tokens (IFEval's are about 70 with the chat
    template) was never cached: a warm pool prefilled a repeated prompt again, and prompts sharing a system
    prompt or few-shot examples shared less of it. At 32 a repeated 20-prompt IFEval batch prefills in 0.55 to
    0.59 s against 2.02 to 2.07 s, and 20 x 512 tokens decode in the same time within run-to-run noise
    (bench/cpu_block_size.py, docs/BENCHMARKS.md); vLLM's CPU attention wants a multiple of 32."""
    return CPU_BLOCK_SIZE if device == "cpu" else None


def engine_chunked_prefill(settings: EngineSettings) -> bool | None:
    """Off on CPU unless forced, vLLM's default elsewhere. A prompt prefilled in chunks has the token sampled
    after each partial chunk thrown away, and vLLM then rewinds the request's seeded generator by an offset,
    which only GPU (Philox) generators have: on CPU that raises and kills the engine. Without chunking every
    prompt is prefilled in one step (max_num_batched_tokens is at least max_model_len), no draw is thrown
    away, and each request's generator draws the same numbers whatever else shares its steps."""
    if settings.chunked_prefill is not None:
        return settings.chunked_prefill
    return False if settings.device == "cpu" else None
