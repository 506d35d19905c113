"""Run requests on the engine replicas, reusing what the result store already holds.

One `RequestRunner` serves a whole evaluation: native tasks and lm-eval's request batches go through the
same replicas, the same dispatcher and the same content-addressed store. The replicas start on the first
request that is not cached (a fully cached run starts no engine) and live until `close()`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from cluster import timeline
from cluster.engines import EngineInfo, ReplicaPool, engine_settings
from cluster.plan import RunPlan
from cluster.progress import progress_bar
from evaluators.failures import FailureKind
from sharding.dispatcher import Dispatcher, DispatchStats, Replica
from sharding.requests import Completion, GenerationRequest, PromptGroup, group_prompts
from sharding.store import ResultStore, StoreWriteError

if TYPE_CHECKING:
    from cluster.endpoints import ApiClientPool, ApiStats
    from cluster.run.shared import SharedReplicas

log = logging.getLogger(__name__)

CompletionCallback = Callable[[Completion], None]


NOT_GENERATED = FailureKind.NOT_GENERATED.error(
    "the run folder holds no output for this request; run without --judge-only first to generate it"
)


@dataclass
class RunnerStats:
    requests: int = 0
    reused: int = 0
    reused_failed: int = 0
    generated: int = 0
    generation_s: float = 0.0
    engines: list[EngineInfo] = field(default_factory=list)
    replicas_replaced: int = 0  # restarts the pool has spent (a replacement that did not start counts)
    endpoint: ApiStats | None = None  # a model behind an endpoint: its requests, retries and failures
    first_dispatch_at: float | None = None  # wall clock (time.time()) of the first generation dispatched
    last_completion_at: float | None = None


class RequestRunner:
    def __init__(
        self,
        plan: RunPlan,
        store: ResultStore | None,
        *,
        verbose: bool = False,
        progress: bool = True,
        retry_failed: bool = False,
        generate_missing: bool = True,
        core_slots: tuple[int, int] | None = None,
        shared: SharedReplicas | None = None,
    ) -> None:
        """`generate_missing=False` (--judge-only) answers requests the store lacks with a NotGenerated failure
        instead of starting engines. `shared`: replicas that outlive this runner (a sweep's), asked for this
        plan's model instead of a pool of its own."""
        self.plan = plan
        self.shared = shared
        self.generate_missing = generate_missing
        self.core_slots = core_slots
        self.store = store
        self.verbose = verbose
        self.progress = progress
        self.retry_failed = retry_failed
        self.stats = RunnerStats()
        self._pool: ReplicaPool | None = None
        self._endpoint: ApiClientPool | None = None
        self._dispatcher: Dispatcher | None = None
        self._starting: Future[Dispatcher] | None = None
        self._seen: set[str] = set()
        self.write_error: StoreWriteError | None = None  # the store could not be written: the run stops
        self._loop = asyncio.new_event_loop()  # one loop for every batch: the dispatcher's state lives in it

    @property
    def model_path(self) -> str:
        return self.plan.model.path

    @property
    def dispatch(self) -> DispatchStats | None:
        return self._dispatcher.stats if self._dispatcher is not None else None

    @property
    def all_replicas_dead(self) -> bool:
        return self._dispatcher is not None and self._dispatcher.stats.all_replicas_dead

    def run(
        self,
        requests: Sequence[GenerationRequest],
        label: str = "generating",
        on_completion: CompletionCallback | None = None,
    ) -> dict[str, Completion]:
        """Every request's completion by request id: cached ones from the store, the rest generated now."""
        unique = list({r.request_id: r for r in requests}.values())
        results, missing = self._reuse(unique, on_completion)
        groups = group_prompts(missing)
        total = sum(g.size for g in groups)
        log.info(
            "%s: %d requests, %d reused from the store, %d to generate",
            label,
            len(unique),
            len(results),
            total,
        )
        if not groups:
            return results
        if not self.generate_missing:
            for request in missing:
                _deliver(
                    Completion(request.request_id, error=NOT_GENERATED, retryable=True),
                    results,
                    on_completion,
                )
            return results
        self._generate(groups, label, results, on_completion)
        self.stats.generated += total
        return results

    def _reuse(
        self, unique: list[GenerationRequest], on_completion: CompletionCallback | None
    ) -> tuple[dict[str, Completion], list[GenerationRequest]]:
        """The completions the store holds, delivered at once, and the requests it lacks."""
        results: dict[str, Completion] = {}
        missing: list[GenerationRequest] = []
        for request in unique:
            first_time = request.request_id not in self._seen
            self._seen.add(request.request_id)
            store = self.store
            completion = store.get(request.request_id, request.earlier_ids) if store is not None else None
            if completion is None or (self.retry_failed and not completion.ok):
                missing.append(request)
                continue
            if first_time:  # a later batch asking again (another sample round) is not a resume
                self.stats.reused += 1
                self.stats.reused_failed += 0 if completion.ok else 1
            _deliver(completion, results, on_completion)
        self.stats.requests = len(self._seen)
        return results, missing

    def _generate(
        self,
        groups: list[PromptGroup],
        label: str,
        results: dict[str, Completion],
        on_completion: CompletionCallback | None,
    ) -> None:
        """Dispatch the groups over the replicas; each finished group is stored, then delivered."""
        dispatcher = self._ensure_replicas()
        bar = progress_bar(label, enabled=self.progress)
        job = bar.add_task(label, total=sum(g.size for g in groups))

        def done(group: PromptGroup, completions: list[Completion]) -> None:
            self.stats.last_completion_at = time.time()
            timeline.mark("first result", self.stats.last_completion_at)
            if self.write_error is not None:
                return  # the run is stopping: what cannot be stored is generated again on resume
            if self.store is not None:
                try:
                    self.store.add(completions)
                except StoreWriteError as exc:
                    self.write_error = exc
                    dispatcher.abandon_queued(
                        FailureKind.NOT_DISPATCHED.error(f"the run stopped: {exc.strerror}")
                    )
                    return
            for completion in completions:
                _deliver(completion, results, on_completion)
            bar.advance(job, len(completions))

        began = time.perf_counter()
        self.stats.first_dispatch_at = self.stats.first_dispatch_at or time.time()
        timeline.mark("first request handed out")
        with bar:
            self._loop.run_until_complete(dispatcher.run(groups, on_group_done=done))
        if self.stats.last_completion_at is not None:
            timeline.mark("last result", self.stats.last_completion_at, latest=True)
        self.stats.generation_s += time.perf_counter() - began
        if self.write_error is not None:
            raise self.write_error
        if dispatcher.stats.tail_s is not None:
            log.info(
                "%s: %.1f s, of which %.1f s after the last request was handed out (the tail); replicas "
                "finished within %.1f s of each other",
                label,
                time.perf_counter() - began,
                dispatcher.stats.tail_s,
                dispatcher.stats.finish_spread_s,
            )

    def start_in_background(self) -> None:
        """Start the replicas now, while the caller builds requests (engine start is the longest wait of a
        fresh run); the first `run` that needs them waits for the start to finish."""
        if self._dispatcher is None and self._starting is None:
            self._starting = ThreadPoolExecutor(1, thread_name_prefix="replica-start").submit(
                self._start_pool
            )

    def _ensure_replicas(self) -> Dispatcher:
        if self._dispatcher is None:
            self._dispatcher = self._starting.result() if self._starting is not None else self._start_pool()
        return self._dispatcher

    def _start_pool(self) -> Dispatcher:
        if self.plan.model.endpoint:  # the model behind an endpoint: API clients instead of engines
            from cluster.endpoints import ApiSettings, start_api_clients

            config = self.plan.config
            self._endpoint = start_api_clients(
                ApiSettings.from_endpoint_options(config.model, config.endpoint), 1
            )
            return Dispatcher(self._endpoint.replicas())
        if self.shared is not None:  # a sweep's replicas: no replacements, the pool is not this run's alone
            replicas, self.stats.engines = self.shared.replicas_for(self.plan.model.path)
            return Dispatcher(replicas)
        pool = new_pool(self.plan, self.verbose, self.core_slots)
        self._pool = pool
        self.stats.engines = start_pool(pool, self.plan)
        timeline.mark("engines ready")
        return Dispatcher(pool.replicas(), replacer=self._replace)

    async def _replace(self, dead: str) -> Replica | None:
        """The dispatcher's replacer: a new replica from the pool (blocking Ray calls, run in a thread)."""
        pool = self._pool
        if pool is None:
            return None
        if pool.restarts_used < pool.max_restarts:
            log.info(
                "starting a replacement for %s (restart %d of %d)",
                dead,
                pool.restarts_used + 1,
                pool.max_restarts,
            )
        found = await asyncio.to_thread(pool.replace, dead)
        self.stats.replicas_replaced = pool.restarts_used
        if found is None:
            return None
        replica, info = found
        self.stats.engines.append(info)
        log.info("%s ready on %s in %.1f s, in place of %s", info.name, _where(info), info.start_s, dead)
        return replica

    def endpoint_stats(self) -> ApiStats | None:
        """The calls made to the model's endpoint so far (None for a model on engines)."""
        if self._endpoint is not None:
            self.stats.endpoint = self._endpoint.stats()
        return self.stats.endpoint

    @property
    def replica_restarts(self) -> dict[str, int]:
        if self._pool is not None:  # a replacement still starting has spent its restart too
            self.stats.replicas_replaced = self._pool.restarts_used
        return {"allowed": self.plan.config.cluster.replica_restarts, "used": self.stats.replicas_replaced}

    def close(self) -> None:
        if self._starting is not None:
            wait([self._starting])  # a start still in flight must finish before its pool can be shut down
        if self._dispatcher is not None:
            self._dispatcher.cancel_replacements()
        if self._pool is not None:
            self.stats.replicas_replaced = self._pool.restarts_used
            self._pool.shutdown()
            self._pool = None
        if self._endpoint is not None:
            self.stats.endpoint = self._endpoint.stats()
            self._endpoint.shutdown()
            self._endpoint = None
        # a replacement still starting in a worker thread ends once the pool is shut down
        self._loop.run_until_complete(self._loop.shutdown_default_executor())
        self._loop.close()


def new_pool(
    plan: RunPlan,
    verbose: bool,
    core_slots: tuple[int, int] | None = None,
    max_loras: int = 1,
    model_path: str | None = None,
) -> ReplicaPool:
    """The pool of the plan's replicas (not started): the engine settings come from its model options, the
    model from `model_path` where given (a sweep's checkpoint), else the plan's."""
    config = plan.config
    settings = engine_settings(config.model, model_path or plan.model.path, plan.device, log_stats=verbose)
    # LoRA layers only where requests carry an adapter (a merged adapter's plan has none)
    lora_rank = settings.max_lora_rank if plan.adapter is not None else 0
    return ReplicaPool(
        replace(settings, max_loras=max_loras, max_lora_rank=lora_rank),
        plan.replica,
        config.cluster.replicas,
        config.model.cpu_kv_cache_gib,
        verbose,
        core_slots=core_slots,
        max_restarts=config.cluster.replica_restarts,
    )


def start_pool(pool: ReplicaPool, plan: RunPlan) -> list[EngineInfo]:
    """Start the pool's engines and log where each is."""
    log.info("starting %d engine replica(s) of %s", pool.count, plan.replica.describe())
    engines = list(pool.start(plan.config.cluster.placement_timeout_s))
    for info in engines:
        log.info(
            "%s ready on %s in %.1f s (vLLM %s, executor %s)",
            info.name,
            _where(info),
            info.start_s,
            info.vllm_version,
            info.executor,
        )
    return engines


def _deliver(
    completion: Completion, results: dict[str, Completion], on_completion: CompletionCallback | None
) -> None:
    results[completion.request_id] = completion
    if on_completion is not None:
        on_completion(completion)


def _where(info: EngineInfo) -> str:
    """The replica's node, or its bundles' nodes where they are several (a replica over nodes)."""
    nodes = list(dict.fromkeys(info.nodes)) or [info.node_id]
    return f"node {nodes[0][:8]}" if len(nodes) == 1 else f"nodes {', '.join(n[:8] for n in nodes)}"
