"""Engine replicas shared by the runs of a sweep: started once, kept warm from one run to the next.

A LoRA sweep's runs (one per adapter) all ask for the base model and run at once: their requests, each with
its own adapter, meet in the same engines (vLLM multi-LoRA). A full-checkpoint sweep's runs come one after
another, and each asks for its own checkpoint: every replica's engine moves to it in its own actor process
(an in-place weight reload where the checkpoints allow, `cluster.models.swap_kind`), never a new actor.
"""

from __future__ import annotations

import logging
import secrets
import threading
from typing import TYPE_CHECKING

from cluster.engines import EngineInfo, ReplicaPool, engine_settings
from cluster.plan import RunPlan
from cluster.sources import SourceRequest, start_logged, with_lora_slots
from sharding.dispatcher import Replica
from sharding.requests import Adapter

if TYPE_CHECKING:
    from cluster.engines.warm import Lease

log = logging.getLogger(__name__)


class SharedReplicas:
    def __init__(
        self, plan: RunPlan, *, verbose: bool = False, max_loras: int = 1, lora: bool | None = None
    ) -> None:
        """`plan`: a run's of the sweep; its model options build the engines (LoRA on, with `max_loras`
        slots, where its config has an adapter or `lora` says so), on the model the first `replicas_for`
        asks for."""
        self.plan = plan
        self.verbose = verbose
        self.max_loras = max_loras
        self.lora = plan.adapter is not None if lora is None else lora
        self.pool: ReplicaPool | None = None
        self.swaps = 0  # checkpoint moves made (each over every replica)
        self._lock = threading.Lock()  # runs that go at once ask from their own threads

    def replicas_for(self, model_path: str) -> tuple[list[Replica], list[EngineInfo]]:
        """The replicas, serving `model_path` (started on first call, moved to it when they serve another)."""
        with self._lock:
            if self.pool is None:
                request = self._request(model_path)
                pool = ReplicaPool(request.settings, request.plan, request.count,
                                   request.config.model.cpu_kv_cache_gib, self.verbose)  # fmt: skip
                try:
                    infos = start_logged(pool, request)
                except BaseException:  # the next run starts them again (and reports its own root error)
                    pool.shutdown()
                    raise
                self.pool = pool
            elif self.pool.settings.model != model_path:
                infos = self._move(model_path)
            else:
                infos = list(self.pool.infos)
            return self.pool.replicas(), infos

    def hold_warm_pool(self, model_path: str) -> Lease | None:
        """A lease on a warm pool of the cluster that serves these engines on `model_path` with at least the
        replicas asked (a LoRA sweep's steps then run on it as runs of their own, each under its own lease
        too; this one keeps the pool from idling out between them), or None: the sweep starts its own. Never
        where the run's config says --no-warm-pools."""
        if not self.plan.config.cluster.warm_pools:
            return None
        import ray

        from cluster.engines.warm import Lease, PoolKey, registry
        from cluster.errors import ClusterError

        try:
            found = registry(create=False)
        except ClusterError as exc:  # another version's registry: its pools are not this sweep's to use
            log.warning("the sweep starts its own engines: %s", exc)
            return None
        if found is None:
            return None
        lease_id = f"sweep-{secrets.token_hex(4)}"
        wanted = PoolKey.of(self._request(model_path).settings)
        for record in ray.get(found.all.remote()):
            if len(record.engines) < self.plan.config.cluster.replicas or not record.serves(wanted):
                continue
            if ray.get(found.acquire.remote(wanted, lease_id, record.name)) is not None:
                return Lease(found, record.name, lease_id, sends=False)
        return None

    def _request(self, model_path: str) -> SourceRequest:
        """The engines of the sweep's model options on `model_path`, LoRA layers where its steps carry adapters."""
        config = self.plan.config
        settings = engine_settings(config.model, model_path, self.plan.device, log_stats=self.verbose)
        return SourceRequest(
            config=config,
            settings=with_lora_slots(
                settings, self.max_loras, config.model.max_lora_rank if self.lora else 0
            ),
            plan=self.plan.replica,
            count=config.cluster.replicas,
            run_id="sweep",
            verbose=self.verbose,
        )

    def _move(self, model_path: str) -> list[EngineInfo]:
        assert self.pool is not None
        self.swaps += 1
        return self.pool.load_checkpoint(model_path)

    def move_to(self, model_path: str) -> list[EngineInfo]:
        """The started replicas moved to `model_path` even where it is the folder they were started on (they
        may serve weights pushed since)."""
        with self._lock:
            assert self.pool is not None, "replicas_for starts the replicas first"
            return self._move(model_path)

    def push_weights(self, packed: object, label: str) -> list[EngineInfo]:
        """The started replicas load packed tensors in place (`ReplicaPool.push_weights`) and serve `label`."""
        with self._lock:
            assert self.pool is not None, "replicas_for starts the replicas first"
            return self.pool.push_weights(packed, label)

    def stage_adapter(self, adapter: Adapter) -> None:
        """A step's LoRA adapter on each replica's node that lacks it (`ReplicaPool.stage_adapter`)."""
        with self._lock:
            assert self.pool is not None, "replicas_for starts the replicas first"
            pool = self.pool
        pool.stage_adapter(adapter)  # outside the lock: the other steps go on dispatching meanwhile

    def stage_files(self, folder: str, files: dict[str, bytes]) -> None:
        with self._lock:
            assert self.pool is not None, "replicas_for starts the replicas first"
            self.pool.stage_files(folder, files)

    def close(self) -> None:
        with self._lock:
            if self.pool is not None:
                self.pool.shutdown()
                self.pool = None
