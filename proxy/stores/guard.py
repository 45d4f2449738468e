"""A time budget and a circuit breaker in front of any Store.

A hung Redis must not hang Keel: each call gets a small budget (the request path waits tens
of milliseconds, background work longer) and fails as a `StoreError` when it runs out.
After a few failures in a row the breaker opens: calls fail at once, and the pipeline goes
straight to passthrough, until a trial call after `cooldown` seconds succeeds. Several
guards may share one breaker (the request path and the memory worker see the same store).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from proxy.stores import Op, Store, StoreError
from proxy.stores.queue import DeadJob, Job, JobQueue

T = TypeVar("T")


class Breaker:
    """Closed → open after `threshold` consecutive failures → one trial after `cooldown`."""

    def __init__(self, threshold: int = 3, cooldown: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[bool], None] | None = None) -> None:
        self.threshold, self.cooldown, self.clock = threshold, cooldown, clock
        self.failures = 0
        self.opened_at: float | None = None
        self._trial = False
        self._on_change = on_change

    @property
    def closed(self) -> bool:
        return self.opened_at is None

    def allow(self) -> bool:
        """May a call go through now? While open, one trial call per cooldown."""
        if self.opened_at is None:
            return True
        if not self._trial and self.clock() - self.opened_at >= self.cooldown:
            self._trial = True
            return True
        return False

    def success(self) -> None:
        was_open = self.opened_at is not None
        self.failures, self.opened_at, self._trial = 0, None, False
        if was_open and self._on_change:
            self._on_change(True)

    def failure(self) -> None:
        self.failures += 1
        if self.opened_at is not None:  # a failed trial: wait another cooldown
            self.opened_at, self._trial = self.clock(), False
        elif self.failures >= self.threshold:
            self.opened_at = self.clock()
            if self._on_change:
                self._on_change(False)


class GuardedStore:
    """The Store protocol, each call within `budget` seconds and behind `breaker`."""

    def __init__(self, inner: Store, budget: float, breaker: Breaker) -> None:
        self.inner, self.budget, self.breaker = inner, budget, breaker

    @property
    def healthy(self) -> bool:
        return self.breaker.closed

    async def _call(self, work: Callable[[], Awaitable[T]]) -> T:
        if not self.breaker.allow():
            raise StoreError("store unavailable (circuit open)")
        try:
            async with asyncio.timeout(self.budget):  # no task per call, unlike wait_for
                result = await work()
        except (StoreError, TimeoutError, OSError) as exc:
            self.breaker.failure()
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"store call failed: {exc!r} (budget {self.budget * 1000:.0f} ms)") from exc
        self.breaker.success()
        return result

    async def get(self, key: str) -> bytes | None:
        return await self._call(lambda: self.inner.get(key))

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return await self._call(lambda: self.inner.get_many(keys))

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        await self._call(lambda: self.inner.set(key, value, ttl))

    async def set_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        return await self._call(lambda: self.inner.set_if_absent(key, value, ttl))

    async def delete(self, key: str) -> None:
        await self._call(lambda: self.inner.delete(key))

    async def append(self, key: str, value: bytes, ttl: float | None = None) -> int:
        return await self._call(lambda: self.inner.append(key, value, ttl))

    async def get_list(self, key: str) -> list[bytes]:
        return await self._call(lambda: self.inner.get_list(key))

    async def hset(self, key: str, field: str, value: bytes, ttl: float | None = None) -> None:
        await self._call(lambda: self.inner.hset(key, field, value, ttl))

    async def hget(self, key: str, field: str) -> bytes | None:
        return await self._call(lambda: self.inner.hget(key, field))

    async def hgetall(self, key: str) -> dict[str, bytes]:
        return await self._call(lambda: self.inner.hgetall(key))

    async def hdel(self, key: str, field: str) -> bool:
        return await self._call(lambda: self.inner.hdel(key, field))

    async def incr(self, key: str, deltas: Mapping[str, float], ttl: float | None = None) -> None:
        await self._call(lambda: self.inner.incr(key, deltas, ttl))

    async def batch(self, ops: Sequence[Op]) -> list[object]:
        return await self._call(lambda: self.inner.batch(ops))

    async def counters(self, keys: Sequence[str]) -> list[dict[str, float]]:
        return await self._call(lambda: self.inner.counters(keys))

    async def ping(self) -> bool:
        """A health probe: it bypasses the open breaker, and a success closes it."""
        try:
            ok = await asyncio.wait_for(self.inner.ping(), max(self.budget, 1.0))
        except (StoreError, TimeoutError, OSError):
            ok = False
        if ok:
            self.breaker.success()
        return ok

    def job_queue(self) -> GuardedJobQueue:
        """The store's job queue, behind the same budget and breaker."""
        return GuardedJobQueue(self.inner.job_queue(), self)  # type: ignore[attr-defined]

    async def close(self) -> None:
        await self.inner.close()


class GuardedJobQueue:
    """The JobQueue protocol through a GuardedStore's budget and breaker."""

    def __init__(self, inner: JobQueue, guard: GuardedStore) -> None:
        self.inner, self.guard = inner, guard

    async def push(self, queue: str, job_id: str, payload: bytes) -> None:
        await self.guard._call(lambda: self.inner.push(queue, job_id, payload))

    async def claim(self, owner: str, lease: float) -> Job | None:
        return await self.guard._call(lambda: self.inner.claim(owner, lease))

    async def renew(self, job: Job, owner: str, lease: float) -> bool:
        return await self.guard._call(lambda: self.inner.renew(job, owner, lease))

    async def save(self, job: Job, owner: str, payload: bytes) -> bool:
        return await self.guard._call(lambda: self.inner.save(job, owner, payload))

    async def complete(self, job: Job, owner: str) -> bool:
        return await self.guard._call(lambda: self.inner.complete(job, owner))

    async def retry(self, job: Job, owner: str, delay: float, reason: str) -> bool:
        return await self.guard._call(lambda: self.inner.retry(job, owner, delay, reason))

    async def bury(self, job: Job, owner: str, reason: str) -> bool:
        return await self.guard._call(lambda: self.inner.bury(job, owner, reason))

    async def dead(self, queue_prefix: str = "", limit: int = 100) -> list[DeadJob]:
        return await self.guard._call(lambda: self.inner.dead(queue_prefix, limit))

    async def pending(self) -> int:
        return await self.guard._call(self.inner.pending)
