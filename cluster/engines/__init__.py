"""The engine replicas: the Ray actor that owns one vLLM engine, the settings it is built with, where a replica
goes (its resources and placement-group layout, and whether this machine has a GPU), the pool that places
replicas with placement groups, and the calls that turn an actor's death into `ReplicaDead`.

This is where a request becomes a vLLM call (`actor.EngineActor._one`).
"""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "actor": ("EngineActor", "EngineInfo", "EngineDead", "EngineStartFailed"),
    "settings": (
        "EngineSettings",
        "engine_settings",
        "eager_by_default",
        "engine_dtype",
        "engine_chunked_prefill",
        "engine_block_size",
        "engine_lora_args",
        "engine_args",
        "engine_max_num_seqs",
        "cpu_has_native_bf16",
        "cpu_kv_cache_bytes",
        "cpu_kv_cache_env",
        "VLLM_CPU_KV_CACHE_ENV",
    ),
    "placement": ("ExecutorKind", "ReplicaLayout", "ReplicaPlan", "replica_plan"),
    "devices": ("local_gpus_visible", "gpu_device_files", "nvml_gpu_count"),
    "pool": (
        "ReplicaPool",
        "check_feasible",
        "replica_call",
        "remote_message",
    ),
    "cores": (
        "cpu_thread_binding",
        "single_worker_omp_env",
        "bind_this_node",
        "ENGINE_CORE_SLOT_ENV",
        "BINDING_ENV",
    ),
    "logs": ("LogPlace", "EngineLog", "describe_failure", "first_exception", "mark", "read_on_node"),
    "affinity": ("engine_core_cpus", "pin_descendants", "descendants"),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
