"""The model behind an OpenAI-compatible API on Ray Serve, built with Ray Serve's own LLM support
(`ray.serve.llm`): one `LLMServer` deployment of N replicas (each a vLLM engine in its own placement group)
behind Ray's OpenAI ingress (/v1/models, /v1/chat/completions, /v1/completions, streaming).

Each replica's engine gets the settings `rayeval run` gives its own engines (`cluster.engines.settings`:
dtype, eager on CPU, no chunked prefill on CPU, the KV cache size), so a served model answers as the run's
replicas do.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import ray

from cluster.config import RunConfig, ServeConfig
from cluster.engines import (
    cpu_thread_binding,
    engine_chunked_prefill,
    engine_dtype,
    engine_lora_args,
    engine_settings,
    remote_message,
)
from cluster.errors import ClusterError
from cluster.models import resolve_model
from cluster.plan import ReplicaPlan, replica_plan, resolve_device
from cluster.session import joined_session, ray_session

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedModel:
    """What `rayeval serve` prints: where the API is and the model's name in it."""

    url: str  # the API's base URL, ending in /v1
    name: str
    model_path: str
    replicas: int
    app_name: str
    device: str
    start_s: float
    adapters: tuple[str, ...] = ()  # LoRA adapters served by name beside the base model


def deploy(config: ServeConfig, verbose: bool = False) -> ServedModel:
    """Serve the model on the cluster at `cluster.address` (or $RAY_ADDRESS) and return: the application
    lives on there until `shutdown`."""
    with joined_session(config.cluster.address, verbose):
        return serve_model(config, local=False)


def serve_here(
    config: ServeConfig, announce: Callable[[ServedModel], None], stop: threading.Event, verbose: bool = False
) -> None:
    """Serve the model on a local Ray cluster of this process until `stop` is set (or SIGTERM comes), then
    shut it all down."""
    plan = replica_plan(_run_config(config), "cpu")
    with ray_session(None, plan, config.cluster.replicas, verbose):
        from ray import serve

        # after ray.init, which installs a SIGTERM handler of its own that ends the process at once
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        announce(serve_model(config, local=True))
        try:
            while not stop.wait(1.0):
                pass
        finally:
            serve.shutdown()


def status(config: ServeConfig, verbose: bool = False) -> str:
    with joined_session(config.cluster.address or "auto", verbose):
        return serve_status(config.app_name)


def shutdown(config: ServeConfig, verbose: bool = False) -> bool:
    with joined_session(config.cluster.address or "auto", verbose):
        return shutdown_app(config.app_name)


def serve_model(config: ServeConfig, *, local: bool) -> ServedModel:
    """Deploy the model on the connected Ray cluster and wait until every replica answers. `local`: the
    cluster is this process's own (the API is then on 127.0.0.1)."""
    from ray import serve
    from ray.serve.llm import build_openai_app

    began = time.perf_counter()
    model = resolve_model(config.model.path)
    name = config.served_name or model.name
    device = resolve_device(_run_config(config), ray.cluster_resources().get("GPU", 0) > 0)
    adapters = checked_adapters(config, model.path, name)
    app = build_openai_app(
        {
            "llm_configs": [llm_config(config, model.path, name, device)],
            # the ingress only forwards HTTP: it must not take a CPU an engine replica is sized for
            "ingress_deployment_config": {"ray_actor_options": {"num_cpus": 0}},
            **({"ingress_cls_config": lora_ingress({a: name for a in adapters})} if adapters else {}),
        }
    )
    serve.start(http_options={"host": "0.0.0.0", "port": config.port})
    try:
        serve.run(app, name=config.app_name, route_prefix="/", blocking=False)
    except Exception as exc:
        raise ClusterError(
            f"The Serve application '{config.app_name}' for {model.path} did not start: {remote_message(exc)}. "
            "`rayeval serve --status` shows each replica's state; check that the model and --max-model-len fit."
        ) from None
    host = "127.0.0.1" if local else _api_host(config.cluster.address)
    return ServedModel(
        url=f"http://{host}:{config.port}/v1",
        name=name,
        model_path=model.path,
        replicas=config.cluster.replicas,
        app_name=config.app_name,
        device=device,
        start_s=time.perf_counter() - began,
        adapters=tuple(adapters),
    )


def checked_adapters(config: ServeConfig, model_path: str, served_name: str) -> list[str]:
    """The adapters' names, each checked against the base model before any replica starts."""
    from cluster.models import adapter_problem

    for adapter, path in config.lora_modules.items():
        if adapter == served_name:
            raise ClusterError(
                f"--lora {adapter}={path}: the base model is served as '{adapter}'; name it otherwise"
            )
        problem = adapter_problem(Path(path).expanduser(), Path(model_path), config.model.max_lora_rank)
        if problem:
            raise ClusterError(f"--lora {adapter}={path}: {problem}")
    return list(config.lora_modules)


def lora_ingress(adapters: dict[str, str]) -> dict[str, Any]:
    """Ray's OpenAI ingress, extended to route each adapter's name (to its base model's id) and list it."""
    from cluster.serve.lora import LoraIngress

    return {"ingress_cls": LoraIngress, "ingress_extra_kwargs": {"adapters": adapters}}


def llm_config(config: ServeConfig, model_path: str, name: str, device: str) -> Any:
    """Ray Serve LLM's config of the model: rayeval's engine settings as vLLM engine arguments, one
    placement group per replica sized as `rayeval run` sizes a replica."""
    from ray.serve.llm import LLMConfig

    settings = engine_settings(config.model, model_path, device)
    plan = replica_plan(_run_config(config), device)
    engine: dict[str, Any] = {
        "dtype": engine_dtype(settings),
        "max_model_len": settings.max_model_len,
        "max_num_seqs": settings.max_num_seqs,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "pipeline_parallel_size": settings.pipeline_parallel_size,
        "enforce_eager": settings.enforce_eager,
    }
    if settings.revision:
        engine["revision"] = settings.revision
    if config.lora_modules:  # every replica loads every adapter from its own disk when it starts
        modules = [
            {"name": n, "path": str(Path(p).expanduser().resolve())} for n, p in config.lora_modules.items()
        ]
        lora = replace(settings, max_lora_rank=config.model.max_lora_rank, max_loras=len(modules))
        engine |= engine_lora_args(lora)
        engine["lora_modules"] = modules
    chunked = engine_chunked_prefill(settings)
    if chunked is not None:
        engine["enable_chunked_prefill"] = chunked
    if device == "cpu":  # every prompt prefilled in one step: a step holds the longest prompt
        engine["max_num_batched_tokens"] = max(settings.max_num_batched_tokens or 0, settings.max_model_len)
    else:
        engine["gpu_memory_utilization"] = settings.gpu_memory_utilization
        if settings.max_num_batched_tokens:
            engine["max_num_batched_tokens"] = settings.max_num_batched_tokens
    return LLMConfig(
        model_loading_config={"model_id": name, "model_source": model_path},
        engine_kwargs=engine,
        # the replica actor's own CPU would be added to its placement group's first bundle: none asked
        deployment_config={"num_replicas": config.cluster.replicas, "ray_actor_options": {"num_cpus": 0}},
        placement_group_config={"bundles": replica_bundles(plan), "strategy": "STRICT_PACK"},
        runtime_env={"env_vars": engine_env(config, plan, device)},
    )


def replica_bundles(plan: ReplicaPlan) -> list[dict[str, float]]:
    """One bundle per engine worker: on GPU a GPU each, the first also holding the engine's CPU."""
    if plan.bundle.get("GPU", 0) == 0:
        return [dict(plan.bundle)]
    cpus = plan.bundle.get("CPU", 0)
    return [{"CPU": cpus, "GPU": 1.0}] + [{"GPU": 1.0}] * (plan.workers - 1)


def engine_env(config: ServeConfig, plan: ReplicaPlan, device: str) -> dict[str, str]:
    """The CPU engine's environment: its KV cache and its threads' cores. Serve gives every replica the
    same environment, so one replica binds the node's cores and several leave binding to the OS."""
    if device != "cpu":
        return {}
    replicas = config.cluster.replicas
    cores = sorted(os.sched_getaffinity(0))
    binding = cpu_thread_binding(0, 1, plan.workers, cores) if replicas == 1 else "nobind"
    return {
        "VLLM_CPU_KVCACHE_SPACE": str(config.model.cpu_kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": binding,
    }


def serve_status(app_name: str) -> str:
    """The application's state and each deployment's replicas, as Serve reports them."""
    from ray import serve

    applications = serve.status().applications
    app = applications.get(app_name)
    if app is None:
        running = ", ".join(sorted(applications)) or "none"
        return f"no Serve application '{app_name}' on this cluster (running: {running})"
    lines = [f"application {app_name}: {_state(app.status)}" + (f" ({app.message})" if app.message else "")]
    for deployment_name, deployment in app.deployments.items():
        counts = ", ".join(f"{count} {_state(state)}" for state, count in deployment.replica_states.items())
        lines.append(f"  {deployment_name}: {_state(deployment.status)}; replicas: {counts or 'none'}")
    return "\n".join(lines)


def _state(value: object) -> str:
    """A Serve status enum's name; Serve's status may hand them over as plain strings."""
    return str(getattr(value, "value", value))


def shutdown_app(app_name: str) -> bool:
    """Delete the application (and Serve itself when no other application is left); False if it was not there."""
    from ray import serve

    applications = serve.status().applications
    if app_name not in applications:
        return False
    serve.delete(app_name)
    if not set(serve.status().applications) - {app_name}:
        serve.shutdown()
    return True


def _run_config(config: ServeConfig) -> RunConfig:
    """The run config with the serve config's model and cluster: the replica plan and device rules read it."""
    return RunConfig(model=config.model, cluster=config.cluster)


def _api_host(address: str | None) -> str:
    """The host users reach the cluster's head at: the address's host, else this node's IP."""
    target = address or os.environ.get("RAY_ADDRESS", "")
    host = urlparse(target if "://" in target else f"//{target}").hostname
    if host and host not in ("auto", "localhost"):
        return host
    return ray.util.get_node_ip_address()
