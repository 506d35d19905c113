"""The dispatcher's call to an engine actor (`cluster.engines.replica_call`) when Ray says the actor is
unavailable: a stand-in actor raises Ray's own `ActorUnavailableError` (a node out of reach for a moment cannot
be caused on demand here), and the call asks again instead of killing a replica that other runs share."""

from __future__ import annotations

import asyncio

import pytest
from ray.exceptions import ActorUnavailableError

from cluster.engines import pool as pool_module
from cluster.engines.pool import replica_call
from sharding.dispatcher import ReplicaDead


class Unavailable:
    """`actor.generate.remote(group)`, unavailable for the first `failures` calls, then answering."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.generate = self

    def remote(self, group: object):
        self.calls += 1

        async def answer() -> list[str]:
            if self.calls <= self.failures:
                raise ActorUnavailableError("its node did not answer", None)
            return [f"completion of {group}"]

        return answer()


@pytest.fixture(autouse=True)
def no_pauses(monkeypatch):
    monkeypatch.setattr(pool_module, "UNAVAILABLE_PAUSES_S", (0.0, 0.0, 0.0))


def test_an_actor_unavailable_for_a_moment_is_asked_again_and_answers():
    actor = Unavailable(failures=2)
    call = replica_call(actor, "replica-0")  # type: ignore[arg-type]
    assert asyncio.run(call("group-1")) == ["completion of group-1"]  # type: ignore[arg-type]
    assert actor.calls == 3


def test_an_actor_unavailable_at_every_try_counts_as_dead(monkeypatch):
    killed = []
    monkeypatch.setattr(pool_module.ray, "kill", lambda actor, no_restart: killed.append(actor))
    actor = Unavailable(failures=99)
    call = replica_call(actor, "replica-0")  # type: ignore[arg-type]
    with pytest.raises(ReplicaDead, match="is unavailable: its node did not answer"):
        asyncio.run(call("group-1"))  # type: ignore[arg-type]
    assert actor.calls == 4 and killed == [actor]
