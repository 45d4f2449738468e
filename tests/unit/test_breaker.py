"""proxy/stores/guard.py on its own: the breaker's states on a fake clock, and the guard that turns
a slow or failing store into a `StoreError` and opens the breaker."""

from __future__ import annotations

import asyncio

import pytest

from proxy.stores import StoreError
from proxy.stores.guard import Breaker, GuardedStore
from proxy.testing import FakeClock


def breaker(threshold: int = 2, cooldown: float = 5) -> tuple[Breaker, FakeClock, list[bool]]:
    clock, changes = FakeClock(), []
    return Breaker(threshold=threshold, cooldown=cooldown, clock=clock.monotonic, on_change=changes.append), clock, \
        changes


def test_it_opens_after_threshold_consecutive_failures_only() -> None:
    b, _, changes = breaker(threshold=3)
    b.failure()
    b.failure()
    b.success()  # not consecutive: the count starts again
    b.failure()
    b.failure()
    assert b.closed and b.allow() and changes == []
    b.failure()
    assert not b.closed and not b.allow() and changes == [False]


def test_half_open_allows_one_trial_per_cooldown() -> None:
    b, clock, _ = breaker()
    b.failure()
    b.failure()
    clock.advance(4.99)
    assert not b.allow(), "still cooling down"
    clock.advance(0.01)
    assert b.allow() and not b.allow() and not b.allow(), "one trial, not two"


def test_a_failed_trial_waits_a_whole_new_cooldown() -> None:
    b, clock, changes = breaker()
    b.failure()
    b.failure()
    clock.advance(5)
    assert b.allow()
    clock.advance(3)
    b.failure()  # the trial failed 3 s into the cooldown: the next trial is 5 s from now, not 2
    clock.advance(4.9)
    assert not b.allow() and not b.closed
    clock.advance(0.1)
    assert b.allow() and changes == [False], "a failed trial does not report the breaker opening again"


def test_a_successful_trial_closes_and_reports_it() -> None:
    b, clock, changes = breaker()
    b.failure()
    b.failure()
    clock.advance(5)
    assert b.allow()
    b.success()
    assert b.closed and b.allow() and b.allow() and changes == [False, True] and b.failures == 0
    b.failure()
    assert b.closed, "the count started again from zero"


def test_success_while_closed_reports_nothing() -> None:
    b, _, changes = breaker()
    b.success()
    assert changes == []


class Store:
    """A store whose `get` answers, hangs for `delay`, or raises `error`."""

    def __init__(self, delay: float = 0.0, error: Exception | None = None) -> None:
        self.delay, self.error, self.calls = delay, error, 0

    async def get(self, key: str) -> bytes | None:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.error:
            raise self.error
        return b"v"

    async def ping(self) -> bool:
        if self.error:
            raise self.error
        return True


async def test_overruns_become_store_errors_and_open_the_breaker() -> None:
    inner = Store(delay=10)
    store = GuardedStore(inner, 0.01, Breaker(threshold=2, cooldown=60))  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(StoreError, match="budget"):
            await store.get("k")
    with pytest.raises(StoreError, match="circuit open"):
        await store.get("k")
    assert not store.healthy and inner.calls == 2, "an open breaker does not call the store"


@pytest.mark.parametrize("error", [StoreError("down"), OSError("reset"), ConnectionRefusedError()])
async def test_every_failure_is_a_store_error_and_counts(error: Exception) -> None:
    b = Breaker(threshold=1, cooldown=60)
    store = GuardedStore(Store(error=error), 1.0, b)  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        await store.get("k")
    assert not b.closed


async def test_an_error_that_is_not_the_stores_is_not_counted() -> None:
    """A bug in Keel (a ValueError) is no sign the store is down: it propagates, the breaker stays closed."""
    b = Breaker(threshold=1, cooldown=60)
    store = GuardedStore(Store(error=ValueError("bug")), 1.0, b)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await store.get("k")
    assert b.closed


async def test_guards_sharing_a_breaker_open_together() -> None:
    shared = Breaker(threshold=1, cooldown=60)
    inner = Store(error=StoreError("down"))
    request_path = GuardedStore(inner, 0.05, shared)  # type: ignore[arg-type]
    background = GuardedStore(inner, 5.0, shared)  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        await request_path.get("k")
    with pytest.raises(StoreError, match="circuit open"):
        await background.get("k")


async def test_a_ping_bypasses_an_open_breaker_and_a_good_one_closes_it() -> None:
    inner = Store(error=StoreError("down"))
    b = Breaker(threshold=1, cooldown=3600)
    store = GuardedStore(inner, 0.05, b)  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        await store.get("k")
    assert not await store.ping() and not b.closed
    inner.error = None
    assert await store.ping() and b.closed and await store.get("k") == b"v"
