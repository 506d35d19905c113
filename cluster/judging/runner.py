"""Judge requests served while generation goes on: a dispatcher in its own event loop and thread.

Generation calls `submit` from its completion callback as each output arrives; the judge's replicas (or
API actors) start in the background when the run starts, so judging begins on the first finished outputs
instead of after the last one. Answers are cached per judge in a result store keyed by (judge, judge
prompt), so a rerun, or a re-judge with the same judge, asks nothing twice.

A judgment that failed on transient faults after every retry (an API outage: the backend's `is_transient`)
is not answered yet: it is held back and asked once more, a second pass, once the judge has had nothing
else in flight for `second_pass_pause_s` since the last such failure: at the end of judging, or in a lull
while generation still runs. So a short outage costs no sample, where one failed judgment would fail its
whole sample (a HealthBench sample has one per rubric item). The second answer is final, failed or not;
other failures (a rejected key, a bad request, a judge that cannot start) are answered at once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, replace

from cluster.judging.backends import JudgeBackend
from evaluators.failures import FailureKind
from sharding.dispatcher import Dispatcher, DispatchStats
from sharding.requests import Completion, GenerationRequest, PromptGroup, group_prompts
from sharding.store import ResultStore, StoreWriteError

log = logging.getLogger(__name__)

AnswerCallback = Callable[[Completion], None]


@dataclass
class JudgeStats:
    requests: int = 0
    reused: int = 0
    asked: int = 0
    failed: int = 0
    first_submit_at: float | None = None  # wall clock of the first judge request handed in
    first_answer_at: float | None = None
    last_answer_at: float | None = None
    start_s: float = 0.0  # judge engines / actors start time
    start_error: str | None = None
    second_pass: int = 0  # judgments that failed transiently and were asked once more at the end
    second_pass_recovered: int = 0  # of those, the ones answered the second time


SECOND_PASS_PAUSE_S = 5.0  # long enough for a proxy restart or a brief overload to pass, short beside a run


class JudgeRunner:
    def __init__(
        self,
        backend: JudgeBackend,
        store: ResultStore,
        on_answer: AnswerCallback,
        second_pass_pause_s: float = SECOND_PASS_PAUSE_S,
    ) -> None:
        self.backend = backend
        self.store = store
        self.on_answer = on_answer
        self.second_pass_pause_s = second_pass_pause_s
        self.stats = JudgeStats()
        self.write_error: StoreWriteError | None = None  # the judge cache could not be written (full disk)
        self._seen: set[str] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="judge-loop", daemon=True)
        self._pending: list[Future[None]] = []
        self._dispatcher: Dispatcher | None = None
        # Events bind to the loop that first waits on them (the judge loop), so they can be made here.
        self._ready = asyncio.Event()
        self._closing = asyncio.Event()
        self._needed = asyncio.Event()
        self._submissions_lock = threading.Lock()
        self._answered = 0
        self._finished = False
        self.backend_stats: dict[str, object] = {}
        # Second passes; all of it is touched on the judge loop only.
        self._in_flight = 0  # judge requests handed to the dispatcher and not yet back
        self._held: list[GenerationRequest] = []  # failed transiently, waiting for their second pass
        self._last_held_at = 0.0  # time.monotonic() of the latest one held back
        self._second_asked: set[str] = set()  # request ids on their second pass
        self._quiet = asyncio.Event()  # nothing in flight
        self._holding = asyncio.Event()  # something held back
        self._settled = asyncio.Event()  # nothing in flight and nothing held back

    @property
    def dispatch(self) -> DispatchStats | None:
        return self._dispatcher.stats if self._dispatcher is not None else None

    def start(self, eager: bool) -> None:
        """Start the judge loop. `eager`: start the judge's replicas or actors now (a fresh run: they start
        while the model's do); otherwise on the first judge request the cache cannot answer."""
        if eager:
            self._needed.set()
        self._thread.start()

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        """Hand in judge requests from any thread; answers come back through `on_answer`."""
        if not requests:
            return
        if self.stats.first_submit_at is None:
            self.stats.first_submit_at = time.time()
        future = asyncio.run_coroutine_threadsafe(self._submit(list(requests)), self._loop)
        with self._submissions_lock:
            self._pending.append(future)

    def finish(self, timeout_s: float | None = None) -> None:
        """Wait until every submitted request has an answer (or a failure), second passes included, then
        stop the backend."""
        with self._submissions_lock:
            pending = list(self._pending)
        wait(pending, timeout=timeout_s)
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._close)
            self._thread.join(timeout_s)
        if self._finished:
            return
        self._finished = True
        try:
            self.backend_stats = self.backend.stats()  # before shutdown: API actors hold their retry counts
        except Exception as exc:  # noqa: BLE001 - statistics must not lose the run's results
            self.backend_stats = {"error": f"{type(exc).__name__}: {exc}"}
        self.backend.shutdown()
        for future in pending:  # surface a bug in the judge loop instead of hanging or losing answers
            if future.done() and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]

    def progress(self) -> tuple[int, int]:
        """(answered, handed in) judge requests, for the progress display."""
        return self._answered, self.stats.requests

    def _close(self) -> None:
        self._closing.set()

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        needed = asyncio.create_task(self._needed.wait())
        closing = asyncio.create_task(self._closing.wait())
        await asyncio.wait([needed, closing], return_when=asyncio.FIRST_COMPLETED)
        for waiter in (needed, closing):
            waiter.cancel()
        if not self._needed.is_set():
            return  # every judgment came from the cache: no judge was started
        began = time.perf_counter()
        try:
            replicas = await asyncio.to_thread(self.backend.start)
        except Exception as exc:  # noqa: BLE001 - a judge that cannot start fails its judgments, not the run
            self.stats.start_error = f"{type(exc).__name__}: {exc}"
            log.error("the judge could not start: %s", self.stats.start_error)
            self._ready.set()
            await self._closing.wait()
            return
        self.stats.start_s = time.perf_counter() - began
        self._dispatcher = Dispatcher(replicas)
        self._dispatcher.open(self._group_done)
        self._note_progress()
        second_passes = asyncio.create_task(self._second_passes())
        self._ready.set()
        await self._closing.wait()
        # The second passes of what was handed in before closing; a bug in them must not hang the run.
        settled = asyncio.create_task(self._settled.wait())
        await asyncio.wait([settled, second_passes], return_when=asyncio.FIRST_COMPLETED)
        settled.cancel()
        bug = second_passes.exception() if second_passes.done() else None  # it ends on nothing else
        second_passes.cancel()
        await self._dispatcher.drain()
        if bug is not None:
            raise bug

    async def _submit(self, requests: list[GenerationRequest]) -> None:
        missing: list[GenerationRequest] = []
        for request in {r.request_id: r for r in requests}.values():
            if request.request_id in self._seen:
                continue  # already asked in this run: its answer reaches every waiting sample
            self._seen.add(request.request_id)
            self.stats.requests += 1
            if self.store.is_done(request.request_id, retry_failed=True):
                self.stats.reused += 1
                self._answer(self.store.get(request.request_id))  # type: ignore[arg-type]
            else:
                missing.append(request)
        if not missing:
            return
        self._needed.set()
        await self._ready.wait()
        if self._dispatcher is None:
            for request in missing:
                error = FailureKind.JUDGE_UNAVAILABLE.error(
                    f"the judge could not start ({self.stats.start_error})"
                )
                self._answer(Completion(request.request_id, error=error, retryable=True))
            return
        self.stats.asked += len(missing)
        await self._ask(missing)

    async def _ask(self, requests: list[GenerationRequest]) -> None:
        assert self._dispatcher is not None
        self._in_flight += len(requests)
        self._note_progress()
        await self._dispatcher.submit(group_prompts(requests))

    async def _second_passes(self) -> None:
        """Ask the held-back judgments again once the judge has had nothing else in flight for the pause
        since the latest of them failed; runs as long as the dispatcher."""
        while True:
            await self._holding.wait()
            await self._quiet.wait()
            remaining = self._last_held_at + self.second_pass_pause_s - time.monotonic()
            if remaining > 0:
                await asyncio.sleep(remaining)
                continue  # more may have failed, or come in, meanwhile: look again
            requests, self._held = self._held, []
            self._second_asked.update(r.request_id for r in requests)
            self.stats.second_pass += len(requests)
            log.info(
                "second pass: asking the judge again for %d judgment(s) that failed on transient errors",
                len(requests),
            )
            await self._ask(requests)

    def _group_done(self, group: PromptGroup, completions: list[Completion]) -> None:
        try:
            self.store.add(completions)
        except (
            StoreWriteError
        ) as exc:  # raised by the coordinator once judging stops; the answers still count
            self.write_error = self.write_error or exc
        requests = {r.request_id: r for r in group.requests}
        for completion in completions:
            self._in_flight -= 1
            if not self._hold(requests[completion.request_id], completion):
                self._answer(self._second_answer(completion))
        self._note_progress()

    def _hold(self, request: GenerationRequest, completion: Completion) -> bool:
        """Keep a transient failure back for its second pass, unless this was its second pass."""
        if completion.ok or request.request_id in self._second_asked:
            return False
        if not self.backend.is_transient(completion):
            return False
        self._held.append(request)
        self._last_held_at = time.monotonic()
        return True

    def _second_answer(self, completion: Completion) -> Completion:
        """Count a second pass's outcome; a failure says it failed twice."""
        if completion.request_id not in self._second_asked:
            return completion
        if completion.ok:
            self.stats.second_pass_recovered += 1
            return completion
        again = (
            f"{completion.error} (and again on a second pass, after a {self.second_pass_pause_s:g} s pause)"
        )
        return replace(completion, error=again)

    def _note_progress(self) -> None:
        for event, state in (
            (self._quiet, self._in_flight == 0),
            (self._holding, bool(self._held)),
            (self._settled, self._in_flight == 0 and not self._held),
        ):
            if state:
                event.set()
            else:
                event.clear()

    def _answer(self, completion: Completion) -> None:
        now = time.time()
        if self.stats.first_answer_at is None:
            self.stats.first_answer_at = now
        self.stats.last_answer_at = now
        self._answered += 1
        if not completion.ok:
            self.stats.failed += 1
        self.on_answer(completion)
