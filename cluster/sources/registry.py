"""Where a run's generations come from, behind one interface: the run's own engine replicas, a warm pool on
the cluster, a sweep's shared replicas, or an OpenAI-compatible endpoint.

Each `GenerationSource` hands the dispatcher its `Replica`s (`start`), may replace one that died
(`replace`), says what it was for summary.json (`describe`) and lets go of what it holds (`close`). The
sources are registered by kind with `@source(kind)`, each builder holding the rule for when its kind serves
a request; `choose` asks them in `SourceKind`'s order, so the run's own replicas, last, serve whatever no
other does.
The model under test (`run.runner.RequestRunner`) and a local judge (`judging.backends.LocalJudgeBackend`)
both get theirs from `choose`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from cluster import timeline
from cluster.engines import EngineInfo, EngineSettings, ReplicaPlan, ReplicaPool
from cluster.engines.pool import StartAborted, recorded_log
from cluster.plan import RunPlan
from sharding.dispatcher import Replica
from sharding.requests import Adapter, Completion, PromptGroup

if TYPE_CHECKING:
    from cluster.config import RunConfig
    from cluster.endpoints import ApiClientPool
    from cluster.engines.logs import LogPlace
    from cluster.engines.warm import Lease, PoolRecord


class SharedEngines(Protocol):
    """A sweep's replicas (`run.SharedReplicas`): moved to a model, shared by the sweep's steps."""

    def replicas_for(self, model_path: str) -> tuple[list[Replica], list[EngineInfo]]: ...

    def stage_adapter(self, adapter: Adapter) -> None: ...


log = logging.getLogger(__name__)
LIVENESS_TIMEOUT_S = 30.0  # a pool replica that does not answer its liveness check within this counts as dead


class SourceKind(StrEnum):
    ENDPOINT = "endpoint"  # API client actors of an OpenAI-compatible endpoint
    SWEEP = "sweep"  # a sweep's replicas, shared by its steps
    WARM = "warm"  # a warm pool on the cluster, outliving the run
    OWN = "own"  # replicas the run starts and stops


@dataclass(frozen=True)
class SourceRequest:
    """What a run (or a local judge) asks of its source: engines of `settings` laid out as `plan`."""

    config: RunConfig
    settings: EngineSettings
    plan: ReplicaPlan
    count: int
    run_id: str
    verbose: bool = False
    core_slots: tuple[int, int] | None = None
    name_prefix: str = "replica"
    max_restarts: int = 0
    endpoint: bool = False  # the model under test is behind an OpenAI-compatible endpoint
    shared: SharedEngines | None = None  # a sweep's replicas
    warm_pools: bool = True  # whether a matching warm pool may serve
    warm_pool: str | None = None  # the one warm pool that must serve (a sweep holds it for its steps)
    keep_warm_s: float | None = None  # start the engines as a warm pool kept this long when idle
    lease_suffix: str = field(default_factory=lambda: secrets.token_hex(LEASE_SUFFIX_BYTES))

    @property
    def lease_id(self) -> str:
        """Whose lease a pool holds: the run id and a random part, so that concurrent requests with one run id
        (the judges of runs without --run-id, sweeps) hold leases of their own, and one's release leaves the
        other's."""
        return f"{self.run_id}-{self.lease_suffix}"


LEASE_SUFFIX_BYTES = 4


def lease_holder(lease_id: str) -> str:
    """The run id of a lease id (`SourceRequest.lease_id`), for people."""
    run_id, _, suffix = lease_id.rpartition("-")
    return run_id if run_id and len(suffix) == 2 * LEASE_SUFFIX_BYTES else lease_id


@dataclass
class Started:
    replicas: list[Replica]
    engines: list[EngineInfo] = field(default_factory=list)


class GenerationSource(Protocol):
    kind: SourceKind

    def start(self) -> Started: ...

    async def replace(self, dead: str) -> tuple[Replica, EngineInfo] | None: ...

    def describe(self) -> dict[str, Any]: ...

    def stage_adapter(self, adapter: Adapter) -> None:
        """The run's LoRA adapter on each of its engines' nodes (`ReplicaPool.stage_adapter`), once started."""
        ...

    def abort(self) -> None:
        """Stop a `start` in progress in another thread (an interrupted run): it gives up at once."""
        ...

    def close(self, served: Mapping[str, int]) -> None:
        """Release the engines; `served` holds the requests each replica answered for the run, by name."""
        ...


Builder = Callable[[SourceRequest], GenerationSource | None]
_SOURCES: dict[SourceKind, Builder] = {}


def source(kind: SourceKind) -> Callable[[Builder], Builder]:
    """Register a source kind's builder: it returns a source where it serves the request, else None."""

    def register(builder: Builder) -> Builder:
        _SOURCES[kind] = builder
        return builder

    return register


def choose(request: SourceRequest) -> GenerationSource:
    """The first source, in SourceKind's order, that serves the request (the run's own replicas serve any)."""
    for kind in SourceKind:
        found = _SOURCES[kind](request)
        if found is not None:
            return found
    raise RuntimeError("no generation source serves this run")  # OwnReplicas always does


class EndpointClients:
    kind = SourceKind.ENDPOINT

    def __init__(self, request: SourceRequest) -> None:
        self.request = request
        self.clients: ApiClientPool | None = None

    def start(self) -> Started:
        from cluster.endpoints import ApiSettings, start_api_clients

        config = self.request.config
        self.clients = start_api_clients(ApiSettings.from_endpoint_options(config.model, config.endpoint), 1)
        return Started(self.clients.replicas())

    async def replace(self, dead: str) -> tuple[Replica, EngineInfo] | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind.value}

    def stage_adapter(self, adapter: Adapter) -> None:
        return None  # an endpoint's model has no LoRA adapter of the run's (refused when planned)

    def abort(self) -> None:
        return None  # the API clients start in a moment

    def close(self, served: Mapping[str, int]) -> None:
        if self.clients is not None:
            self.clients.shutdown()


@source(SourceKind.ENDPOINT)
def _endpoint(request: SourceRequest) -> GenerationSource | None:
    return EndpointClients(request) if request.endpoint else None


class SweepReplicas:
    """A sweep's replicas, moved to this step's model; no replacements: they are not this run's alone."""

    kind = SourceKind.SWEEP

    def __init__(self, request: SourceRequest, shared: SharedEngines) -> None:
        self.request = request
        self.shared = shared

    def start(self) -> Started:
        replicas, engines = self.shared.replicas_for(self.request.settings.model)
        return Started(replicas, engines)

    async def replace(self, dead: str) -> tuple[Replica, EngineInfo] | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind.value}

    def stage_adapter(self, adapter: Adapter) -> None:
        self.shared.stage_adapter(adapter)

    def abort(self) -> None:
        return None  # the sweep moves them between its steps, not this run

    def close(self, served: Mapping[str, int]) -> None:
        return None  # the sweep closes them after its last step


@source(SourceKind.SWEEP)
def _sweep(request: SourceRequest) -> GenerationSource | None:
    return SweepReplicas(request, request.shared) if request.shared is not None else None


class OwnReplicas:
    """Engine replicas this run starts, replaces within its restarts, and stops."""

    kind = SourceKind.OWN

    def __init__(self, request: SourceRequest, count: int | None = None, first_index: int = 0) -> None:
        self.request = request
        self.pool = ReplicaPool(
            request.settings,
            request.plan,
            request.count if count is None else count,
            request.config.model.cpu_kv_cache_gib,
            request.verbose,
            name_prefix=request.name_prefix,
            core_slots=request.core_slots,
            max_restarts=request.max_restarts,
            first_index=first_index,
        )

    def start(self) -> Started:
        engines = start_logged(self.pool, self.request)
        return Started(self.pool.replicas(), engines)

    async def replace(self, dead: str) -> tuple[Replica, EngineInfo] | None:
        return await asyncio.to_thread(self.pool.replace, dead)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "restarts_used": self.pool.restarts_used}

    def stage_adapter(self, adapter: Adapter) -> None:
        self.pool.stage_adapter(adapter)

    def abort(self) -> None:
        self.pool.abort()

    def close(self, served: Mapping[str, int]) -> None:
        self.pool.shutdown()


class WarmReplicas:
    """A warm pool of the cluster whose key equals the run's (`engines.warm`): its replicas, under a lease
    renewed while the run goes on; replicas found dead are replaced in the pool, and the run starts its own
    for the replicas it asks beyond the pool's. With `keep_warm_s` and no such pool, the run starts its
    engines as a new pool that stays up when it ends."""

    kind = SourceKind.WARM

    def __init__(self, request: SourceRequest, registry: Any, record: PoolRecord | None) -> None:
        self.request = request
        self.registry = registry
        self.record = record
        self.pool: ReplicaPool | None = None
        self.extra: OwnReplicas | None = None
        self.lease: Lease | None = None
        self.start_saved_s = 0.0
        self.started_pool = record is None
        self.found_dead = 0  # the pool's replicas found dead when the run began, replaced then
        self.starting: ReplicaPool | None = None  # the new pool while it starts (for `abort`)
        self.aborted = False
        self.beside: set[str] = set()  # the replicas this run started beside the pool, replacements included

    def start(self) -> Started:
        from cluster.engines.warm import Lease

        record = self.record or self._new_pool()
        self.record = record
        self.lease = Lease(self.registry, record.name, self.request.lease_id)
        self.pool = ReplicaPool.adopt(record, self.request.verbose)
        if self.aborted:  # `abort` came before there was a pool to tell (it tells this one from now on)
            raise StartAborted()
        self.pool.max_restarts = len(record.engines)  # each replica found dead may be replaced once
        self.pool.placement_timeout_s = self.request.config.cluster.placement_timeout_s
        if not self.started_pool:
            self._replace_the_dead()
            if self.aborted:  # a replacement gave up (or was not begun): the run is stopping
                raise StartAborted()
        # the run's own restarts from here on, whatever finding the dead took
        self.pool.max_restarts = self.pool.restarts_used + self.request.max_restarts
        timeline.mark("engines ready")
        replicas, engines = [self._shared(r) for r in self.pool.replicas()], list(self.pool.infos)
        beyond = self.request.count - len(replicas)
        if beyond > 0:
            log.info("the run asks %d replicas, pool %s has %d: starting %d more", self.request.count,
                     record.name, len(replicas), beyond)  # fmt: skip
            alongside = replace(self.request, settings=beside_pool(self.request.settings, record.settings))
            self.extra = OwnReplicas(alongside, beyond, first_index=len(replicas))
            if self.aborted:
                self.extra.abort()
            more = self.extra.start()
            self.beside.update(info.name for info in more.engines)
            replicas, engines = replicas + more.replicas, engines + more.engines
        if not self.started_pool and not self.found_dead and self.extra is None:
            # what a cold run pays for these engines: each actor's vLLM import, then the engine's build; a run
            # that started an engine itself (a replacement, replicas beyond the pool's) waited for one anyway
            self.start_saved_s = max((info.import_s + info.start_s for info in self.pool.infos), default=0.0)
            log.info(
                "generating on warm pool %s: %.1f s of engine start saved", record.name, self.start_saved_s
            )
        return Started(replicas, engines)

    def _new_pool(self) -> PoolRecord:
        """The run's engines started as a warm pool, kept `keep_warm_s` after its last use. Its name is the
        settings' default one, or that with a number where a pool has it already (a run with
        --no-warm-pools beside a pool of the same settings)."""
        import ray

        from cluster.engines.warm import default_pool_name

        request = self.request
        name = ray.get(self.registry.claim_name.remote(default_pool_name(request.settings)))
        pool = self.starting = ReplicaPool(request.settings, request.plan, request.count,
                                           request.config.model.cpu_kv_cache_gib, request.verbose,
                                           core_slots=request.core_slots, warm=name)  # fmt: skip
        if self.aborted:  # interrupted before the pool existed to be told
            pool.abort()
        try:
            record = start_registered(pool, request, self.registry, request.keep_warm_s or 0.0)
        except BaseException:
            self.registry.release_name.remote(name)
            raise
        return ray.get(self.registry.acquire.remote(record.key, request.lease_id, name))

    def _replace_the_dead(self) -> None:
        """Replicas of the pool whose actor died since it was last used: replaced now, their cause said (the
        root error in the engine's log after where it stood when a run last found the replica well: the
        record's `log_marks`)."""
        from cluster.engines.pool import dead_actor_cause

        assert self.pool is not None and self.record is not None
        dead = {name: "its actor is gone" for name in self.pool.missing}
        for actor, info in zip(list(self.pool.actors), list(self.pool.infos), strict=True):
            answer = liveness(actor, info.name)
            if isinstance(answer, str):
                dead[info.name] = answer
                index = self.pool.infos.index(info)
                del self.pool.actors[index], self.pool.infos[index], self.pool.log_marks[index]
            else:  # a death during this run is looked for after what runs before logged
                self.pool.marked(info.name, answer)
        for name, message in dead.items():
            cause = asyncio.run(dead_actor_cause(message, recorded_log(self.record, name)))
            log.warning("pool %s: %s had died (%s); replacing it", self.record.name, name, cause)
            self.found_dead += 1
            self._replace_registered(name)

    def _replace_registered(self, dead: str) -> tuple[Replica, EngineInfo] | None:
        """Replace `dead` in the pool and enter the replacement in the registry, in one call (blocking): a run
        that ends meanwhile cancels only its wait for this, not the registration, so a replacement that
        started is never left outside the pool. Where another run replaced `dead` first (before this one
        began, or while it waited for room that the other's replacement took), that one is used and this
        one's stopped; where the pool was stopped meanwhile (`rayeval down`, its idle timeout), or no longer
        knows `dead` (`PoolRecord.record_replacement` keeps the last replacements), the replacement is
        stopped too."""
        import ray

        assert self.pool is not None and self.record is not None
        adopted = self._adopt_replacement(dead)
        if adopted is not None:
            return adopted
        found = self.pool.replace(dead)
        if found is None:  # no room: another run's replacement may be what took it
            return self._adopt_replacement(dead)
        info = found[1]
        started = self.pool.log_of(info.name)
        entered = self.registry.replaced.remote(
            self.record.name, dead, info, self.pool.group_ids[info.name], started.places if started else ()
        )
        current = ray.get(entered)
        if current is not None and current.name == info.name:
            return self._shared(found[0]), info
        self.pool.drop(info.name)
        if current is None:
            log.warning("pool %s was stopped while %s replaced %s (or no longer knows %s): stopping it too",
                        self.record.name, info.name, dead, dead)  # fmt: skip
            return None
        return self._adopt_replacement(dead)

    def _adopt_replacement(self, dead: str) -> tuple[Replica, EngineInfo] | None:
        """The replica another run entered in `dead`'s place, taken into this run's pool; None where none is."""
        import ray

        assert self.pool is not None and self.record is not None
        record = ray.get(self.registry.get.remote(self.record.name))
        current = record.in_place_of(dead) if record is not None else None
        if current is None or current.name not in record.groups:
            return None
        log.info(
            "pool %s: another run replaced %s (%s); using that one", self.record.name, dead, current.name
        )
        adopted = self.pool.adopt_replica(
            current,
            record.groups[current.name],
            record.slots.get(current.name, (0, 1)),
            recorded_log(record, current.name),
        )
        return None if adopted is None else (self._shared(adopted[0]), adopted[1])

    def _shared(self, replica: Replica) -> Replica:
        """A pool replica's handle whose window is the run's part among the runs sending to the pool, and
        whose calls tell the lease that this run is one of them."""
        lease, generate = self.lease, replica.generate
        assert lease is not None

        async def counted(group: PromptGroup) -> list[Completion]:
            with lease.count_call():
                return await generate(group)

        return replace(replica, generate=counted, shared_by=lease.runs_sharing)

    async def replace(self, dead: str) -> tuple[Replica, EngineInfo] | None:
        if self.extra is not None and dead in self.beside:
            found = await self.extra.replace(dead)
            if found is not None:
                self.beside.add(found[1].name)
            return found
        return await asyncio.to_thread(self._replace_registered, dead)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "pool": self.record.name if self.record else None,
            "started_by_this_run": self.started_pool,
            "idle_timeout_s": self.record.idle_timeout_s if self.record else None,
            "start_saved_s": round(self.start_saved_s, 3),
            "own_replicas_beyond_the_pool": self.extra.pool.count if self.extra else 0,
            "replaced_when_found_dead": self.found_dead,
            # the most leases sending to the pool at once, at this run's renewals: its windows were divided so
            "runs_sharing_at_most": self.lease.most_runs_sharing if self.lease else 1,
            "restarts_used": (self.pool.restarts_used - self.found_dead if self.pool else 0)
            + (self.extra.pool.restarts_used if self.extra else 0),
        }

    def stage_adapter(self, adapter: Adapter) -> None:
        for pool in (self.pool, self.extra.pool if self.extra else None):
            if pool is not None:
                pool.stage_adapter(adapter)

    def abort(self) -> None:
        self.aborted = True  # for what is not made yet: the new pool, the adopted one, the replicas beside
        for pool in (self.starting, self.pool, self.extra.pool if self.extra else None):
            if pool is not None:
                pool.abort()

    def close(self, served: Mapping[str, int]) -> None:
        if self.lease is not None:  # the pool's count leaves out the replicas started beside it
            served_here = sum(count for name, count in served.items() if name not in self.beside)
            self.lease.release(served_here, self.pool.logs_now() if self.pool is not None else {})
        if self.extra is not None:
            self.extra.close(served)


def liveness(actor: Any, name: str) -> tuple[LogPlace, ...] | str:
    """The replica's answer to its liveness check: where its log files stand now, or why it gave none within
    LIVENESS_TIMEOUT_S. Ray's "unavailable" (its node out of reach for a moment) is asked again, as the
    dispatcher's calls are."""
    from cluster.engines.pool import asked_while_unavailable, remote_message

    async def alive() -> list[LogPlace]:
        return await asyncio.wait_for(asyncio.wrap_future(actor.alive.remote().future()), LIVENESS_TIMEOUT_S)

    try:
        return tuple(asyncio.run(asked_while_unavailable(alive, name)))
    except TimeoutError:
        return f"no answer to its liveness check within {LIVENESS_TIMEOUT_S:g} s"
    except Exception as exc:  # noqa: BLE001 - any other failure to answer means the replica is gone
        return remote_message(exc)


def register_pool(registry: Any, pool: ReplicaPool, idle_timeout_s: float) -> PoolRecord:
    """Enter a started warm pool in the cluster's registry."""
    import ray

    from cluster.engines.warm import PoolKey, PoolRecord

    assert pool.warm is not None
    record = PoolRecord(
        name=pool.warm,
        key=PoolKey.of(pool.settings),
        settings=pool.settings,
        plan=pool.plan,
        kv_cache_gib=pool.kv_cache_gib,
        idle_timeout_s=idle_timeout_s,
        engines={info.name: info for info in pool.infos},
        groups=dict(pool.group_ids),
        slots=dict(pool.slots),
        log_marks={info.name: logs.places for info, logs in zip(pool.infos, pool.log_marks, strict=True)},
    )
    ray.get(registry.put.remote(record))
    return record


def start_registered(
    pool: ReplicaPool, request: SourceRequest, registry: Any, idle_timeout_s: float
) -> PoolRecord:
    """Start a warm pool's engines and enter it in the registry. A pool that fails to start stops what it
    started (`ReplicaPool.start`); one that started but could not be entered (or whose start was
    interrupted at the last moment) is stopped here: its detached actors would otherwise outlive the
    command, unlisted, holding their resources and names."""
    start_logged(pool, request)
    try:
        if pool.closing:  # told to stop as its last engine came up
            raise StartAborted()
        return register_pool(registry, pool, idle_timeout_s)
    except BaseException:
        pool.shutdown(graceful=False)
        raise


@source(SourceKind.WARM)
def _warm(request: SourceRequest) -> GenerationSource | None:
    """A warm pool with the run's key, where the run may use one; or a new one, where it is to keep warm."""
    if not request.warm_pools and request.keep_warm_s is None:
        return None
    import ray

    from cluster.engines.warm import PoolKey, registry
    from cluster.errors import ClusterError

    try:
        found = registry(create=request.keep_warm_s is not None)
    except ClusterError as exc:  # another version's registry: its pools are not this run's to use or join
        if request.warm_pool is not None:
            raise
        log.warning("the run starts its own engines and keeps none warm: %s", exc)
        return None
    record = None
    if found is not None and request.warm_pools:
        key = PoolKey.of(request.settings)
        asked = request.config.cluster.keep_warm_s  # as given: a run's default keep-warm raises no pool's
        record = ray.get(found.acquire.remote(key, request.lease_id, request.warm_pool, asked))
    if record is None and request.warm_pool is not None:
        raise ClusterError(
            f"Warm pool {request.warm_pool}, which the sweep holds for its steps, no longer serves them (stopped "
            "with `rayeval down`?): run the sweep again; it reuses every finished step."
        )
    if found is None or (record is None and request.keep_warm_s is None):
        return None
    return WarmReplicas(request, found, record)


@source(SourceKind.OWN)
def _own(request: SourceRequest) -> GenerationSource | None:
    return OwnReplicas(request)


def beside_pool(run: EngineSettings, pool: EngineSettings) -> EngineSettings:
    """The settings of the replicas a run starts beside a warm pool that serves it: the run's, with the dtype
    that one of the two names. A pool serves a run that asks `auto` where auto becomes the pool's dtype on
    the pool's nodes; an extra replica asking `auto` could land on a node where it becomes another one."""
    return replace(run, dtype=run.dtype if run.dtype != "auto" else pool.dtype)


def start_logged(pool: ReplicaPool, request: SourceRequest) -> list[EngineInfo]:
    """Start the pool's engines and log where each is."""
    log.info("starting %d engine replica(s) of %s", pool.count, request.plan.describe())
    engines = list(pool.start(request.config.cluster.placement_timeout_s))
    for info in engines:
        imported = f" after {info.import_s:.1f} s importing vLLM" if info.import_s else ""
        log.info("%s ready on %s in %.1f s%s (vLLM %s, executor %s)", info.name, where(info), info.start_s,
                 imported, info.vllm_version, info.executor)  # fmt: skip
    return engines


def where(info: EngineInfo) -> str:
    """The replica's node, or its bundles' nodes where they are several (a replica over nodes)."""
    nodes = list(dict.fromkeys(info.nodes)) or [info.node_id]
    return f"node {nodes[0][:8]}" if len(nodes) == 1 else f"nodes {', '.join(n[:8] for n in nodes)}"


def run_engine_settings(plan: RunPlan, verbose: bool = False) -> EngineSettings:
    """The engines a run's model under test asks for (what its warm pool's key is made from)."""
    from cluster.engines import engine_settings

    config = plan.config
    settings = engine_settings(config.model, plan.model.path, plan.device, log_stats=verbose)
    return with_lora_slots(settings, 1, config.model.max_lora_rank if plan.adapter is not None else 0)


def with_lora_slots(settings: EngineSettings, max_loras: int, rank: int) -> EngineSettings:
    """Engines with LoRA layers of up to `rank` (0: none) and `max_loras` slots: a run's where its requests
    carry an adapter (a merged adapter's plan has none), an Evaluator's that adapters are pushed to (its
    config names no adapter: the rank comes from the caller, not from the settings, which have none)."""
    return replace(settings, max_loras=max_loras, max_lora_rank=rank)
