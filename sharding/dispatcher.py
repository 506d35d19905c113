"""Dynamic dispatch of prompt groups over engine replicas from one shared queue.

Each replica pulls the longest remaining group whenever it has room in its in-flight window, so ragged
output lengths never leave a replica idle while another holds a backlog (work stealing by construction).
A replica that dies hands its in-flight groups back to the queue for the others, and, when the caller
gives a `replacer`, a replacement is asked for: it joins the feeding when it is ready, and until it is (or
the replacer says there is none) the queue waits for it rather than failing with "every replica died".

A window may hold more than the engine runs at once (a batch waiting inside the engine, so it refills
without a round trip), but only while the queue could still fill every replica that far: near the end each
replica holds at most its running batch, so the last groups go to whichever replica frees a slot first
instead of waiting inside an engine that is still busy while another one idles.

An engine that several runs use at once (a warm pool) has its window divided among them: each run's
dispatcher reads how many share it (`Replica.shared_by`) and holds its part, so the engine's queue stays the
size one run would keep and each run has an equal part of it.

A run may also cap what it keeps in flight on each replica (`max_in_flight`): a setting of the run, not of
the engine, so a warm pool with the engine's own batch size serves a run that asks for fewer at a time.

"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from evaluators.failures import FailureKind
from sharding.requests import Completion, PromptGroup

log = logging.getLogger(__name__)

ReplicaCall = Callable[[PromptGroup], Awaitable[list[Completion]]]
# How many runs feed a replica's engine now, this one included (read at each handout).
SharedBy = Callable[[], int]
GroupDone = Callable[[PromptGroup, list[Completion]], None]
# Given the name of a replica that died, start one to take its place; None when there is none to be had.
Replacer = Callable[[str], Awaitable["Replica | None"]]


class ReplicaDead(Exception):
    """Raised by a replica call when the replica is gone: its work goes back on the queue."""


@dataclass
class Replica:
    """A named engine replica: an async call that generates one prompt group, and its in-flight window.

    `max_in_flight` counts sequences (samples), and should be at least the engine's max_num_seqs so that
    continuous batching always has a full batch to pick from. `batch_size`, when given, is what the engine
    runs at once (max_num_seqs): the window shrinks to it once the queue runs low (the end game).
    `shared_by`, when given, says how many runs use the engine at once: this run's window is that part of
    the whole (rounded up), so runs sharing an engine hold equal parts of its queue.
    """

    name: str
    generate: ReplicaCall
    max_in_flight: int
    batch_size: int | None = None
    shared_by: SharedBy | None = None


@dataclass
class ReplicaStats:
    groups: int = 0
    sequences: int = 0
    requeued: int = 0
    peak_in_flight: int = 0
    peak_runs_sharing: int = 1  # the most runs seen using the replica's engine at once (`Replica.shared_by`)
    last_finish_at: float | None = None  # wall clock of this replica's last finished group
    dead: bool = False
    death_cause: str | None = None


@dataclass
class DispatchStats:
    groups_done: int = 0
    groups_failed: int = 0
    requeues: int = 0
    per_replica: dict[str, ReplicaStats] = field(default_factory=dict)
    replacements: dict[str, str] = field(
        default_factory=dict
    )  # replacement's name -> the replica it replaced
    # Wall-clock times (time.time()): the tail from the last hand-out to the last finish is the time the
    # replicas ran with nothing left to pull, which more replicas cannot shorten.
    first_handout_at: float | None = None
    last_handout_at: float | None = None
    last_finish_at: float | None = None

    @property
    def tail_s(self) -> float | None:
        """Seconds from the last hand-out to the last finish (None before anything was handed out)."""
        if self.last_handout_at is None or self.last_finish_at is None:
            return None
        return max(0.0, self.last_finish_at - self.last_handout_at)

    @property
    def finish_spread_s(self) -> float:
        """How far apart the replicas finished their last groups."""
        finished = [r.last_finish_at for r in self.per_replica.values() if r.last_finish_at is not None]
        return max(finished) - min(finished) if finished else 0.0

    @property
    def all_replicas_dead(self) -> bool:
        return bool(self.per_replica) and all(r.dead for r in self.per_replica.values())

    def death_causes(self) -> dict[str, str]:
        return {name: r.death_cause or "unknown" for name, r in self.per_replica.items() if r.dead}


@dataclass
class _ReplicaState:
    replica: Replica
    stats: ReplicaStats
    in_flight: int = 0


class Dispatcher:
    """Feeds replicas from one longest-first queue until every group has finished or failed."""

    def __init__(
        self,
        replicas: list[Replica],
        on_group_done: GroupDone | None = None,
        max_attempts: int = 3,
        replacer: Replacer | None = None,
        max_in_flight: int | None = None,
    ) -> None:
        """`max_in_flight`: at most this many sequences in flight on each replica (None: each replica's
        window)."""
        if not replicas:
            raise ValueError("the dispatcher needs at least one replica")
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self._cap = max_in_flight
        self._states = [_ReplicaState(r, ReplicaStats()) for r in replicas]
        self._on_group_done = on_group_done
        self._max_attempts = max_attempts
        self._heap: list[tuple[int, int, PromptGroup]] = []
        self._queued_sequences = 0
        self._attempts: dict[str, int] = {}
        self._arrival = (
            itertools.count()
        )  # tie-break of equal costs: first queued, first out; groups never compared
        self._unfinished = 0
        self._open = False
        self._feeders: list[asyncio.Task[None]] = []
        self._cond = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        self._replacer = replacer
        self._replacing: set[asyncio.Task[None]] = set()
        self._feeding = False  # from `open` until `drain` has returned: a replica that joins gets a feeder
        self._feeders_running = 0
        self._feeders_waiting = 0  # feeders waiting for room in their replica's window
        self._handed_out = asyncio.Event()
        self.stats = DispatchStats(per_replica={s.replica.name: s.stats for s in self._states})

    @property
    def replicas(self) -> list[Replica]:
        """Every replica it feeds or has fed, in the order they joined (the dead ones too)."""
        return [state.replica for state in self._states]

    async def run(
        self, groups: Iterable[PromptGroup], on_group_done: GroupDone | None = None
    ) -> DispatchStats:
        """Dispatch `groups` until each has finished or failed. A dispatcher may run several batches of groups
        one after another (in one event loop); replicas that died in an earlier batch stay dead."""
        self.open(on_group_done)
        await self.submit(groups)
        return await self.drain()

    def open(self, on_group_done: GroupDone | None = None) -> None:
        """Start feeding the replicas; groups may then be `submit`ted at any time until `drain`.

        This is the streaming form of `run`: judging submits each output's judge prompts as soon as the
        output exists, while generation goes on.
        """
        if on_group_done is not None:
            self._on_group_done = on_group_done
        self._open = self._feeding = True
        self._handed_out.clear()
        self._feeders = [self._start_feeder(state) for state in self._states if not state.stats.dead]

    async def submit(self, groups: Iterable[PromptGroup]) -> None:
        """Queue more groups (longest first among what is queued); fails them at once if no replica lives."""
        async with self._cond:
            added = 0
            for group in groups:
                self._push(group)
                added += 1
            self._unfinished += added
            if not self._live() and not self._replacing:
                self._fail_everything_queued(FailureKind.REPLICAS_DEAD.error("every replica has died"))
            self._cond.notify_all()

    async def handed_out(self) -> None:
        """Return once what can be handed out now has been: every feeder waits for room (its replica's window
        is full, or the queue is empty), or every feeder has ended. Each group handed out has had its turn to
        send its call by then. A run starts work that would compete with the handout for the interpreter (a
        scorer's imports, on a thread) after it."""
        await self._handed_out.wait()

    async def drain(self) -> DispatchStats:
        """Wait until every submitted group has finished or failed; the dispatcher is then closed. Queued work
        that only a pending replacement can run waits for it."""
        async with self._cond:
            self._open = False
            self._cond.notify_all()
            await self._cond.wait_for(lambda: self._unfinished == 0)
        while self._feeders:  # a replacement that joined meanwhile brought a feeder of its own
            feeders, self._feeders = self._feeders, []
            await asyncio.gather(*feeders)
        while self._tasks:
            await asyncio.gather(*list(self._tasks))
        self._feeding = False
        return self.stats

    def cancel_replacements(self) -> None:
        """Stop waiting for replacements still starting (the run is over)."""
        for task in list(self._replacing):
            task.cancel()

    def _idle(self) -> bool:
        """Nothing left to do and nothing more coming."""
        return self._unfinished == 0 and not self._open

    def _live(self) -> list[_ReplicaState]:
        return [s for s in self._states if not s.stats.dead]

    def _ask_for_replacement(self, name: str) -> None:
        if self._replacer is not None:
            task = asyncio.create_task(self._replace(name, self._replacer))
            self._replacing.add(task)
            task.add_done_callback(self._replacing.discard)

    async def _replace(self, name: str, replacer: Replacer) -> None:
        """Start a replacement for `name`; when there is none, the queue fails if no replica is left."""
        try:
            replacement = await replacer(name)
        except Exception as exc:  # noqa: BLE001 - a replacement that cannot start leaves the run as it was
            log.warning("no replacement for replica %s: %s: %s", name, type(exc).__name__, exc)
            replacement = None
        async with self._cond:
            if replacement is not None:
                self.add_replica(replacement, replaces=name)
            elif not self._live() and len(self._replacing) <= 1:  # this task is the last one pending
                self._fail_everything_queued(FailureKind.REPLICAS_DEAD.error("every replica has died"))
            self._cond.notify_all()

    def add_replica(self, replica: Replica, replaces: str | None = None) -> None:
        """Feed one more replica from the shared queue (called with the lock held, or before `open`)."""
        state = _ReplicaState(replica, ReplicaStats())
        self._states.append(state)
        self.stats.per_replica[replica.name] = state.stats
        if replaces is not None:
            self.stats.replacements[replica.name] = replaces
            log.info("replica %s joined in place of %s", replica.name, replaces)
        if self._feeding:
            self._feeders.append(self._start_feeder(state))

    def _push(self, group: PromptGroup) -> None:
        heapq.heappush(self._heap, (-group.expected_cost, next(self._arrival), group))
        self._queued_sequences += group.size

    def _pop(self) -> PromptGroup:
        group = heapq.heappop(self._heap)[2]
        self._queued_sequences -= group.size
        return group

    def _window(self, state: _ReplicaState) -> int:
        """The full window while the queue holds a running batch for every live replica, else (the end game)
        only the running batch: work not yet started stays in the shared queue for the first free slot. Of
        an engine that other runs use too, this run's part of that (rounded up); at most the run's cap."""
        replica = state.replica
        window = replica.max_in_flight
        if replica.batch_size is not None:  # this run's part of a running batch on every live replica
            batches = sum(
                self._room(s.replica.batch_size or s.replica.max_in_flight, s.replica) for s in self._live()
            )
            window = replica.max_in_flight if self._queued_sequences >= batches else replica.batch_size
        return self._room(window, replica)

    def _room(self, sequences: int, replica: Replica) -> int:
        """This run's part of `sequences` of the replica's engine, at most the run's cap."""
        part = _part(sequences, replica)
        return part if self._cap is None else min(part, self._cap)

    def _has_room(self, state: _ReplicaState) -> bool:
        if not self._heap:
            return False
        next_size = self._heap[0][2].size
        # A group larger than the whole window still runs, alone, so it can never starve.
        return state.in_flight == 0 or state.in_flight + next_size <= self._window(state)

    def _start_feeder(self, state: _ReplicaState) -> asyncio.Task[None]:
        self._feeders_running += 1  # counted from here: a feeder not yet begun has not handed out
        return asyncio.create_task(self._feed(state))

    async def _feed(self, state: _ReplicaState) -> None:
        try:
            await self._feed_until_done(state)
        finally:
            self._feeders_running -= 1
            self._note_handed_out()

    def _note_handed_out(self) -> None:
        if self._feeders_waiting >= self._feeders_running:
            self._handed_out.set()

    async def _wait_for_room(self, state: _ReplicaState) -> None:
        """Wait (lock held) until `state`'s replica has room, it died, or the dispatch is over."""

        def ready() -> bool:
            return self._idle() or state.stats.dead or self._has_room(state)

        if ready():
            return
        self._feeders_waiting += 1
        self._note_handed_out()
        try:
            await self._cond.wait_for(ready)
        finally:
            self._feeders_waiting -= 1

    async def _feed_until_done(self, state: _ReplicaState) -> None:
        while True:
            async with self._cond:
                await self._wait_for_room(state)
                if state.stats.dead or self._idle():
                    return
                group = self._pop()
                state.in_flight += group.size
                now = time.time()
                self.stats.first_handout_at = self.stats.first_handout_at or now
                self.stats.last_handout_at = now
                state.stats.peak_in_flight = max(state.stats.peak_in_flight, state.in_flight)
                sharing = _runs_sharing(state.replica)
                state.stats.peak_runs_sharing = max(state.stats.peak_runs_sharing, sharing)
            task = asyncio.create_task(self._run_group(state, group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            await asyncio.sleep(0)  # let the other feeders pull too, so a small run spreads over all replicas

    async def _run_group(self, state: _ReplicaState, group: PromptGroup) -> None:
        completions: list[Completion] = []
        death: ReplicaDead | None = None
        try:
            completions = await state.replica.generate(group)
        except ReplicaDead as exc:
            death = exc
        except Exception as exc:  # noqa: BLE001 - a failure of the call itself, not of one request
            completions = _failed(group, state.replica.name, f"{type(exc).__name__}: {exc}")
        async with self._cond:
            self._settle(state, group, completions, death)
            self._cond.notify_all()

    def _settle(
        self,
        state: _ReplicaState,
        group: PromptGroup,
        completions: list[Completion],
        death: ReplicaDead | None,
    ) -> None:
        state.in_flight -= group.size
        if death is not None:
            self._replica_died(state, group, str(death))
        else:
            self._finish(state, group, completions)

    def _replica_died(self, state: _ReplicaState, group: PromptGroup, cause: str) -> None:
        if not state.stats.dead:  # the first cause; later ones from the same replica only echo the kill
            state.stats.dead = True
            state.stats.death_cause = cause
            log.warning(
                "replica %s died (%s); putting its in-flight work back on the queue",
                state.replica.name,
                cause,
            )
            self._ask_for_replacement(state.replica.name)
        attempts = self._attempts.get(group.group_id, 0) + 1
        self._attempts[group.group_id] = attempts
        if not self._live() and not self._replacing:
            everyone = FailureKind.REPLICAS_DEAD.error("every replica has died")
            self._fail_everything_queued(everyone)
            self._finish(state, group, _failed(group, state.replica.name, everyone))
        elif attempts >= self._max_attempts:
            reason = FailureKind.REPLICA_LOST.error(f"the replicas running this prompt died {attempts} times")
            self._finish(state, group, _failed(group, state.replica.name, reason))
        else:
            state.stats.requeued += 1
            self.stats.requeues += 1
            self._push(group)

    def abandon_queued(self, reason: str) -> None:
        """Hand out nothing more: every queued group fails at once with `reason` (retryable, so a later run
        does it), and groups in flight finish as they are. Called from `on_group_done`, which runs with the
        dispatcher's lock held, when their results can no longer be kept (the output disk is full)."""
        self._fail_everything_queued(reason)
        self._cond.notify_all()

    def _fail_everything_queued(self, reason: str) -> None:
        while self._heap:
            group = self._pop()
            self._finish(None, group, _failed(group, "", reason))

    def _finish(self, state: _ReplicaState | None, group: PromptGroup, completions: list[Completion]) -> None:
        self._unfinished -= 1
        self.stats.last_finish_at = time.time()
        if state is not None:
            state.stats.last_finish_at = self.stats.last_finish_at
            state.stats.groups += 1
            state.stats.sequences += group.size
        if all(c.ok for c in completions):
            self.stats.groups_done += 1
        else:
            self.stats.groups_failed += 1
        if self._on_group_done is not None:
            self._on_group_done(group, completions)


def _failed(group: PromptGroup, replica: str, reason: str) -> list[Completion]:
    """Failures of the machinery, not of the requests: retryable, so they are not cached as results."""
    return [Completion(r.request_id, replica=replica, error=reason, retryable=True) for r in group.requests]


def _runs_sharing(replica: Replica) -> int:
    return 1 if replica.shared_by is None else max(1, replica.shared_by())


def _part(sequences: int, replica: Replica) -> int:
    """This run's part of `sequences` of the replica's engine, rounded up."""
    return -(-sequences // _runs_sharing(replica))
