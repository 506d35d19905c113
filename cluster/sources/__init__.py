"""Where generations come from, behind one interface (`GenerationSource`): a run's own engine replicas, a
warm pool of the cluster, a sweep's shared replicas, or an OpenAI-compatible endpoint's clients. `choose`
picks one for a run's model under test or its local judge; each kind is registered with `@source(kind)`."""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "registry": (
        "GenerationSource",
        "SourceKind",
        "SourceRequest",
        "Started",
        "choose",
        "source",
        "start_logged",
        "where",
        "with_lora_slots",
        "run_engine_settings",
        "start_registered",
        "EndpointClients",
        "OwnReplicas",
        "WarmReplicas",
        "SweepReplicas",
    ),
    "pools": ("PoolRow", "PoolListing", "Stopped", "up", "list_pools", "down", "explain"),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
