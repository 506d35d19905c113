"""The one request limiter of the whole cluster, shared by every API judge actor on every node.

Two limits hold together: a request rate and a number of requests in flight. The rate is a token bucket
of capacity 1 refilled at `requests_per_second`, so grants are spaced at least 1/rps apart and never come
in bursts (a larger bucket would let a backlog fire all at once after a quiet spell, which is exactly what
trips an API's per-second limit). A caller first takes a lease (a concurrency slot), then waits for its
rate slot, and gives the lease back with `release` when its HTTP call has returned.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

import ray


@dataclass(frozen=True)
class LimiterStats:
    grants: int
    peak_concurrency: int
    total_wait_s: float
    in_use: int


class LimiterCore:
    """The limiter's arithmetic without Ray or asyncio: the caller supplies the clock."""

    def __init__(self, requests_per_second: float, max_concurrency: int) -> None:
        if requests_per_second <= 0:
            raise ValueError(f"requests_per_second must be positive, got {requests_per_second}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        self.interval = 1.0 / requests_per_second
        self.max_concurrency = max_concurrency
        self.in_use = 0
        self.next_free = float("-inf")  # the earliest time the bucket holds its one token again
        self.grants = 0
        self.peak = 0
        self.total_wait = 0.0

    def has_room(self) -> bool:
        return self.in_use < self.max_concurrency

    def lease(self, now: float, asked_at: float) -> float:
        """Take a concurrency slot and reserve the next rate slot; returns the grant time (>= now).

        The caller must have checked `has_room` and must not send before the returned time.
        """
        if not self.has_room():
            raise RuntimeError("lease taken with no concurrency slot free")
        self.in_use += 1
        self.peak = max(self.peak, self.in_use)
        grant = max(now, self.next_free)
        self.next_free = grant + self.interval
        self.grants += 1
        self.total_wait += grant - asked_at
        return grant

    def release(self) -> None:
        if self.in_use == 0:
            raise RuntimeError("release without a lease")
        self.in_use -= 1

    def stats(self) -> LimiterStats:
        return LimiterStats(self.grants, self.peak, self.total_wait, self.in_use)


# Every pending acquire of every judge is one running coroutine here, so the actor's window must exceed
# the total judge concurrency (judges x their in-flight windows); Ray's default for async actors is 1000.
@ray.remote(num_cpus=0, max_concurrency=100_000)
class RateLimiter:
    """Ray actor around `LimiterCore`; waiters get concurrency slots first come, first served."""

    def __init__(self, requests_per_second: float, max_concurrency: int) -> None:
        self._core = LimiterCore(requests_per_second, max_concurrency)
        self._waiters: deque[tuple[asyncio.Future[float], float]] = deque()

    async def acquire(self) -> float:
        """Wait for a concurrency slot and then a rate slot; returns the grant time (time.time())."""
        asked_at = time.monotonic()
        if self._core.has_room() and not self._waiters:
            grant = self._core.lease(asked_at, asked_at)
        else:
            waiter: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            self._waiters.append((waiter, asked_at))
            try:
                grant = await waiter  # `release` leases on the waiter's behalf and sends the grant time
            except asyncio.CancelledError:
                if waiter.cancelled():
                    self._waiters = deque(w for w in self._waiters if w[0] is not waiter)
                else:
                    self._release()  # the lease was already ours
                raise
        try:
            await asyncio.sleep(max(0.0, grant - time.monotonic()))
        except asyncio.CancelledError:
            self._release()
            raise
        return time.time()

    async def release(self) -> None:
        """Give back the lease of one `acquire`."""
        self._release()

    def stats(self) -> LimiterStats:
        return self._core.stats()

    def _release(self) -> None:
        self._core.release()
        # The slot goes straight to the first waiter, so a newcomer can never jump the queue.
        while self._waiters and self._core.has_room():
            waiter, asked_at = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(self._core.lease(time.monotonic(), asked_at))
