"""Warm pools for people: `rayeval up` starts one on a running cluster, `rayeval pools` lists them, `rayeval
down` stops them, and a dry run says which pool would serve a run and why the others would not."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import ray

from cluster.config import PoolConfig
from cluster.engines import EngineSettings, ReplicaPool, engine_settings
from cluster.engines.warm import (
    REGISTRY_VERSION,
    PoolKey,
    PoolRecord,
    default_pool_name,
    pools_here,
    registry,
    registry_version,
    stop_strays,
    strays,
)
from cluster.errors import ClusterError
from cluster.judging import judge_engine_settings, local_judge_replicas
from cluster.models import resolve_model
from cluster.plan import RunPlan, build_model_plan, resolve_device
from cluster.session import joined_session
from cluster.sources.registry import SourceRequest, lease_holder, run_engine_settings, start_registered

DEFAULT_ADDRESS = "auto"  # a warm pool lives on a running cluster: this machine's `ray start` one by default


@dataclass(frozen=True)
class PoolRow:
    """What `rayeval pools` shows of one pool."""

    name: str
    model: str
    key: str
    replicas: int
    nodes: tuple[str, ...]
    idle_since: float | None  # epoch seconds; None while a run uses it
    requests_served: int
    in_use_by: tuple[str, ...]
    idle_timeout_s: float
    settings: str = ""  # the key's main settings, readable (`PoolKey.describe`)
    started: bool = False  # `up` started it now (else it was there already)

    @classmethod
    def of(cls, record: PoolRecord, started: bool = False) -> PoolRow:
        now = time.time()
        return cls(
            name=record.name,
            model=record.settings.model,
            key=record.key.digest,
            replicas=len(record.engines),
            nodes=tuple(record.nodes()),
            idle_since=record.idle_since(now),
            requests_served=record.requests_served,
            in_use_by=tuple(sorted({lease_holder(lease) for lease in record.live_leases(now)})),
            idle_timeout_s=record.idle_timeout_s,
            settings=record.key.describe(),
            started=started,
        )


def up(config: PoolConfig, verbose: bool = False) -> PoolRow:
    """Start a warm pool of `config.cluster.replicas` replicas on the cluster and return; a pool of the
    same settings that is already there is returned as it is, its idle timeout raised to --idle-timeout
    where that is longer (the CLI says where it has fewer replicas than asked)."""
    with joined_session(config.cluster.address or DEFAULT_ADDRESS, verbose):
        run_config = config.run_config()
        device = resolve_device(run_config, ray.cluster_resources().get("GPU", 0) > 0)
        plan = build_model_plan(run_config, device)
        settings = pool_engine_settings(config, plan.model.path, device)
        key, base = PoolKey.of(settings), config.name or default_pool_name(settings)
        found = registry()
        for record in pools_here():
            if record.serves(key):
                kept = ray.get(found.keep_warm_at_least.remote(record.name, config.idle_timeout_s))
                return PoolRow.of(kept or record)
            if record.name == base:
                raise ClusterError(
                    f"A warm pool named {record.name} runs with other settings "
                    f"({'; '.join(record.differences(key))}). Give another --name, or `rayeval down {record.name}` "
                    "first."
                )
        name = _claimed_name(found, base, config.name is not None)
        pool = ReplicaPool(settings, plan.replica, config.cluster.replicas, config.model.cpu_kv_cache_gib, verbose,
                           warm=name)  # fmt: skip
        request = SourceRequest(
            run_config, settings, plan.replica, config.cluster.replicas, run_id=f"up-{name}"
        )
        try:
            return PoolRow.of(start_registered(pool, request, found, config.idle_timeout_s), started=True)
        except BaseException:
            found.release_name.remote(name)
            raise


def _claimed_name(found: Any, base: str, given: bool) -> str:
    """The pool's name, held in the registry while its engines start (another `rayeval up`, or a run keeping
    its engines warm, starting at once takes the next free one); a --name another starting pool holds is
    refused rather than changed."""
    name = ray.get(found.claim_name.remote(base))
    if given and name != base:
        found.release_name.remote(name)
        raise ClusterError(
            f"A warm pool named {base} is starting (another `rayeval up`, or a run keeping its engines warm): "
            "`rayeval pools` lists it once it is up; give another --name to start one beside it (where no "
            "start is running, one was killed outright: `rayeval down --all` frees its name)."
        )
    return name


def pool_engine_settings(config: PoolConfig, model_path: str, device: str) -> EngineSettings:
    """The pool's engines: a run's settings for its model, with LoRA layers where --lora-slots asks for them
    (a run with an adapter of the same --max-lora-rank then matches the pool's key)."""
    base = engine_settings(config.model, model_path, device)
    lora_rank = config.model.max_lora_rank if config.lora_slots else 0
    return replace(base, max_lora_rank=lora_rank, max_loras=max(config.lora_slots, 1))


@dataclass(frozen=True)
class PoolListing:
    """The cluster's warm pools, and the engine actors named as a pool's that belong to none of them (a pool
    still starting, or what a start killed outright left: `rayeval down --all` stops those)."""

    rows: list[PoolRow]
    strays: list[str]


def list_pools(address: str | None, verbose: bool = False) -> PoolListing:
    with joined_session(address or DEFAULT_ADDRESS, verbose):
        records = pools_here()
        actors, _ = strays({record.name for record in records})
        return PoolListing([PoolRow.of(record) for record in records], actors)


@dataclass(frozen=True)
class Stopped:
    """What `down` stopped: the pools by name, and with --all the engine actors and placement groups named
    as a pool's that no pool held (`engines.warm.strays`)."""

    pools: list[str]
    stray_actors: list[str]
    stray_groups: int


def down(address: str | None, names: list[str], every: bool, verbose: bool = False) -> Stopped:
    """Stop the named pools (or every pool, and whatever is named as a pool's member outside them); an
    unknown name is an error."""
    with joined_session(address or DEFAULT_ADDRESS, verbose):
        # --all also stops a registry another version started (refused elsewhere), so it reads any
        found = registry(create=False, same_version=not every)
        known = set() if found is None else {record.name for record in ray.get(found.all.remote())}
        wanted = sorted(known) if every else names
        unknown = [name for name in wanted if name not in known]
        if unknown:
            raise ClusterError(
                f"No warm pool named {', '.join(unknown)} on this cluster (its pools: {', '.join(sorted(known)) or 'none'})."
            )
        for name in wanted:
            ray.get(found.remove.remote(name))
        if every and found is not None:
            if registry_version(found) != REGISTRY_VERSION:
                ray.kill(found, no_restart=True)  # another version's: the next command starts this version's
            else:
                ray.get(found.release_names.remote())  # a start killed outright holds its name until now
        # the pools just stopped are left out: an actor Ray is still killing would read as a stray
        actors, groups = strays(set(wanted)) if every else ([], [])
        stop_strays(actors, groups)
        return Stopped(wanted, actors, len(groups))


def explain(plan: RunPlan) -> str:
    """For a dry run on a cluster, in a session on it where warm pools are on: which warm pool would serve the
    run's engines, and a local judge's (and the replicas the run would start beside it), why each other one
    would not (the settings that differ), and what becomes of the engines the run starts."""
    config = plan.config
    kept = config.cluster.kept_warm_s
    then = f"kept warm {kept:g} s after it as a pool of their own" if kept else "stopped when it ends"
    if not config.cluster.warm_pools:
        return f"warm pools: not used (--no-warm-pools); the run starts its own engines ({then})"
    records = pools_here()
    lines = _pool_lines(records, PoolKey.of(run_engine_settings(plan)), config.cluster.replicas, then, "")
    judges = local_judge_replicas(plan)
    if judges:
        judge_path = resolve_model(config.judge.target).path
        judge_key = PoolKey.of(judge_engine_settings(config, judge_path, plan.device))
        lines += _pool_lines(records, judge_key, judges, then, "the judge's engines: ")
    return "\n".join(lines)


def _pool_lines(records: list[PoolRecord], key: PoolKey, asked: int, then: str, whose: str) -> list[str]:
    """Which pool would serve `asked` replicas of `key`, and why each other one would not."""
    differing = {r.name: r.differences(key) for r in records}
    serving = [
        f"{whose}warm pool {r.name} would serve this run ({replicas(len(r.engines))})"
        + (f"; the run starts {asked - len(r.engines)} more beside it" if asked > len(r.engines) else "")
        for r in records
        if not differing[r.name]
    ]
    others = [
        f"{whose}warm pool {name} would not: {'; '.join(found)}" for name, found in differing.items() if found
    ]
    if not serving:
        serving = [f"{whose}no warm pool has these engine settings: the run starts its own ({then})"]
    return serving + others


def replicas(count: int) -> str:
    return f"{count} replica" + ("" if count == 1 else "s")
