"""The engine replicas: the Ray actor that owns one vLLM engine, the settings it is built with, the pool
that places replicas with placement groups, and the calls that turn an actor's death into `ReplicaDead`.

This is where a request becomes a vLLM call (`actor.EngineActor._one`).
"""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "EngineActor": "actor",
    "EngineInfo": "actor",
    "EngineDead": "actor",
    "EngineStartFailed": "actor",
    "EngineSettings": "settings",
    "engine_settings": "settings",
    "eager_by_default": "settings",
    "engine_dtype": "settings",
    "engine_chunked_prefill": "settings",
    "cpu_has_native_bf16": "settings",
    "ReplicaPool": "pool",
    "check_feasible": "pool",
    "cpu_thread_binding": "pool",
    "replica_call": "pool",
    "remote_message": "pool",
    "LogPlace": "logs",
    "describe_failure": "logs",
    "first_exception": "logs",
    "mark": "logs",
    "engine_core_cpus": "affinity",
    "pin_descendants": "affinity",
    "descendants": "affinity",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
