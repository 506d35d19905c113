"""The served model's replica: Ray Serve LLM's `LLMServer`, which first fetches the LoRA adapters staged on
object storage to its own node (cluster.serve.adapters), and on CPU binds its vLLM engine's threads to the
cores of the node the replica runs on.

vLLM's CPU workers bind their OpenMP threads to the cores `VLLM_CPU_OMP_THREADS_BIND` names, read by the
engine the replica starts. The deployment's environment is the same for every replica wherever it lands, so
the cores cannot be named there: the replica names them itself, from the cores its own process may use
(`os.sched_getaffinity`: the node's cores, or its cpuset), before it starts the engine. The binding is the
one `rayeval run` gives a replica alone on its node: all of those cores, split among the replica's workers.
vLLM's own `auto` binding also starts from the process's affinity, but keeps one core per worker back for
the engine's scheduler (and one hyper-thread per core, and a NUMA node per worker), which on a small node
halves the threads that generate.

A variable already in the replica's environment wins: `nobind`, which the deployment sets for several
replicas that may share a node, or a binding set in the node's own environment.
"""

from __future__ import annotations

import os
from typing import Any

from cluster.engines.import_gc import import_with_collector_paused

# Ray Serve LLM's server imports vLLM and torch (7 s on two cores), here in the `rayeval serve` process and in
# each replica: with the collector paused, as an engine actor imports vLLM, and after lean_imports
# (transformers then skips scikit-learn); 5.5 to 5.7 s against 7.4 to 7.5 s (docs/BENCHMARKS.md).
import_with_collector_paused("cluster.engines.lean_imports", "ray.serve.llm.deployment")

from ray.serve.llm import LLMConfig  # noqa: E402
from ray.serve.llm.deployment import LLMServer as RayLLMServer  # noqa: E402

from cluster.engines import VLLM_CPU_KV_CACHE_ENV, cpu_thread_binding  # noqa: E402
from cluster.engines.settings import cpu_auto_dtype  # noqa: E402

THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"
EMBEDDED_DEFAULT = "rayeval_embedded_default"  # the LLMConfig's mark (`experimental_configs`) of that model


def node_binding(llm_config: LLMConfig) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for this replica: the cores this process may use, split among its workers."""
    engine = llm_config.engine_kwargs
    workers = int(engine.get("tensor_parallel_size", 1)) * int(engine.get("pipeline_parallel_size", 1))
    return cpu_thread_binding(0, 1, workers, sorted(os.sched_getaffinity(0)))


def on_cpu(llm_config: LLMConfig) -> bool:
    """Whether the replica's engine runs on CPU: its placement group asks for no GPU."""
    placement = llm_config.placement_group_config or {}
    bundles = (
        placement.get("bundles", []) if isinstance(placement, dict) else getattr(placement, "bundles", [])
    )
    return not any((b.get("GPU", 0) if isinstance(b, dict) else getattr(b, "GPU", 0)) for b in bundles)


def locate_default_model(llm_config: LLMConfig) -> None:
    """The embedded default model loaded from this node's copy, built here where the node has none (the
    `rayeval serve` process resolved it to its own folder, which this node may lack)."""
    from cluster.models.default import default_model_here

    loading = llm_config.model_loading_config
    if llm_config.experimental_configs.get(EMBEDDED_DEFAULT) and isinstance(loading.model_source, str):
        here = default_model_here(loading.model_source)
        loading.model_source = here
        # the engine is built from the engine config the serving process derived and cached (it travels
        # with the LLMConfig), as Ray's own node initialisation sets a downloaded model's folder
        llm_config.get_engine_config().hf_model_id = here


def resolve_cpu_dtype(llm_config: LLMConfig) -> None:
    """A CPU replica's `--dtype auto` as this node's CPU decides it (`engines.engine_dtype`: bfloat16 only
    where it computes it natively), not as the `rayeval serve` process's machine would."""
    if llm_config.engine_kwargs.get("dtype") == "auto":  # in the cached engine config too (Ray's own call)
        llm_config.update_engine_kwargs(dtype=cpu_auto_dtype())


def fetch_adapters(llm_config: LLMConfig) -> None:
    """Each LoRA module's folder on this node: an adapter on object storage downloaded here first."""
    from cluster.serve.adapters import replica_adapter_folder

    for module in llm_config.engine_kwargs.get("lora_modules") or []:
        module["path"] = replica_adapter_folder(module["name"], module["path"])


class LLMServer(RayLLMServer):
    """Ray's LLM server, fetching the LoRA adapters on object storage to this node and, on CPU, binding its
    engine's threads to this node's cores before the engine starts (its KV cache sized by the engine argument
    alone). It keeps Ray's class name, which names the deployment (`LLMServer:<model>` in `rayeval serve
    --status`)."""

    async def __init__(self, llm_config: LLMConfig, **kwargs: Any) -> None:
        locate_default_model(llm_config)
        fetch_adapters(llm_config)
        if on_cpu(llm_config):
            resolve_cpu_dtype(llm_config)
            os.environ.setdefault(THREADS_BIND, node_binding(llm_config))
            os.environ.pop(VLLM_CPU_KV_CACHE_ENV, None)  # it would override the engine argument's size
        await super().__init__(llm_config, **kwargs)
