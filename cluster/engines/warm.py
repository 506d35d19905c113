"""Warm pools: engine replicas that outlive the run that started them, so the next run on the cluster starts
generating at once instead of starting engines.

A pool is a set of detached, named `EngineActor`s in the `rayeval` namespace, each in a detached, named
placement group, plus its record in the one `PoolRegistry` actor of the cluster (detached, no CPU). A pool is
keyed by its `PoolKey`: the model and every engine setting that changes outputs; a run uses a pool only when
the keys are equal (a dtype asked as `auto` equals the one it becomes on the pool's nodes), and
`PoolRecord.differences` says why another pool does not serve it. A run holds a lease
on the pool while it uses it (renewed every few seconds, so the lease of a run that was killed lapses); each
renewal says whether the run has sent work to the pool since the renewal before and learns how many leases
have, and each run's dispatcher takes that part of the engines' in-flight windows, so runs that share a pool
share its queue equally and it does not grow with their number. A pool nobody holds for its idle timeout is
stopped by the registry: its actors killed, its placement groups removed.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import pickle
import re
import socket
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import ray

from cluster.engines.actor import EngineInfo
from cluster.engines.logs import LogPlace
from cluster.engines.placement import ReplicaPlan
from cluster.engines.settings import EngineSettings

log = logging.getLogger(__name__)

NAMESPACE = "rayeval"
POOL_PREFIX = "rayeval-pool-"  # every pool's engine actors and placement groups are named so (`actor_name`)
# a pool's member by name: the pool's, then its replica's (`replica-0`, `judge-1`, a replacement `replica-0.3fa2c1`)
POOL_MEMBER = re.compile(rf"{POOL_PREFIX}(?P<pool>.+)-(?P<replica>[a-z]+-\d+(?:\.[0-9a-f]+)?)")
REGISTRY_NAME = "rayeval-pools"
LEASE_S = 30.0  # a lease not renewed for this long has lapsed (its run is gone)
RENEW_S = 5.0
REPLACEMENTS_KEPT = 256  # a pool's record of which replica replaced which (PoolRecord.record_replacement)
# Engine settings that do not change what an engine answers: a pool whose settings differ only in these serves.
# (embedded_default: the model path and its files' fingerprint are in the key already)
NOT_IN_KEY = frozenset(
    {"log_stats", "pin_engine_core", "executor", "max_loras", "embedded_default", "merged_from"}
)


MODEL_FILES = "model_files"  # the key's entry for what the model folder holds (`model_files_fingerprint`)


def model_files_fingerprint(model: str) -> str:
    """`HOST:HASH`: the names, sizes and modification times of the files in the model folder, hashed, and
    the machine that read them. A folder written again in place (a checkpoint retrained to the same path)
    gets another hash; copies of it on other machines (each node's own download) have other times, so only
    fingerprints read on one machine are compared (`same_model_files`). "" where this process does not see
    the folder (a hub id, a path on the cluster's nodes only): there the key cannot tell."""
    folder = Path(model)
    if not folder.is_dir():
        return ""
    entries = []
    for path in sorted(folder.iterdir()):
        with contextlib.suppress(OSError):
            found = path.stat()
            if stat.S_ISREG(found.st_mode):
                entries.append((path.name, found.st_size, found.st_mtime_ns))
    return f"{socket.gethostname()}:{hashlib.sha256(json.dumps(entries).encode()).hexdigest()[:16]}"


def same_model_files(ours: Any, theirs: Any) -> bool:
    """Whether two fingerprints could be of other files: only those read on one machine are compared."""
    if not ours or not theirs:
        return True
    host, _, _ = str(ours).rpartition(":")
    other_host, _, _ = str(theirs).rpartition(":")
    return host != other_host or ours == theirs


@dataclass(frozen=True)
class PoolKey:
    """What decides a pool's outputs: the engine settings that change them (the model, its revision, dtype,
    context length, batch limits, parallelism, eager or compiled, chunked prefill, LoRA), the device, and
    what the model folder holds (`model_files_fingerprint`, as the process that made the key saw it)."""

    settings: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, settings: EngineSettings) -> PoolKey:
        values = asdict(settings)
        named = tuple((f.name, values[f.name]) for f in fields(settings) if f.name not in NOT_IN_KEY)
        return cls((*named, (MODEL_FILES, model_files_fingerprint(settings.model))))

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.settings, default=str).encode()).hexdigest()[:12]

    def differences(self, wanted: PoolKey, auto_dtype: str = "") -> list[str]:
        """Each setting where this pool's key differs from the one `wanted`: `dtype 'float32' (wanted
        'bfloat16')`. `auto_dtype`: what `--dtype auto` becomes on the pool's nodes; where it is known, a
        dtype asked as `auto` on one side and by name on the other differs only if they name other dtypes
        there (one engine either way). The model folder's files differ only where both sides read them on
        one machine."""
        theirs = dict(wanted.settings)

        def resolved(dtype: Any) -> Any:
            return auto_dtype if dtype == "auto" and auto_dtype else dtype

        found = []
        for name, value in self.settings:
            other = theirs.get(name)
            if name == MODEL_FILES:
                if not same_model_files(value, other):
                    found.append("the model folder's files changed since the pool started (sizes or times)")
                continue
            is_dtype = name == "dtype"
            if (resolved(value) if is_dtype else value) == (resolved(other) if is_dtype else other):
                continue
            named_auto = is_dtype and auto_dtype and "auto" in (value, other)
            why = f"; auto is {auto_dtype!r} on its nodes" if named_auto else ""
            found.append(f"{name} {value!r} (wanted {other!r}{why})")
        return found

    def describe(self) -> str:
        """The settings a user tells pools apart by: `dtype=float32, max_model_len=1024, ...`."""
        shown = dict(self.settings)
        named = ("dtype", "max_model_len", "max_num_seqs", "enforce_eager", "max_lora_rank", "device")
        return ", ".join(f"{name}={shown[name]}" for name in named if name in shown)


def default_pool_name(settings: EngineSettings) -> str:
    """The model folder's name and the key's digest: `SmolLM2-135M-Instruct-3f2a9c1b07de`."""
    model = re.sub(r"[^A-Za-z0-9._-]+", "-", settings.model.rstrip("/").rsplit("/", 1)[-1]).strip("-")
    return f"{model[:40] or 'model'}-{PoolKey.of(settings).digest}"


def free_name(base: str, taken: set[str]) -> str:
    """`base`, or `base-2`, `base-3`, ...: the first that is not `taken`."""
    return next(n for n in (base, *(f"{base}-{i}" for i in range(2, len(taken) + 3))) if n not in taken)


def actor_name(pool: str, replica: str) -> str:
    return f"{POOL_PREFIX}{pool}-{replica}"


@dataclass
class PoolRecord:
    """A pool as the registry holds it: enough for any run to attach to it, replace a replica, or stop it."""

    name: str
    key: PoolKey
    settings: EngineSettings
    plan: ReplicaPlan
    kv_cache_gib: float
    idle_timeout_s: float
    engines: dict[str, EngineInfo] = field(default_factory=dict)  # by replica name
    groups: dict[str, str] = field(default_factory=dict)  # replica name -> its placement group's id (hex)
    slots: dict[str, tuple[int, int]] = field(default_factory=dict)  # replica name -> its slot on its host
    created_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    requests_served: int = 0
    leases: dict[str, float] = field(default_factory=dict)  # lease id -> when it last renewed
    quiet: set[str] = field(default_factory=set)  # leases whose last renewal had no request in flight
    released: dict[str, float] = field(default_factory=dict)  # lease id -> when it was released (LEASE_S)
    # a dead replica's name -> the replica now in its place (the last REPLACEMENTS_KEPT replacements)
    replaced_by: dict[str, str] = field(default_factory=dict)
    # replica name -> where its log files stood when a run last found it well (its start, a run's end): the
    # root error of a death found later is looked for after these, not in what earlier runs logged
    log_marks: dict[str, tuple[LogPlace, ...]] = field(default_factory=dict)

    def record_replacement(self, dead: str, replacement: str) -> None:
        """`replacement` is in `dead`'s place, and in the place of every replica `dead` had replaced: a run
        holding any of their names finds the live one in one lookup. Only the last REPLACEMENTS_KEPT are kept,
        so a pool that outlives many deaths does not grow: a run holds the names it acquired for as long as it
        runs, and one would need that many of its pool's replicas to die meanwhile to miss its own."""
        for earlier, current in self.replaced_by.items():
            if current == dead:
                self.replaced_by[earlier] = replacement
        self.replaced_by[dead] = replacement
        while len(self.replaced_by) > REPLACEMENTS_KEPT:
            del self.replaced_by[next(iter(self.replaced_by))]

    def in_place_of(self, dead: str) -> EngineInfo | None:
        """The live replica in `dead`'s place, however many times it was replaced (a record saved before
        `record_replacement` pointed every name at the last replacement holds chains); None if none is (or
        `dead` was never replaced)."""
        current = dead
        for _ in range(len(self.replaced_by)):
            current = self.replaced_by.get(current, "")
            if current in self.engines or not current:
                break
        return None if current == dead else self.engines.get(current)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A record pickled by an earlier version lacks the fields added since: they get their defaults."""
        for spec in fields(self):
            if spec.name not in state and spec.default_factory is not MISSING:
                state[spec.name] = spec.default_factory()
            elif spec.name not in state and spec.default is not MISSING:
                state[spec.name] = spec.default
        self.__dict__.update(state)

    def live_leases(self, now: float) -> list[str]:
        return [run for run, renewed in self.leases.items() if now - renewed < LEASE_S]

    def hold(self, lease: str, now: float, sending: bool) -> int:
        """Renew `lease`, noting whether it sent work to the pool since its renewal before. Returns how many live
        leases send work, this one counted as if it did (at least 1). A lease released already stays released (a
        renewal that arrives after its release). A pool held is in use: its idle time starts at the last
        renewal, so a killed run's pool is idle from when its lease stopped being renewed."""
        self._forget_lapsed(now)
        if lease not in self.released:
            self.leases[lease] = now
            self.last_used = max(self.last_used, now)
            (self.quiet.discard if sending else self.quiet.add)(lease)
        return 1 + sum(1 for other in self.live_leases(now) if other != lease and other not in self.quiet)

    def let_go(self, lease: str, now: float) -> None:
        self.leases.pop(lease, None)
        self.quiet.discard(lease)
        self.released[lease] = now

    def _forget_lapsed(self, now: float) -> None:
        """Leases not renewed for LEASE_S (their runs are gone) and releases that old (no renewal comes so
        late): what a long-lived pool would otherwise gather."""
        self.leases = {lease: at for lease, at in self.leases.items() if now - at < LEASE_S}
        self.quiet &= set(self.leases)
        self.released = {lease: at for lease, at in self.released.items() if now - at < LEASE_S}

    def idle_since(self, now: float) -> float | None:
        """When it was last used, or None while a run holds it."""
        return None if self.live_leases(now) else self.last_used

    def nodes(self) -> list[str]:
        return sorted({info.node_ip or info.node_id for info in self.engines.values()})

    def differences(self, wanted: PoolKey) -> list[str]:
        """Why this pool would not serve a run whose engines' key is `wanted` (empty: it serves)."""
        autos = {info.auto_dtype for info in self.engines.values()}
        return self.key.differences(wanted, autos.pop() if len(autos) == 1 else "")

    def serves(self, wanted: PoolKey) -> bool:
        return not self.differences(wanted)


# The registry's records, kept in the cluster's own key-value store (the GCS) as well: Ray restarts the registry
# where its process or its node is lost, and a registry that came back empty would leave every pool's detached
# engines running unlisted, never stopped.
RECORDS_KEY = b"rayeval-pools"
# Raised when the registry's methods or its records change, or the methods of its pools' engine actors (an
# older pool's actors would lack them): a registry another version started is not used.
REGISTRY_VERSION = 9


def saved_records() -> dict[str, PoolRecord]:
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(RECORDS_KEY, namespace=NAMESPACE.encode())
    try:
        return pickle.loads(raw) if raw else {}  # noqa: S301 - written by a registry, in this cluster's GCS
    except Exception as exc:  # noqa: BLE001 - records another version wrote: its pools are not this one's
        log.warning("the saved warm-pool records could not be read (%s): starting without them", exc)
        return {}


# calls run in threads of their own (state under `_lock`): stopping a pool (`remove`, up to 30 s while its
# engines stop) does not hold up other runs' lease renewals, which would otherwise lapse behind it. A call
# made while Ray restarts it waits for the restart rather than fail a run's replacement or lease; one the
# lost registry had run and not answered runs again, so each method may run twice (a replacement entered
# twice is entered once, a lease released twice counts its requests once).
@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=16)
class PoolRegistry:
    """The cluster's warm pools. Stops a pool that nobody has used for its idle timeout."""

    def __init__(self) -> None:
        # a registry restarted by Ray reads its records back; their leases were not kept (runs renew theirs
        # every few seconds), so each pool starts a new idle period rather than look unused
        now = time.time()
        self.pools: dict[str, PoolRecord] = saved_records()
        for record in self.pools.values():
            record.last_used = max(record.last_used, now)
        self.claimed: set[str] = set()  # names given to pools that are starting
        self._lock = threading.Lock()
        threading.Thread(target=self._reap_forever, name="rayeval-pool-reaper", daemon=True).start()

    def version(self) -> int:
        return REGISTRY_VERSION

    def put(self, record: PoolRecord) -> None:
        with self._lock:
            self.pools[record.name] = record
            self.claimed.discard(record.name)
            self._saved_or_logged()

    def claim_name(self, base: str) -> str:
        """A name for a pool that is starting (`free_name`), held for it until `put` enters the pool."""
        with self._lock:
            name = free_name(base, set(self.pools) | self.claimed)
            self.claimed.add(name)
            return name

    def release_name(self, name: str) -> None:
        """A claimed name whose pool did not start: free for the next."""
        with self._lock:
            self.claimed.discard(name)

    def release_names(self) -> list[str]:
        """Every claimed name freed (`rayeval down --all`: a start killed outright never released its own)."""
        with self._lock:
            freed, self.claimed = sorted(self.claimed), set()
            return freed

    def get(self, name: str) -> PoolRecord | None:
        with self._lock:  # a copy: Ray serializes the reply after the lock is let go
            return copy.deepcopy(self.pools.get(name))

    def all(self) -> list[PoolRecord]:
        with self._lock:
            return copy.deepcopy(list(self.pools.values()))

    def acquire(
        self, wanted: PoolKey, run_id: str, name: str | None = None, keep_warm_s: float | None = None
    ) -> PoolRecord | None:
        """A lease on the pool `name`, or on any pool that serves engines of the `wanted` key (the least busy
        first); `keep_warm_s`: the --keep-warm the run was given (not its default), which the pool's idle
        timeout is raised to (never lowered: other runs' and `rayeval up`'s stand)."""
        now = time.time()
        with self._lock:
            found = [p for p in self.pools.values() if (name is None or p.name == name) and p.serves(wanted)]
            if not found:
                return None
            pool = min(found, key=lambda p: len(p.live_leases(now)))
            pool.released.pop(run_id, None)  # a lease id taken again is held again
            pool.hold(run_id, now, sending=True)
            self._keep_warm_at_least(pool, keep_warm_s or 0.0)
            return copy.deepcopy(pool)

    def keep_warm_at_least(self, name: str, idle_timeout_s: float) -> PoolRecord | None:
        """The pool `name` with its idle timeout raised to `idle_timeout_s` where that is longer (`rayeval up`
        of a pool already there); None where there is no such pool."""
        with self._lock:
            pool = self.pools.get(name)
            if pool is None:
                return None
            self._keep_warm_at_least(pool, idle_timeout_s)
            return copy.deepcopy(pool)

    def _keep_warm_at_least(self, pool: PoolRecord, idle_timeout_s: float) -> None:
        """Raise the pool's idle timeout to `idle_timeout_s` where that is longer, and save it (the caller
        holds `_lock`)."""
        if idle_timeout_s > pool.idle_timeout_s:
            pool.idle_timeout_s = float(idle_timeout_s)
            self._saved_or_logged()

    def renew(self, name: str, run_id: str, sending: bool) -> int:
        """Renew `run_id`'s lease (`PoolRecord.hold`): how many leases send work to the pool, 0 where there is
        no pool."""
        with self._lock:
            pool = self.pools.get(name)
            return 0 if pool is None else pool.hold(run_id, time.time(), sending)

    def release(
        self, name: str, run_id: str, served: int, log_marks: dict[str, tuple[LogPlace, ...]] | None = None
    ) -> None:
        """The run `run_id` is done with the pool, having sent it `served` requests; `log_marks`: where the
        logs of the replicas that answered it at its end stood then."""
        with self._lock:
            pool = self.pools.get(name)
            if pool is not None and run_id not in pool.released:
                pool.let_go(run_id, time.time())
                pool.requests_served += served
                pool.last_used = time.time()
                pool.log_marks.update((k, v) for k, v in (log_marks or {}).items() if k in pool.engines)
                self._saved_or_logged()

    def replaced(
        self, name: str, dead: str, info: EngineInfo, group: str, log_marks: tuple[LogPlace, ...] = ()
    ) -> EngineInfo | None:
        """Enter `info` in the pool in place of `dead` (`log_marks`: where its logs stood once started), and
        return it. Where another run replaced `dead` first, the pool keeps that one and it is returned
        instead (the caller stops its own and uses it); None where the pool is not here any more (stopped
        meanwhile) or `dead` is not its replica."""
        with self._lock:
            pool = self.pools.get(name)
            if pool is None:
                return None
            if dead not in pool.engines:  # replaced already: the replica now in its place
                return pool.in_place_of(dead)
            del pool.engines[dead]
            pool.groups.pop(dead, None)
            pool.log_marks.pop(dead, None)
            pool.engines[info.name] = info
            pool.log_marks[info.name] = log_marks
            pool.groups[info.name] = group
            pool.slots[info.name] = pool.slots.pop(dead, (0, 1))
            pool.record_replacement(dead, info.name)
            self._saved_or_logged()
            return info

    def remove(self, name: str) -> PoolRecord | None:
        """Take the pool out of the registry and stop it."""
        with self._lock:
            pool = self.pools.pop(name, None)
        if pool is not None:
            self._stopped_or_kept(pool)
        with self._lock:
            self._saved_or_logged()
        return pool

    def _saved_or_logged(self) -> None:
        """Write the records to the GCS; a failure (the GCS restarting) is logged: the records in memory
        still hold, and the next change saves them again. The caller holds `_lock`."""
        from ray.experimental.internal_kv import _internal_kv_put

        try:
            _internal_kv_put(
                RECORDS_KEY, pickle.dumps(self.pools), overwrite=True, namespace=NAMESPACE.encode()
            )
        except Exception as exc:  # noqa: BLE001 - the registry goes on from its memory
            log.warning("could not save the warm-pool records to the GCS: %s", exc)

    def _stopped_or_kept(self, pool: PoolRecord) -> None:
        """Stop a pool taken out of the registry; where that fails it goes back in (to be stopped again, by
        the reaper or `rayeval down`) rather than be lost with its engines up, and the error is raised."""
        try:
            stop_pool_actors(pool)
        except Exception:
            with self._lock:
                self.pools.setdefault(pool.name, pool)
            raise

    def _reap_forever(self) -> None:
        while True:
            time.sleep(2.0)
            try:
                self._reap()
            except Exception:  # a reaper that died would leave every pool up for good
                log.exception("reaping idle warm pools failed; trying again")

    def _reap(self) -> None:
        with self._lock:  # taken out under the lock: a run acquiring it meanwhile sees it gone, not stopping
            idle = [p for p in self.pools.values() if self._idle_out(p, time.time())]
            for pool in idle:
                del self.pools[pool.name]
        for pool in idle:
            log.warning("warm pool %s unused for %g s: stopping it", pool.name, pool.idle_timeout_s)
            try:
                self._stopped_or_kept(pool)
            except Exception:  # noqa: BLE001 - kept: stopped on a later round
                log.exception("stopping warm pool %s failed; trying again later", pool.name)
        if idle:
            with self._lock:
                self._saved_or_logged()

    @staticmethod
    def _idle_out(pool: PoolRecord, now: float) -> bool:
        return not pool.live_leases(now) and now - pool.last_used > pool.idle_timeout_s


def stop_pool_actors(pool: PoolRecord) -> None:
    """Kill the pool's engine actors (each stops its engine first, within 30 s) and remove their groups."""
    actors = []
    for replica in pool.engines:
        try:
            actors.append(ray.get_actor(actor_name(pool.name, replica), namespace=NAMESPACE))
        except ValueError:
            continue
    if actors:
        ray.wait([a.shutdown.remote() for a in actors], num_returns=len(actors), timeout=30)
    for actor in actors:
        ray.kill(actor, no_restart=True)
    remove_groups(list(pool.groups.values()))


def remove_groups(hex_ids: list[str]) -> None:
    """Remove placement groups by id; one already removed, or on a node gone, is passed by."""
    from ray.util.placement_group import remove_placement_group

    for hex_id in hex_ids:
        try:
            remove_placement_group(placement_group_of(hex_id))
        except Exception:  # noqa: BLE001 - already removed, or its node gone
            continue


def strays(known: set[str]) -> tuple[list[str], list[str]]:
    """The engine actors and placement groups named as a pool's that belong to none of the `known` pools:
    a pool still starting, or what a start killed outright (SIGKILL, the OOM killer) left running. Read
    from Ray's named actors and placement-group table, which any driver of the cluster sees."""
    from ray.util.placement_group import placement_group_table

    def stray(name: str) -> bool:
        named = POOL_MEMBER.fullmatch(name)
        return named is not None and named["pool"] not in known

    actors = sorted(
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry.get("namespace") == NAMESPACE and stray(entry.get("name") or "")
    )
    groups = sorted(
        hex_id
        for hex_id, info in placement_group_table().items()
        if info.get("state") != "REMOVED" and stray(info.get("name") or "")
    )
    return actors, groups


def stop_strays(actors: list[str], groups: list[str]) -> None:
    """Kill the stray engine actors and remove the stray placement groups (`strays`)."""
    for name in actors:
        try:
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
        except ValueError:  # gone meanwhile
            continue
    remove_groups(groups)


def placement_group_of(hex_id: str) -> Any:
    """A placement group by its id (a name would be looked up in the caller's Ray namespace only)."""
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup

    return PlacementGroup(PlacementGroupID(bytes.fromhex(hex_id)))


def registry(create: bool = True, same_version: bool = True) -> Any:
    """The cluster's pool registry actor (started, detached, on first need); None when there is none and
    `create` is off. One that another version of rayeval started (the cluster outlived an upgrade) is
    refused with the way out, unless `same_version` is off (`rayeval down --all` stops its pools and it)."""
    try:
        found = ray.get_actor(REGISTRY_NAME, namespace=NAMESPACE)
    except ValueError:
        if not create:
            return None
        found = PoolRegistry.options(
            name=REGISTRY_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, **_on_the_head()
        ).remote()
    if same_version and registry_version(found) != REGISTRY_VERSION:
        from cluster.errors import ClusterError

        raise ClusterError(
            "This cluster's warm-pool registry was started by another version of rayeval (the cluster outlived "
            "an upgrade). `rayeval down --all` (with this --address) stops its pools and it; the next run or "
            "`rayeval up` starts them again."
        )
    return found


def _on_the_head() -> dict[str, Any]:
    """The registry's placement: the head node, by a sliver of Ray's head resource (as Ray Serve places its
    controller; soft node affinity to the head was seen placing it on a worker). Anywhere else the loss of that
    worker node restarts it while runs on the others call it. A cluster whose head reports no head resource
    places it anywhere."""
    from cluster.head_node import HEAD_RESOURCE, head_node_id

    return {} if head_node_id(ray.nodes()) is None else {"resources": {HEAD_RESOURCE: 0.001}}


def registry_version(found: Any) -> int:
    """The registry's REGISTRY_VERSION; 1 for one from before registries had a version."""
    return ray.get(found.version.remote()) if hasattr(found, "version") else 1


def pools_here(same_version: bool = True) -> list[PoolRecord]:
    """Every warm pool of the connected cluster (`registry` says what `same_version` allows)."""
    found = registry(create=False, same_version=same_version)
    return [] if found is None else list(ray.get(found.all.remote()))


class Lease:
    """A run's hold on a pool: renewed in the background until `release`, at once and then every RENEW_S.
    Each renewal says whether the run has called the pool's replicas since the renewal before or has calls in
    flight (`count_call`, around each call of the run's replica handles) and learns how many leases sending
    work share it (`runs_sharing`: 1 until the first answer comes). A run that is not sending (judging after
    its generation, say) is not counted."""

    def __init__(self, registry_actor: Any, pool: str, run_id: str, sends: bool = True) -> None:
        """`sends`: whether the holder sends work to the pool (a run); a sweep that holds the pool for its
        steps' runs sends none itself, and is never counted among those sharing it."""
        self.registry = registry_actor
        self.pool = pool
        self.run_id = run_id
        self.sends = sends
        self.calls_in_flight = 0  # changed on the run's event loop only (`count_call`); this thread reads it
        self.calls_done = 0
        self._runs_sharing = 1
        self.most_runs_sharing = 1  # the most runs seen sending to the pool at once while this lease was held
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="rayeval-lease", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def count_call(self) -> Iterator[None]:
        """Around each of the run's calls to the pool's replicas: what tells the registry it is sending."""
        self.calls_in_flight += 1
        try:
            yield
        finally:
            self.calls_in_flight -= 1
            self.calls_done += 1

    def runs_sharing(self) -> int:
        """How many runs were sending to the pool at the last renewal, this one included (`Replica.shared_by`)."""
        return self._runs_sharing

    def _renew(self) -> None:
        first, done_before = True, 0
        while not self._stop.is_set() and ray.is_initialized():
            # sending: a call in flight now or ended since the last renewal (a judge asks in bursts); at its
            # first renewal a lease that has sent nothing yet is about to (a run's generation), and a judge
            # waiting for outputs to judge is quiet from the next one
            done_now = self.calls_done
            sending = self.sends and (
                self.calls_in_flight > 0 or done_now != done_before or first and done_now == 0
            )
            first, done_before = False, done_now
            try:
                ref = self.registry.renew.remote(self.pool, self.run_id, sending)
                held = ray.get(ref, timeout=RENEW_S)
            except Exception:  # noqa: BLE001 - a busy or restarting registry (Ray restarts it): the count stands
                held = 0
            if held and not self._stop.is_set():
                self._runs_sharing = held
                self.most_runs_sharing = max(self.most_runs_sharing, held)
            self._stop.wait(RENEW_S)

    def release(self, served: int, log_marks: dict[str, tuple[LogPlace, ...]] | None = None) -> None:
        """Let the pool go (`PoolRegistry.release`); `log_marks`: where its replicas' logs stand now."""
        self._stop.set()
        self._thread.join(timeout=RENEW_S + 1)  # a renewal in flight lands before the release, not after it
        try:
            ray.get(self.registry.release.remote(self.pool, self.run_id, served, log_marks), timeout=30)
        except Exception as exc:  # noqa: BLE001 - the lease lapses by itself; the run's results are written
            log.warning("could not release pool %s (%s); its lease lapses in %g s", self.pool, exc, LEASE_S)
