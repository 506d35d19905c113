"""Engine replicas on a Ray cluster: placement groups, fail-fast resource checks, and dispatch wrappers."""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from cluster import timeline
from cluster.engines.actor import EngineActor, EngineDead, EngineInfo, EngineStartFailed
from cluster.engines.cores import ENGINE_CORE_SLOT_ENV
from cluster.engines.logs import EngineLog, LogPlace, describe_failure, read_on_node
from cluster.engines.placement import ExecutorKind, ReplicaLayout, ReplicaPlan
from cluster.engines.settings import EngineSettings, cpu_kv_cache_env, serving
from cluster.errors import ClusterError
from cluster.forwarded_env import for_engines
from cluster.models.checkpoints import MergedFrom, adapter_digest, adapter_files, merged_from_of
from sharding.dispatcher import Replica, ReplicaCall, ReplicaDead
from sharding.requests import Adapter, Completion, PromptGroup

if TYPE_CHECKING:
    from cluster.engines.warm import PoolRecord

log = logging.getLogger(__name__)
T = TypeVar("T")

ENGINE_QUEUE_FACTOR = 2  # sequences in flight per replica, in units of the engine's max_num_seqs
ABORT_CHECK_S = 0.5  # how often a start that waits looks whether it is to stop
UNAVAILABLE_PAUSES_S = (1.0, 2.0, 4.0)  # before asking an unavailable actor again; then it counts as dead


class StartAborted(ClusterError):
    """A pool's start given up because the pool was told to stop (`ReplicaPool.abort`)."""

    def __init__(self) -> None:
        super().__init__("the engines' start was stopped (the run was interrupted)")


def check_feasible(plan: ReplicaPlan, replicas: int) -> ReplicaLayout:
    """The replicas' layout on this cluster; fails at once, with the numbers, when no node (or, for a GPU
    replica over nodes, no set of nodes) could ever hold one replica, or the cluster all of them."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    layout = plan.layout_for(nodes)
    if layout is None:
        largest = {k: max((node.get(k, 0) for node in nodes), default=0) for k in plan.bundle}
        over_nodes = (
            "vLLM's CPU backend runs a replica on one node only"
            if plan.over_nodes() is None and plan.workers > 1
            else "nor do the GPU nodes together"
        )
        raise ClusterError(
            f"Each replica needs {plan.describe()}, but the largest node of this cluster offers "
            f"{', '.join(f'{v:g} {k}' for k, v in largest.items())} ({over_nodes}). Lower "
            "--tensor-parallel-size / --pipeline-parallel-size or --cpus-per-worker, pick --device to match the "
            "hardware, or add a node that big (ray-config.yaml's worker node type)."
        )
    total = {k: sum(node.get(k, 0) for node in nodes) for k in plan.bundle}
    short = {k: v * replicas for k, v in plan.bundle.items() if v * replicas > total[k]}
    if short:
        raise ClusterError(
            f"{replicas} replicas need {', '.join(f'{v:g} {k}' for k, v in short.items())} in all, but the cluster "
            f"has {', '.join(f'{total[k]:g} {k}' for k in short)}. Lower --replicas or grow the cluster."
        )
    return layout


class ReplicaPool:
    """Starts `count` engine replicas, each in its own placement group, and hands them to the dispatcher."""

    def __init__(
        self,
        settings: EngineSettings,
        plan: ReplicaPlan,
        count: int,
        kv_cache_gib: float,
        verbose: bool,
        *,
        name_prefix: str = "replica",
        core_slots: tuple[int, int] | None = None,
        max_restarts: int = 0,
        warm: str | None = None,
        first_index: int = 0,
    ) -> None:
        """`core_slots` = (first slot, slots on the node) when another pool shares the node's cores (a local
        judge beside the model's replicas): CPU thread binding then counts both pools. `max_restarts` bounds
        the replacements `replace` starts over the pool's life. `warm`: the name of the warm pool these
        replicas belong to: their actors and placement groups are then detached and named after it
        (`engines.warm`), so they outlive this process; `first_index` numbers them after those it has."""
        self.warm = warm
        self.first_index = first_index
        self.group_ids: dict[str, str] = {}  # a warm pool's placement groups (hex ids) by replica name
        self.missing: list[str] = []  # an adopted pool's replicas whose actors were gone
        self.settings = settings
        self.name_prefix = name_prefix
        self.core_slots = core_slots
        self.plan = plan
        self.count = count
        self.kv_cache_gib = kv_cache_gib
        self.verbose = verbose
        self.groups: dict[str, PlacementGroup] = {}  # by replica name
        self.actors: list[ray.actor.ActorHandle] = []  # in step with `infos`: the replicas that serve
        self.starting: dict[str, ray.actor.ActorHandle] = {}  # replacements whose engines are starting
        self.infos: list[EngineInfo] = []
        self.log_marks: list[EngineLog] = []
        self.adapters: dict[str, Adapter] = {}  # by identity: the LoRA adapters staged on the replicas' nodes
        # by replica name: (index, count) among the replicas sharing a host's cores
        self.slots: dict[str, tuple[int, int]] = {}
        self.max_restarts = max_restarts
        self.restarts_used = 0
        self.placement_timeout_s = 0.0
        self.layout = plan.one_node()  # the cluster's nodes decide at start
        self.closing = False
        self._lock = threading.Lock()  # `replace` runs in a worker thread beside the dispatcher and shutdown

    @classmethod
    def adopt(cls, record: PoolRecord, verbose: bool = False) -> ReplicaPool:
        """The replicas of a warm pool another process started, as a pool of this process: its actors found by
        name, its engines as they were when started, ready for the dispatcher (and for `replace`)."""
        from cluster.engines.warm import NAMESPACE, actor_name, placement_group_of

        pool = cls(record.settings, record.plan, len(record.engines), record.kv_cache_gib, verbose,
                   max_restarts=1 << 30, warm=record.name)  # fmt: skip
        pool.layout = (
            record.plan.layout_for([n["Resources"] for n in ray.nodes() if n.get("Alive")]) or pool.layout
        )
        for replica, info in record.engines.items():
            pool.group_ids[replica] = record.groups[replica]
            pool.groups[replica] = placement_group_of(record.groups[replica])
            pool.slots[replica] = record.slots.get(replica, (0, 1))
            try:
                pool.actors.append(ray.get_actor(actor_name(record.name, replica), namespace=NAMESPACE))
            except ValueError:  # its actor is gone (a dead actor's name is free): for the caller to replace
                pool.missing.append(replica)
                continue
            pool.infos.append(info)
            pool.log_marks.append(recorded_log(record, replica))
        return pool

    def start(self, placement_timeout_s: float) -> list[EngineInfo]:
        """Place and start the replicas. Whatever fails (no room in time, an engine that does not start, an
        interrupt) stops what was started: a warm pool's groups and actors are detached and would outlive
        this process, holding their resources and names."""
        self.layout = check_feasible(self.plan, self.count)
        self.placement_timeout_s = placement_timeout_s
        try:
            self._place_and_launch(placement_timeout_s)
            self._stage_merged(self.actors, self.settings.model, self.settings.merged_from)
            self.infos = self._gathered([a.start.remote(for_engines()) for a in self.actors])
        except ClusterError:  # StartAborted too; the others may still be building: nothing to drain, kill
            self.shutdown(graceful=False)
            raise
        except Exception as exc:
            self.shutdown(graceful=False)
            raise ClusterError(
                f"The vLLM engine for '{self.settings.model}' failed to start: {remote_message(exc)}. Check that the "
                "model path or HF id is right and reachable from every node, and that max_model_len fits."
            ) from None
        except BaseException:  # an interrupt: stop at once
            self.shutdown(graceful=False)
            raise
        # where each engine's log stands now: a replica that dies later has its root error after this mark
        self.log_marks = self._logs_now(self.actors, self.infos)
        return self.infos

    def _place_and_launch(self, placement_timeout_s: float) -> None:
        names = [
            f"{self.name_prefix}-{index}" for index in range(self.first_index, self.first_index + self.count)
        ]
        self.groups = {name: self._placement_group(name) for name in names}
        try:
            self._gathered([g.ready() for g in self.groups.values()], placement_timeout_s)
            timeline.mark("placement groups ready")
        except GetTimeoutError:
            raise ClusterError(
                f"{self.count} replica(s) of {self.plan.describe()} could not be placed within "
                f"{placement_timeout_s:g} s: the resources exist but other work holds them.{held_by_pools()} "
                "Wait for it, lower --replicas, or raise cluster.placement_timeout_s."
            ) from None
        host_of_node = {n["NodeID"]: n.get("NodeManagerAddress", "") for n in ray.nodes()}
        hosts = [self._host_of(g, host_of_node) for g in self.groups.values()]
        for index, (name, group) in enumerate(self.groups.items()):
            same_node = [i for i, n in enumerate(hosts) if n == hosts[index]]
            slot = (same_node.index(index), len(same_node))
            if self.core_slots is not None:
                slot = (self.core_slots[0] + slot[0], self.core_slots[1])
            self.slots[name] = slot
            with self._lock:  # a shutdown meanwhile (an interrupt) either sees the actor or stops the launch
                if self.closing:
                    return
                self.actors.append(self._launch(name, group, slot))
        timeline.mark("engine actors launched", latest=True)  # the last launch of this start

    def abort(self) -> None:
        """Make a start or a replacement that another thread is waiting on give up at once (an interrupted
        run); that thread then stops what it started."""
        with self._lock:
            self.closing = True

    def _gathered(self, refs: list[ray.ObjectRef], timeout_s: float | None = None) -> list[Any]:
        """`ray.get(refs, timeout=timeout_s)`, waited for in short steps that end in StartAborted once the
        pool is closing (`abort`), instead of after every engine has started; the first ref that fails
        raises at once, as `ray.get` of the list would."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pending = list(refs)
        while pending:
            if self.closing:
                raise StartAborted()
            step = (
                ABORT_CHECK_S
                if deadline is None
                else max(0.0, min(ABORT_CHECK_S, deadline - time.monotonic()))
            )
            done, pending = ray.wait(pending, num_returns=1, timeout=step)
            ray.get(done)  # a failed start raises now, not once the slowest replica is up
            if pending and not done and deadline is not None and time.monotonic() >= deadline:
                raise GetTimeoutError()
        return ray.get(refs)

    def load_checkpoint(self, path: str) -> list[EngineInfo]:
        """Move every replica's engine to the full checkpoint at `path` in its own actor (a sweep's next
        step; `EngineActor.load_checkpoint`), all at once; call it only while no request is in flight. A
        merged checkpoint (its folder says so) is merged again on a node without the folder."""
        merged_from = merged_from_of(Path(path))
        try:
            self._stage_merged(self.actors, path, merged_from)
            calls = [actor.load_checkpoint.remote(path, merged_from=merged_from) for actor in self.actors]
            self.infos = ray.get(calls)
        except Exception as exc:
            raise ClusterError(
                f"The engines could not move to the checkpoint {path}: {remote_message(exc)}. Check that it is a "
                "complete model folder readable from every node."
            ) from None
        self.settings = serving(self.settings, path, merged_from=merged_from)
        self.log_marks = self._logs_now(self.actors, self.infos)
        return self.infos

    def push_weights(self, packed: ray.ObjectRef, label: str) -> list[EngineInfo]:
        """Every replica's engine loads the packed tensors (`cluster.engines.pushed_weights.pack`, in the
        object store) in place, all at once (`EngineActor.push_weights`); only while no request is in flight."""
        try:
            self.infos = ray.get([actor.push_weights.remote(packed, label) for actor in self.actors])
        except Exception as exc:
            raise ClusterError(
                f"The engines could not load the weights of {label}: {remote_message(exc)}"
            ) from None
        self.log_marks = self._logs_now(self.actors, self.infos)
        return self.infos

    def stage_files(self, folder: str, files: dict[str, bytes]) -> None:
        """`files` written into `folder` on every replica's node (`EngineActor.stage_files`)."""
        try:
            ray.get([actor.stage_files.remote(folder, files) for actor in self.actors])
        except Exception as exc:
            raise ClusterError(
                f"Could not write {folder} on every replica's node: {remote_message(exc)}"
            ) from None

    def _placement_group(self, replica: str) -> PlacementGroup:
        if self.warm is None:
            return placement_group(list(self.layout.bundles), strategy=self.layout.strategy)
        from cluster.engines.warm import actor_name

        group = placement_group(
            list(self.layout.bundles),
            strategy=self.layout.strategy,
            name=actor_name(self.warm, replica),
            lifetime="detached",
        )
        self.group_ids[replica] = group.id.hex()  # names are per Ray namespace: the pool keeps ids
        return group

    def _launch(self, name: str, group: PlacementGroup, slot: tuple[int, int]) -> ray.actor.ActorHandle:
        first = self.layout.bundles[0]
        over_nodes = self.layout.executor is ExecutorKind.RAY
        # Over nodes, vLLM's Ray executor starts one GPU actor per bundle inside this placement group (the
        # engine passes it on), so the engine actor holds no GPU itself and its child tasks stay in the group.
        options: dict[str, Any] = {}
        if self.warm is not None:  # a warm pool's replica: it outlives this process, found by its name
            from cluster.engines.warm import NAMESPACE, actor_name

            options = {"name": actor_name(self.warm, name), "namespace": NAMESPACE, "lifetime": "detached"}
        return EngineActor.options(
            num_cpus=first.get("CPU", 0),
            num_gpus=0 if over_nodes else first.get("GPU", 0),
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=0, placement_group_capture_child_tasks=over_nodes
            ),
            **options,
        ).remote(name, replace(self.settings, executor=self.layout.executor), self._env(*slot))

    def replace(self, dead: str) -> tuple[Replica, EngineInfo] | None:
        """Start a replica in place of `dead` (blocking: the caller runs it in a thread). Its placement group
        goes first, so the resources it held (or Ray would re-place after a node loss) are free; the new one
        waits up to placement_timeout_s for room. None when the run's restarts are used up, no room came, the
        engine did not start, or the pool is shutting down; what a replacement that fails made (its group,
        its actor) is removed again, so a warm pool's detached ones do not outlive it."""
        with self._lock:
            if self.closing or self.restarts_used >= self.max_restarts:
                log.warning(
                    "no replacement for %s: %d of %d restarts used",
                    dead,
                    self.restarts_used,
                    self.max_restarts,
                )
                return None
            self.restarts_used += 1
            old = self.groups.pop(dead, None)
            if old is not None:
                remove_placement_group(old)
            name = self._replacement_name(dead)
            group = self.groups[name] = self._placement_group(name)
            self.slots[name] = self.slots[dead]  # the lost replica's cores, free now where it shared a host
        if not self._placed(group):
            log.warning("no room for a replacement of %s within %g s", dead, self.placement_timeout_s)
            self.drop(name)
            return None
        with self._lock:  # launched under the lock, so a shutdown either sees the actor or stops the launch
            if self.closing:
                return None
            actor = self.starting[name] = self._launch(name, group, self.slots[name])
        try:
            self._stage_merged([actor], self.settings.model, self.settings.merged_from)
            staged = self._stage_adapters_on(actor)
            info = ray.get(actor.start.remote(for_engines()))
            [logs] = self._logs_now([actor], [info])
        except Exception as exc:  # noqa: BLE001 - a replacement that cannot start leaves the run as it was
            log.warning("the replacement of %s did not start: %s", dead, remote_message(exc))
            self.drop(name)
            return None
        with self._lock:
            if self.closing or self.starting.pop(name, None) is None:
                return None  # stopped meanwhile (`shutdown` killed it)
            self.actors.append(actor)
            self.infos.append(info)
            self.log_marks.append(logs)
        self._stage_adapters_on(actor, skip=staged)  # those a run staged on the pool meanwhile
        return self._replica(actor, info, logs), info

    def adopt_replica(
        self, info: EngineInfo, group_id: str, slot: tuple[int, int], logs: EngineLog
    ) -> tuple[Replica, EngineInfo] | None:
        """A replica of this warm pool that another process started (its actor found by name, its placement
        group by id, its cores' slot, where its log stood as the registry has it), served from now on and
        replaceable as the pool's own; None where its actor is gone already."""
        from cluster.engines.warm import NAMESPACE, actor_name, placement_group_of

        assert self.warm is not None
        try:
            actor = ray.get_actor(actor_name(self.warm, info.name), namespace=NAMESPACE)
        except ValueError:
            return None
        with self._lock:
            self.group_ids[info.name] = group_id
            self.groups[info.name] = placement_group_of(group_id)
            self.slots[info.name] = slot
            self.actors.append(actor)
            self.infos.append(info)
            self.log_marks.append(logs)
        self._stage_adapters_on(actor)  # another run's replacement, served from now on
        return self._replica(actor, info, logs), info

    def stage_adapter(self, adapter: Adapter) -> None:
        """The adapter copied to each replica's node that lacks it (`stage_adapter_on`), and to each new
        replica's node from now on (a replacement, or one adopted from another run)."""
        with self._lock:
            self.adapters[adapter.identity] = adapter
            actors = list(self.actors)
        stage_adapter_on(actors, adapter)

    def _stage_adapters_on(
        self, actor: ray.actor.ActorHandle, skip: frozenset[str] = frozenset()
    ) -> frozenset[str]:
        """The adapters staged on the pool's replicas so far (but `skip`), on a new replica's node too; returns
        their identities. One that cannot be copied (its folder gone where the run is coordinated: an older
        step's) is logged: its requests fail there naming it, the replica serves the rest."""
        with self._lock:
            adapters = {key: adapter for key, adapter in self.adapters.items() if key not in skip}
        for adapter in adapters.values():
            _staged_or_logged([actor], adapter)
        return skip | frozenset(adapters)

    @staticmethod
    def _stage_merged(actors: list[ray.actor.ActorHandle], path: str, merged_from: MergedFrom | None) -> None:
        """Where `path` is a merged checkpoint, its adapter on the nodes of those actors that lack the folder
        (they merge their own copy from it, `EngineActor._checkpoint_here`). Best effort: an engine that
        cannot get it fails to load the checkpoint naming the adapter and its node."""
        if merged_from is None:
            return
        held = _answers_while_available(actors, lambda actor: actor.holds_checkpoint.remote(path))
        _staged_or_logged([actor for actor, found in zip(actors, held, strict=True) if found is False],
                          merged_from.adapter)  # fmt: skip

    def _replacement_name(self, dead: str) -> str:
        """`replica-0.1`, `replica-0.2`, ... within a run. A warm pool's replicas are replaced by whichever
        run finds them dead, each counting from its own start, and their actors and groups are named in the
        cluster: those get a random suffix, so no two runs' replacements ever claim one name."""
        base = dead.split(".")[0]
        return f"{base}.{self.restarts_used}" if self.warm is None else f"{base}.{secrets.token_hex(3)}"

    def drop(self, name: str) -> None:
        """Remove the replica `name` (a replacement that failed, or one no pool holds any more), served or
        still starting: its actor killed, its placement group removed."""
        with self._lock:
            actor = self.starting.pop(name, None)
            index = self._index_of(name)
            if index is not None:
                actor = self.actors.pop(index)
                del self.infos[index], self.log_marks[index]
            group = self.groups.pop(name, None)
            self.group_ids.pop(name, None)
            self.slots.pop(name, None)
        if actor is not None:
            ray.kill(actor, no_restart=True)
        if group is not None:
            remove_placement_group(group)

    def _placed(self, group: PlacementGroup) -> bool:
        """Whether the group was placed within placement_timeout_s; waited for in short steps, so a pool
        shutting down is not held up by the wait."""
        try:
            self._gathered([group.ready()], self.placement_timeout_s)
            return True
        except (GetTimeoutError, StartAborted):
            return False

    def _host_of(self, group: PlacementGroup, host_of_node: dict[str, str]) -> str:
        """The address of the machine the group's bundle is on. Replicas share a machine's cores by host, not
        by Ray node: several raylets can run on one host (a test cluster, one node per GPU)."""
        node_id = ray.util.placement_group_table(group).get("bundles_to_node_id", {}).get(0, "")
        return host_of_node.get(node_id, node_id)

    def _env(self, local_index: int, local_count: int) -> dict[str, str]:
        """The actor's environment: its slot among the replicas on its machine, from which it binds its
        engine's threads to cores of that machine itself (`engines.cores`); never this machine's cores."""
        env = {
            "VLLM_LOGGING_LEVEL": "INFO" if self.verbose else "WARNING",
            ENGINE_CORE_SLOT_ENV: f"{local_index}/{local_count}",
        }
        if self.settings.device == "cpu":
            env |= cpu_kv_cache_env(self.kv_cache_gib)
        return env

    @staticmethod
    def _logs_now(actors: list[ray.actor.ActorHandle], infos: list[EngineInfo]) -> list[EngineLog]:
        """Where each engine's log files stand now, as its actor reads them on its own node (the driver may
        be another machine, where those paths are not the engine's files); the whole files of one that does
        not answer (dead already: the dispatcher finds that out)."""
        return [engine_log(info, found) for found, info in zip(places_now(actors), infos, strict=True)]

    def logs_now(self) -> dict[str, tuple[LogPlace, ...]]:
        """Where the log files of the replicas that answer stand now, by replica name: a warm pool's record
        keeps them, so the root error of a death after this run is looked for after them, not in what the
        runs before logged. Best effort: {} where Ray cannot be asked."""
        with self._lock:  # a replacement's thread may add or drop a replica meanwhile
            serving = list(zip(self.actors, [info.name for info in self.infos], strict=True))
        try:
            places = places_now([actor for actor, _ in serving])
        except Exception as exc:  # noqa: BLE001 - only where a later death's cause is looked for
            log.warning("could not ask the replicas where their logs stand: %s", exc)
            return {}
        return {name: found for found, (_, name) in zip(places, serving, strict=True) if found is not None}

    def log_of(self, name: str) -> EngineLog | None:
        """Where the replica `name`'s log stood when this pool last marked it; None where it is not served."""
        with self._lock:
            index = self._index_of(name)
            return None if index is None else self.log_marks[index]

    def marked(self, name: str, places: tuple[LogPlace, ...]) -> None:
        """The replica `name`'s log stands at `places` now (its actor said so): a death is looked for after."""
        with self._lock:
            index = self._index_of(name)
            if index is not None:
                self.log_marks[index] = engine_log(self.infos[index], places)

    def _index_of(self, name: str) -> int | None:
        """The served replica `name`'s place in `actors`, `infos` and `log_marks`; the caller holds `_lock`."""
        names = [info.name for info in self.infos]
        return names.index(name) if name in names else None

    def replicas(self) -> list[Replica]:
        """Dispatcher handles. Each window is twice the engine's max_num_seqs: a full batch running plus a
        full batch waiting inside the engine, so when sequences finish (all at once, with equal lengths) the
        scheduler refills from its own queue instead of idling for a round trip to the dispatcher. Near the
        end of the queue the dispatcher shrinks it to the running batch (`batch_size`), so no replica sits
        on waiting work while another has free slots."""
        return [
            self._replica(actor, info, logs)
            for actor, info, logs in zip(self.actors, self.infos, self.log_marks, strict=True)
        ]

    def _replica(self, actor: ray.actor.ActorHandle, info: EngineInfo, logs: EngineLog) -> Replica:
        return Replica(
            info.name,
            replica_call(actor, info.name, logs),
            ENGINE_QUEUE_FACTOR * info.max_num_seqs,
            batch_size=info.max_num_seqs,
        )

    def shutdown(self, graceful: bool = True) -> None:
        """Stop every replica, and those still starting. `graceful`: each engine first stops its own
        subprocesses (up to 30 s); an interrupted start skips that (an actor busy building its engine would
        answer only once built) and kills at once: a killed actor's engine core stops itself."""
        with self._lock:
            self.closing = True
            starting, self.starting = list(self.starting.values()), {}
        if graceful and self.actors:
            ray.wait([a.shutdown.remote() for a in self.actors], num_returns=len(self.actors), timeout=30)
        for actor in [*self.actors, *starting]:
            ray.kill(actor)
        for group in self.groups.values():
            remove_placement_group(group)
        self.actors, self.groups = [], {}


def held_by_pools() -> str:
    """What the cluster's warm pools hold, for a placement that waited in vain: ` Warm pools hold replicas
    here: p1 (1 x {1 CPU} for 1 engine worker(s)); ...` ("" where there are none)."""
    from cluster.engines.warm import pools_here

    try:
        records = pools_here()
    except Exception:  # noqa: BLE001 - a hint only: the placement error stands without it
        return ""
    if not records:
        return ""
    held = ", ".join(f"{r.name} ({len(r.engines)} x {r.plan.describe()})" for r in records)
    return (
        f" Warm pools hold replicas here: {held}; `rayeval pools` lists them, `rayeval down NAME` stops one."
    )


def places_now(
    actors: list[ray.actor.ActorHandle], timeout_s: float = 10.0
) -> list[tuple[LogPlace, ...] | None]:
    """Each actor's log files as they stand now (`EngineActor.alive`, read on its node); None for an actor
    that does not answer within `timeout_s`."""
    asked = [actor.alive.remote() for actor in actors]
    ready, _ = ray.wait(asked, num_returns=len(asked), timeout=timeout_s) if asked else ([], [])
    found: list[tuple[LogPlace, ...] | None] = []
    for ref in asked:
        try:
            found.append(tuple(ray.get(ref)) if ref in ready else None)
        except Exception:  # noqa: BLE001 - an actor dead by now has no log position to give
            found.append(None)
    return found


def engine_log(info: EngineInfo, places: tuple[LogPlace, ...] | None) -> EngineLog:
    """The engine's log files on its node from `places` (where they stood when marked), or from their start
    where there are none."""
    return EngineLog(places or tuple(LogPlace(path) for path in info.log_files), info.node_id, info.node_ip)


def recorded_log(record: PoolRecord, replica: str) -> EngineLog:
    """A warm pool replica's log files from where they stood when a run last found it well (the registry's
    `PoolRecord.log_marks`); from their start where the record has no marks for it."""
    return engine_log(record.engines[replica], record.log_marks.get(replica))


def replica_call(
    actor: ray.actor.ActorHandle, name: str, engine_logs: EngineLog | None = None
) -> ReplicaCall:
    """The dispatcher's call for an actor with `generate(group)` (an engine or an API judge). A dead actor
    is killed for good and reported as `ReplicaDead` with its root error, so its work goes back on the
    queue: an engine that died inside a live actor has read its own log (EngineDead); for an actor process
    that died, `engine_logs` (the engine's files on its node) are read by a task on that node. An actor Ray calls
    unavailable (its node out of reach for a moment; it may come back) is asked again, a few times with a
    pause, before it counts as dead: a warm pool's replica serves other runs too."""

    async def generate(group: PromptGroup) -> list[Completion]:
        try:
            return await asked_while_unavailable(lambda: actor.generate.remote(group), name)
        except EngineDead as exc:
            ray.kill(actor, no_restart=True)
            raise ReplicaDead(remote_message(exc)) from exc
        except RayActorError as exc:
            ray.kill(actor, no_restart=True)
            raise ReplicaDead(await dead_actor_cause(remote_message(exc), engine_logs)) from exc

    return generate


async def asked_while_unavailable(call: Callable[[], Awaitable[T]], name: str) -> T:
    """`await call()`, asked again after each pause of UNAVAILABLE_PAUSES_S while Ray says the actor is
    unavailable (its node out of reach for a moment; it may come back); the last try's error is raised."""
    for pause_s in UNAVAILABLE_PAUSES_S:
        try:
            return await call()
        except ActorUnavailableError as exc:
            log.warning("%s is unavailable (%s); asking again in %g s", name, remote_message(exc), pause_s)
            await asyncio.sleep(pause_s)
    return await call()


async def dead_actor_cause(message: str, log: EngineLog | None) -> str:
    """Why an actor process died: the root error its log holds, read on its node, and where that log is; the
    message where that node cannot be asked (never those paths read here, which may be another machine's)."""
    if log is None:
        return message
    return describe_failure(message, log.places, log.node_ip, root=await read_on_node(log) or message)


def remote_message(exc: BaseException) -> str:
    """The message of a remote error: the original exception's own text for rayeval's errors, else the last
    line of Ray's wrapping (which holds the remote traceback)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, EngineDead | EngineStartFailed):
        return str(cause)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def stage_adapter_on(actors: Sequence[Any], adapter: Adapter) -> None:
    """A run's LoRA adapter on its engines' nodes: its files, read where the run is coordinated (where it was
    checked), copied through Ray's object store to the nodes of the actors that lack them (hosts without
    shared storage, or other files at its path: `engines.adapters`). An actor that died is left out (the
    dispatcher finds it dead, and its replacement gets the copy). A ClusterError where a node lacks the
    adapter and this machine no longer holds the files the run planned."""
    answers = _answers_while_available(actors, lambda actor: actor.has_adapter.remote(adapter))
    lacking = [actor for actor, found in zip(actors, answers, strict=True) if found is False]
    if not lacking:
        return
    folder = Path(adapter.path)
    files = adapter_files(folder) if folder.is_dir() else {}
    if adapter_digest(files) != adapter.digest:
        raise ClusterError(
            f"LoRA adapter {adapter.name}: {len(lacking)} replica node(s) lack it at {adapter.path}, and "
            f"{adapter.path} on this node ({ray.util.get_node_ip_address()}) is missing or was changed since the "
            "run was planned, so no copy can be made. Keep the adapter's folder where the run is coordinated "
            "until it ends."
        )
    boxed = [ray.put(files)]  # in a list: an actor that finds the files meanwhile does not fetch them
    written = _answers_while_available(lacking, lambda actor: actor.stage_adapter.remote(adapter, boxed))
    nodes = [node for node in written if node]
    megabytes = sum(map(len, files.values())) / 1e6
    log.info("LoRA adapter %s (%.1f MB) copied to node(s) %s", adapter.name, megabytes, ", ".join(nodes))


def _staged_or_logged(actors: Sequence[Any], adapter: Adapter) -> None:
    """`stage_adapter_on`, best effort (a new replica's adapters, a merged checkpoint's): one that cannot be
    copied is logged, and the requests or the merge that need it fail on that node naming it."""
    try:
        stage_adapter_on(actors, adapter)
    except Exception as exc:  # noqa: BLE001 - the replica serves whatever does not need it
        log.warning("LoRA adapter %s not staged: %s", adapter.name, remote_message(exc))


def _answers_while_available(actors: Sequence[Any], call: Any) -> list[Any]:
    """Each actor's answer to `call(actor)`, asked of all at once, and again of those Ray calls unavailable
    (their node out of reach for a moment) after each pause; None for one that died or stayed out of reach."""
    found: list[Any] = [None] * len(actors)
    pending, last = list(range(len(actors))), None
    for pause_s in (*UNAVAILABLE_PAUSES_S, None):
        refs = {index: call(actors[index]) for index in pending}
        pending = []
        for index, ref in refs.items():
            try:
                found[index] = ray.get(ref)
            except ActorUnavailableError as exc:
                pending.append(index)
                last = exc
            except RayActorError as exc:
                log.warning("an engine died while a LoRA adapter was staged: %s", exc)
        if not pending:
            break
        if pause_s is None:
            log.warning(
                "%d engine(s) stayed unavailable while a LoRA adapter was staged: %s", len(pending), last
            )
        else:
            time.sleep(pause_s)
    return found
