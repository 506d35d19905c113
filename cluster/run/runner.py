"""Run requests on the engine replicas, reusing what the result store already holds.

One `RequestRunner` serves a whole evaluation: native tasks and lm-eval's request batches go through the
same replicas, the same dispatcher and the same content-addressed store. The replicas start on the first
request that is not cached (a fully cached run starts no engine) and live until `close()`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cluster import timeline
from cluster.engines import EngineInfo
from cluster.plan import RunPlan
from cluster.progress import progress_bar
from cluster.sources import (
    EndpointClients,
    GenerationSource,
    SourceKind,
    SourceRequest,
    choose,
    run_engine_settings,
    where,
)
from evaluators.failures import FailureKind
from sharding.dispatcher import Dispatcher, DispatchStats, Replica
from sharding.requests import Completion, GenerationRequest, PromptGroup, group_prompts
from sharding.store import ResultStore, StoreWriteError

if TYPE_CHECKING:
    from cluster.endpoints import ApiStats
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
    # the replicas the run began with: a warm pool serves with all of its own, more than the run may ask
    replicas: int = 0
    replicas_replaced: int = 0  # restarts the pool has spent (a replacement that did not start counts)
    endpoint: ApiStats | None = None  # a model behind an endpoint: its requests, retries and failures
    source: dict[str, Any] = field(default_factory=dict)  # where the generations came from (run.sources)
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
        warm_pool: str | None = None,
        run_id: str | None = None,
    ) -> None:
        """`generate_missing=False` (--judge-only) answers requests the store lacks with a NotGenerated failure
        instead of starting engines. `shared`: replicas that outlive this runner (a sweep's), asked for this
        plan's model instead of a pool of its own. `warm_pool`: the warm pool to run on (a sweep's, which it
        holds for its steps)."""
        self.plan = plan
        self.shared = shared
        self.warm_pool = warm_pool
        self.generate_missing = generate_missing
        self.core_slots = core_slots
        self.store = store
        self.verbose = verbose
        self.progress = progress
        self.retry_failed = retry_failed
        self.stats = RunnerStats()
        self._source: GenerationSource | None = None
        self.run_id = run_id or "run"
        self._dispatcher: Dispatcher | None = None
        self._starting: Future[Dispatcher] | None = None
        self._abort_lock = threading.Lock()
        self._aborting = False  # `close` came while the start was in flight: a source chosen now gives up
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
        on_handed_out: Callable[[], None] | None = None,
    ) -> dict[str, Completion]:
        """Every request's completion by request id: cached ones from the store, the rest generated now.
        `on_handed_out` is called once the first requests are out (`Dispatcher.handed_out`), where any are."""
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
        self._generate(groups, label, results, on_completion, on_handed_out)
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
        on_handed_out: Callable[[], None] | None = None,
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
            self._loop.run_until_complete(_dispatch(dispatcher, groups, done, on_handed_out))
        if self.stats.last_completion_at is not None:
            timeline.mark("last result", self.stats.last_completion_at, latest=True)
        self.stats.generation_s += time.perf_counter() - began
        if self.write_error is not None:
            raise self.write_error
        if dispatcher.stats.tail_s is not None:
            several = len(dispatcher.stats.per_replica) > 1
            spread = f"; replicas finished within {dispatcher.stats.finish_spread_s:.1f} s of each other"
            log.info(
                "%s: %.1f s, of which %.1f s after the last request was handed out (the tail)%s",
                label,
                time.perf_counter() - began,
                dispatcher.stats.tail_s,
                spread if several else "",
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
        """The run's replicas from its generation source (`run.sources`): its own, a warm pool, a sweep's,
        or an endpoint's clients."""
        source = choose(self.source_request())
        with self._abort_lock:  # `close` aborts the source once there is one, or tells `start` here
            self._source = source
            if self._aborting:
                source.abort()
        started = source.start()
        # the adapter's folder may be on this node only (hosts without shared storage)
        if self.plan.adapter is not None:
            source.stage_adapter(self.plan.adapter)
        self.stats.engines = started.engines
        if source.kind is not SourceKind.ENDPOINT:  # an endpoint's "replicas" are its API clients
            self.stats.replicas = len(started.replicas)
        self.stats.source = source.describe()
        if source.kind is SourceKind.OWN:
            timeline.mark("engines ready")
        replacer = self._replace if source.kind in (SourceKind.OWN, SourceKind.WARM) else None
        return Dispatcher(
            started.replicas, replacer=replacer, max_in_flight=self.plan.config.cluster.max_in_flight
        )

    def source_request(self) -> SourceRequest:
        plan, config = self.plan, self.plan.config
        return SourceRequest(
            config=config,
            settings=run_engine_settings(plan, self.verbose),
            plan=plan.replica,
            count=config.cluster.replicas,
            run_id=self.run_id,
            verbose=self.verbose,
            core_slots=self.core_slots,
            max_restarts=config.cluster.replica_restarts,
            endpoint=bool(plan.model.endpoint),
            shared=self.shared,
            warm_pools=config.cluster.warm_pools,
            warm_pool=self.warm_pool,
            keep_warm_s=config.cluster.kept_warm_s,
        )

    async def _replace(self, dead: str) -> Replica | None:
        """The dispatcher's replacer: a new replica from the source (blocking Ray calls, run in a thread)."""
        source = self._source
        if source is None:
            return None
        log.info("starting a replacement for %s", dead)
        found = await source.replace(dead)
        self.stats.source = source.describe()
        if found is None:
            return None
        replica, info = found
        self.stats.engines.append(info)
        log.info("%s ready on %s in %.1f s, in place of %s", info.name, where(info), info.start_s, dead)
        return replica

    def endpoint_stats(self) -> ApiStats | None:
        """The calls made to the model's endpoint so far (None for a model on engines)."""
        if isinstance(self._source, EndpointClients) and self._source.clients is not None:
            self.stats.endpoint = self._source.clients.stats()
        return self.stats.endpoint

    @property
    def replica_restarts(self) -> dict[str, int]:
        if self._source is not None:  # a replacement still starting has spent its restart too
            self.stats.replicas_replaced = int(self._source.describe().get("restarts_used", 0))
        return {"allowed": self.plan.config.cluster.replica_restarts, "used": self.stats.replicas_replaced}

    def close(self) -> None:
        if self._starting is not None:
            with self._abort_lock:  # an interrupted run: the start gives up and stops what it started
                self._aborting = not self._starting.done()
                if self._aborting and self._source is not None:
                    self._source.abort()
            wait([self._starting])  # a start still in flight must finish before its pool can be shut down
        if self._dispatcher is not None:
            self._dispatcher.cancel_replacements()
        if self._source is not None:
            self.replica_restarts  # noqa: B018 - records the restarts used before the pool goes
            self.endpoint_stats()
            self.stats.source = self._source.describe()
            per_replica = self._dispatcher.stats.per_replica if self._dispatcher is not None else {}
            self._source.close({name: replica.sequences for name, replica in per_replica.items()})
            self._source = None
        # a replacement still starting in a worker thread ends once the pool is shut down
        self._loop.run_until_complete(self._loop.shutdown_default_executor())
        self._loop.close()


async def _dispatch(
    dispatcher: Dispatcher,
    groups: list[PromptGroup],
    done: Callable[[PromptGroup, list[Completion]], None],
    on_handed_out: Callable[[], None] | None,
) -> None:
    """`dispatcher.run`, calling `on_handed_out` once its first requests are out."""
    running = asyncio.ensure_future(dispatcher.run(groups, on_group_done=done))
    if on_handed_out is not None:
        handed_out = asyncio.ensure_future(dispatcher.handed_out())
        await asyncio.wait({running, handed_out}, return_when=asyncio.FIRST_COMPLETED)
        handed_out.cancel()
        on_handed_out()
    await running


def _deliver(
    completion: Completion, results: dict[str, Completion], on_completion: CompletionCallback | None
) -> None:
    results[completion.request_id] = completion
    if on_completion is not None:
        on_completion(completion)
