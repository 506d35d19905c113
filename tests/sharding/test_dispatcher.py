"""The dispatcher with plain async callables standing in for engine replicas (no Ray, no vLLM)."""

from __future__ import annotations

import asyncio

import pytest

from sharding.dispatcher import Dispatcher, Replica, ReplicaDead
from sharding.requests import Completion, GenerationRequest, PromptGroup, SamplingSpec, build_group


def make_group(prompt: str, n: int = 1, max_tokens: int = 16) -> PromptGroup:
    spec = SamplingSpec(max_tokens=max_tokens)
    requests = [GenerationRequest(f"{prompt}#{i}", prompt, spec, seed=i, sample_index=i) for i in range(n)]
    return build_group(prompt, requests)


class FakeReplica:
    """Records what it was sent and how many sequences it held at once."""

    def __init__(
        self,
        name: str,
        delay: float = 0.0,
        die_after: int | None = None,
        fail_prompts: set[str] | None = None,
    ):
        self.name = name
        self.delay = delay
        self.die_after = die_after
        self.fail_prompts = fail_prompts or set()
        self.seen: list[PromptGroup] = []
        self.in_flight = 0
        self.in_flight_seen: list[int] = []  # the sequences held as each group arrived
        self.peak = 0

    async def __call__(self, group: PromptGroup) -> list[Completion]:
        self.seen.append(group)
        self.in_flight += group.size
        self.in_flight_seen.append(self.in_flight)
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            if self.die_after is not None and len(self.seen) > self.die_after:
                raise ReplicaDead(f"{self.name} lost")
            if group.prompt in self.fail_prompts:
                raise RuntimeError("engine rejected the prompt")
            return [
                Completion(r.request_id, text=f"out:{r.request_id}", replica=self.name)
                for r in group.requests
            ]
        finally:
            self.in_flight -= group.size

    def replica(self, max_in_flight: int, batch_size: int | None = None) -> Replica:
        return Replica(self.name, self, max_in_flight, batch_size=batch_size)


def run(dispatcher: Dispatcher, groups: list[PromptGroup]):
    return asyncio.run(dispatcher.run(groups))


def collect() -> tuple[dict[str, Completion], callable]:
    results: dict[str, Completion] = {}

    def done(group: PromptGroup, completions: list[Completion]) -> None:
        for completion in completions:
            assert completion.request_id not in results, "a request finished twice"
            results[completion.request_id] = completion

    return results, done


def test_longest_expected_first_on_a_single_replica():
    fake = FakeReplica("r0")
    groups = [
        make_group("short", max_tokens=8),
        make_group("x" * 400, max_tokens=8),
        make_group("mid", max_tokens=64),
    ]
    dispatcher = Dispatcher([Replica("r0", fake, max_in_flight=1)])
    run(dispatcher, groups)
    assert [g.prompt for g in fake.seen] == ["x" * 400, "mid", "short"]


def test_the_replicas_it_feeds_are_listed_in_the_order_they_joined():
    first, second, third = (Replica(name, FakeReplica(name), max_in_flight=1) for name in ("r0", "r1", "r2"))
    dispatcher = Dispatcher([first, second])
    dispatcher.add_replica(third, replaces="r0")
    assert dispatcher.replicas == [first, second, third]
    assert dispatcher.stats.replacements == {"r2": "r0"}


def test_in_flight_window_is_filled_but_never_exceeded():
    fake = FakeReplica("r0", delay=0.01)
    groups = [make_group(f"p{i}", n=2) for i in range(20)]
    dispatcher = Dispatcher([Replica("r0", fake, max_in_flight=8)])
    stats = run(dispatcher, groups)
    assert fake.peak == 8
    assert stats.per_replica["r0"].peak_in_flight == 8
    assert stats.groups_done == 20


def test_runs_sharing_an_engine_hold_equal_parts_of_its_window():
    """Two runs' dispatchers feed one engine that says it has two users: each holds half the window, so the
    engine's queue is one run's size, and both finish every group."""
    engine = FakeReplica("r0", delay=0.01)

    async def both() -> list:
        dispatchers = [Dispatcher([Replica("r0", engine, 8, shared_by=lambda: 2)]) for _ in range(2)]
        groups = [[make_group(f"{run}-p{i}", n=2) for i in range(12)] for run in ("a", "b")]
        return await asyncio.gather(*(d.run(g) for d, g in zip(dispatchers, groups, strict=True)))

    for stats in asyncio.run(both()):
        assert stats.groups_done == 12
        assert stats.per_replica["r0"].peak_in_flight == 4
        assert stats.per_replica["r0"].peak_runs_sharing == 2
    assert engine.peak == 8


def test_a_runs_part_of_a_shared_window_grows_when_the_other_runs_leave():
    """Three users at first (a part of 3 of the 8 sequences, rounded up), one after the first groups finish:
    the window grows to the whole without a group lost or run twice."""
    engine = FakeReplica("r0", delay=0.01)
    users = [3]

    def finished(group: PromptGroup, completions: list[Completion]) -> None:
        done.append(group.prompt)
        if len(done) == 4:
            users[0] = 1
            arrived_while_shared.extend(engine.in_flight_seen)

    done: list[str] = []
    arrived_while_shared: list[int] = []
    dispatcher = Dispatcher([Replica("r0", engine, 8, shared_by=lambda: users[0])], on_group_done=finished)
    stats = run(dispatcher, [make_group(f"p{i}") for i in range(30)])
    assert sorted(done) == sorted(f"p{i}" for i in range(30))
    assert len(arrived_while_shared) >= 6 and max(arrived_while_shared) == 3  # refilled, never past its part
    assert engine.peak == 8
    assert stats.per_replica["r0"].peak_runs_sharing == 3


def test_a_runs_cap_holds_each_replica_below_its_window_and_a_shared_part():
    """A run that asks for at most 3 in flight keeps each replica at 3, whatever its window (16) or its part of
    a shared engine's (8 of 16 with two users); a part below the cap (16 of 8 users: 2) holds; nothing is
    lost or run twice."""
    for users, peak in ((1, 3), (2, 3), (8, 2)):
        engines = [FakeReplica("r0", delay=0.002), FakeReplica("r1", delay=0.002)]
        replicas = [Replica(e.name, e, 16, batch_size=8, shared_by=lambda u=users: u) for e in engines]
        results, done = collect()
        stats = run(
            Dispatcher(replicas, on_group_done=done, max_in_flight=3),
            [make_group(f"p{i}") for i in range(40)],
        )
        assert len(results) == 40 and stats.groups_done == 40
        assert max(e.peak for e in engines) == peak, users
    with pytest.raises(ValueError, match="max_in_flight must be at least 1"):
        Dispatcher([Replica("r0", FakeReplica("r0"), 4)], max_in_flight=0)


def test_group_larger_than_window_still_runs_alone():
    fake = FakeReplica("r0")
    dispatcher = Dispatcher([Replica("r0", fake, max_in_flight=2)])
    stats = run(dispatcher, [make_group("big", n=5), make_group("small", n=1)])
    assert stats.groups_done == 2
    assert fake.peak == 5


def test_every_request_finishes_exactly_once_and_n_samples_stay_together():
    fast, slow = FakeReplica("fast", delay=0.001), FakeReplica("slow", delay=0.02)
    results, done = collect()
    groups = [make_group(f"prompt-{i}", n=4) for i in range(30)]
    dispatcher = Dispatcher([Replica("fast", fast, 8), Replica("slow", slow, 8)], on_group_done=done)
    run(dispatcher, groups)
    assert len(results) == 30 * 4
    for group in groups:
        replicas = {results[r.request_id].replica for r in group.requests}
        assert len(replicas) == 1, "the N samples of one prompt were split across replicas"
    # Work stealing: the fast replica takes more groups than a static half split would give it.
    assert len(fast.seen) > len(slow.seen)


def test_near_the_end_work_not_started_waits_in_the_queue_for_a_free_replica():
    """Windows hold two batches (one running, one waiting in the engine) while the queue is long; once it
    holds less than a batch per replica, each replica keeps only its running batch, so the last groups go
    to the replica that frees a slot first instead of queueing inside a slow one."""

    def split(batch_size: int | None) -> tuple[int, int]:
        fast, slow = FakeReplica("fast", delay=0.001), FakeReplica("slow", delay=0.2)
        replicas = [
            Replica("fast", fast, 4, batch_size=batch_size),
            Replica("slow", slow, 4, batch_size=batch_size),
        ]
        stats = run(Dispatcher(replicas), [make_group(f"p{i}") for i in range(6)])
        assert stats.groups_done == 6
        return len(fast.seen), len(slow.seen)

    assert split(batch_size=2) == (4, 2)
    assert split(batch_size=None) == (3, 3)  # without the end game the slow replica queues a third group


def test_the_tail_and_how_far_apart_replicas_finished_are_recorded():
    fast, slow = FakeReplica("fast", delay=0.001), FakeReplica("slow", delay=0.2)
    dispatcher = Dispatcher([Replica("fast", fast, 1), Replica("slow", slow, 1)])
    assert dispatcher.stats.tail_s is None
    stats = run(dispatcher, [make_group(f"p{i}") for i in range(2)])
    assert stats.tail_s is not None and stats.tail_s >= 0.15  # the slow group ran after the last hand-out
    assert stats.finish_spread_s >= 0.15
    assert stats.last_finish_at == stats.per_replica["slow"].last_finish_at


def test_the_full_window_is_used_while_the_queue_is_long():
    fake = FakeReplica("r0", delay=0.01)
    dispatcher = Dispatcher([Replica("r0", fake, max_in_flight=8, batch_size=4)])
    stats = run(dispatcher, [make_group(f"p{i}") for i in range(40)])
    assert fake.peak == 8 and stats.groups_done == 40


def test_dead_replica_work_goes_back_on_the_queue():
    dying = FakeReplica("dying", delay=0.005, die_after=2)
    healthy = FakeReplica("healthy", delay=0.005)
    results, done = collect()
    groups = [make_group(f"q{i}", n=2) for i in range(12)]
    dispatcher = Dispatcher([Replica("dying", dying, 4), Replica("healthy", healthy, 4)], on_group_done=done)
    stats = run(dispatcher, groups)
    assert len(results) == 24
    assert all(c.ok for c in results.values())
    assert stats.per_replica["dying"].dead
    assert stats.requeues >= 1
    assert {c.replica for c in results.values()} <= {"dying", "healthy"}


def test_all_replicas_dead_fails_the_rest_instead_of_hanging():
    results, done = collect()
    groups = [make_group(f"q{i}") for i in range(5)]
    dispatcher = Dispatcher([Replica("r0", FakeReplica("r0", die_after=0), 2)], on_group_done=done)
    stats = asyncio.run(asyncio.wait_for(dispatcher.run(groups), timeout=5))
    assert len(results) == 5
    assert all(c.error == "ReplicasDead: every replica has died" and c.retryable for c in results.values())
    assert stats.groups_failed == 5
    assert stats.all_replicas_dead and stats.death_causes() == {"r0": "r0 lost"}


def test_a_failing_request_is_recorded_and_the_run_goes_on():
    fake = FakeReplica("r0", fail_prompts={"bad"})
    results, done = collect()
    dispatcher = Dispatcher([Replica("r0", fake, 4)], on_group_done=done)
    stats = run(dispatcher, [make_group("good"), make_group("bad", n=2), make_group("fine")])
    failed = [c for c in results.values() if not c.ok]
    assert len(results) == 4 and len(failed) == 2
    assert all("engine rejected the prompt" in (c.error or "") and c.retryable for c in failed)
    assert stats.groups_done == 2 and stats.groups_failed == 1


def test_a_small_run_spreads_over_every_replica():
    replicas = [FakeReplica(f"r{i}", delay=0.01) for i in range(3)]
    dispatcher = Dispatcher([Replica(f.name, f, max_in_flight=64) for f in replicas])
    run(dispatcher, [make_group(f"p{i}") for i in range(6)])
    assert [len(f.seen) for f in replicas] == [2, 2, 2]


def test_needs_a_replica():
    with pytest.raises(ValueError):
        Dispatcher([])


def test_requeued_groups_of_equal_cost_do_not_collide_in_the_queue():
    dying = FakeReplica("dying", delay=0.005, die_after=0)
    healthy = FakeReplica("healthy", delay=0.005)
    results, done = collect()
    groups = [make_group(f"same-length-{i}") for i in range(6)]  # equal expected cost
    dispatcher = Dispatcher([Replica("dying", dying, 6), Replica("healthy", healthy, 1)], on_group_done=done)
    stats = run(dispatcher, groups)
    assert stats.requeues >= 2
    assert len(results) == 6 and all(c.ok for c in results.values())


def test_handed_out_returns_once_every_window_is_full_and_before_any_group_finishes():
    """What the windows take at the start has been sent (each replica's call begun) when `handed_out` returns,
    and nothing has come back yet: a run starts its scorer's imports there, off the handout's path."""
    replicas = [FakeReplica("r0", delay=0.05), FakeReplica("r1", delay=0.05)]
    finished: list[str] = []
    seen_then: list[int] = []

    async def scenario() -> None:
        dispatcher = Dispatcher([r.replica(max_in_flight=3) for r in replicas])
        running = asyncio.ensure_future(
            dispatcher.run([make_group(f"p{i}") for i in range(10)], lambda g, c: finished.append(g.prompt))
        )
        await dispatcher.handed_out()
        seen_then.extend(len(r.seen) for r in replicas)
        assert finished == []
        await running

    asyncio.run(scenario())
    assert seen_then == [3, 3]  # both windows full; the other four groups wait in the queue
    assert len(finished) == 10


def test_handed_out_returns_when_the_queue_empties_first_and_when_every_replica_died():
    async def handed_out_after(replica: FakeReplica, groups: int) -> tuple[int, int]:
        results, done = collect()
        dispatcher = Dispatcher([replica.replica(max_in_flight=8)])
        running = asyncio.ensure_future(dispatcher.run([make_group(f"p{i}") for i in range(groups)], done))
        await asyncio.wait_for(dispatcher.handed_out(), timeout=5)  # never waits for room that cannot come
        seen = len(replica.seen)
        await running
        return seen, sum(1 for c in results.values() if c.error is not None)

    assert asyncio.run(handed_out_after(FakeReplica("r0", delay=0.05), 3)) == (3, 0)
    _, failed = asyncio.run(handed_out_after(FakeReplica("r0", die_after=0), 2))
    assert failed == 2


def test_streaming_dispatch_takes_groups_while_earlier_ones_run():
    """Judging submits judge prompts as outputs arrive: groups added mid-run finish, and drain waits for all."""
    replicas = [FakeReplica("r0", delay=0.01), FakeReplica("r1", delay=0.01)]
    finished: list[str] = []

    async def scenario() -> None:
        dispatcher = Dispatcher([Replica(r.name, r, 4) for r in replicas])
        dispatcher.open(lambda group, completions: finished.append(group.prompt))
        await dispatcher.submit([make_group("first")])
        await asyncio.sleep(0.05)  # the first group is done before more arrive; the feeders must still wait
        assert finished == ["first"]
        await dispatcher.submit([make_group(f"later-{i}") for i in range(10)])
        stats = await dispatcher.drain()
        assert stats.groups_done == 11

    asyncio.run(scenario())
    assert sorted(finished) == sorted(["first", *(f"later-{i}" for i in range(10))])
    assert all(r.seen for r in replicas)


def test_streaming_submit_after_every_replica_died_fails_the_groups():
    dead = FakeReplica("r0", die_after=0)
    results: dict[str, Completion] = {}

    async def scenario() -> None:
        dispatcher = Dispatcher([Replica("r0", dead, 4)], max_attempts=1)
        dispatcher.open(lambda group, completions: results.update({c.request_id: c for c in completions}))
        await dispatcher.submit([make_group("a")])
        await asyncio.sleep(0.02)
        await dispatcher.submit([make_group("b")])
        await dispatcher.drain()

    asyncio.run(scenario())
    assert {c.error for c in results.values()} == {"ReplicasDead: every replica has died"}
    assert len(results) == 2


def test_a_lost_only_replica_is_replaced_and_the_queue_waits_for_it():
    """The only replica dies after one group; the replacement starts later (its engine start), and the groups
    queued meanwhile run on it instead of failing with "every replica died"."""
    asked: list[str] = []
    fresh = FakeReplica("r0.1", delay=0.001)

    async def replacer(name: str) -> Replica:
        asked.append(name)
        await asyncio.sleep(0.05)
        return fresh.replica(4)

    results, done = collect()
    groups = [make_group(f"q{i}") for i in range(8)]
    dispatcher = Dispatcher(
        [FakeReplica("r0", die_after=1).replica(1)], on_group_done=done, replacer=replacer
    )
    stats = asyncio.run(asyncio.wait_for(dispatcher.run(groups), timeout=5))
    assert asked == ["r0"]
    assert len(results) == 8 and all(c.ok for c in results.values())
    assert stats.replacements == {"r0.1": "r0"}
    assert stats.per_replica["r0"].dead and not stats.per_replica["r0.1"].dead
    assert stats.per_replica["r0.1"].groups == 7  # one group finished on r0 before it died
    assert not stats.all_replicas_dead


def test_no_replacement_to_be_had_fails_the_queue_with_the_deaths():
    async def replacer(name: str) -> None:
        await asyncio.sleep(0.01)
        return None

    results, done = collect()
    dispatcher = Dispatcher(
        [FakeReplica("r0", die_after=0).replica(2)], on_group_done=done, replacer=replacer
    )
    stats = asyncio.run(asyncio.wait_for(dispatcher.run([make_group(f"q{i}") for i in range(5)]), timeout=5))
    assert len(results) == 5
    assert all(c.error == "ReplicasDead: every replica has died" for c in results.values())
    assert stats.all_replicas_dead and stats.replacements == {}


def test_a_replacement_that_fails_to_start_is_logged_and_the_others_carry_on(caplog):
    async def replacer(name: str) -> Replica:
        raise RuntimeError("no node has 1 CPU free")

    results, done = collect()
    replicas = [
        FakeReplica("dying", delay=0.002, die_after=1).replica(2),
        FakeReplica("ok", delay=0.002).replica(2),
    ]
    dispatcher = Dispatcher(replicas, on_group_done=done, replacer=replacer)
    run(dispatcher, [make_group(f"q{i}") for i in range(10)])
    assert len(results) == 10 and all(c.ok for c in results.values())
    assert "no replacement for replica dying: RuntimeError: no node has 1 CPU free" in caplog.text
