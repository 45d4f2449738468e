"""One contract for every JobQueue: SQLite (a real file), and Redis, Valkey, a Redis Cluster and a
Sentinel-managed Redis (real servers: tests/redis_servers.py), and the in-memory store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import CONTRACT_STORES, open_test_store, store_url

from proxy.stores.queue import DeadLetters, JobQueue


@pytest.fixture(params=CONTRACT_STORES)
async def queue(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[JobQueue]:
    store = open_test_store(store_url(request, request.param, tmp_path))
    yield store.job_queue()
    await store.close()


async def test_fifo_per_queue_and_one_lease_per_queue(queue: JobQueue) -> None:
    """A queue's jobs come out in order, one at a time: its second job waits for the first."""
    for i in range(3):
        await queue.push("alice", f"a{i}", f"pa{i}".encode())
    await queue.push("bob", "b0", b"pb0")
    first = await queue.claim("w1", 30)
    second = await queue.claim("w2", 30)
    assert first is not None and second is not None
    assert {(first.queue, first.id), (second.queue, second.id)} == {("alice", "a0"), ("bob", "b0")}
    assert await queue.claim("w3", 30) is None, "alice's next job waits for a0; bob has no more"
    alice = first if first.queue == "alice" else second
    assert alice.payload == b"pa0" and alice.attempts == 0 and alice.claims == 1
    assert await queue.complete(alice, "w1" if alice is first else "w2")
    nxt = await queue.claim("w3", 30)
    assert nxt is not None and nxt.id == "a1"
    assert await queue.pending() == 3


async def test_retry_keeps_the_head_and_waits(queue: JobQueue) -> None:
    """A failed run counts an attempt; the job stays first and its queue waits out the delay."""
    await queue.push("q", "j1", b"1")
    await queue.push("q", "j2", b"2")
    job = await queue.claim("w", 30)
    assert job is not None and await queue.retry(job, "w", 0.3, "model down")
    assert await queue.claim("w", 30) is None
    await asyncio.sleep(0.4)
    again = await queue.claim("w", 30)
    assert again is not None and again.id == "j1" and again.attempts == 1 and again.claims == 2


async def test_bury_moves_to_dead_letters_and_frees_the_queue(queue: JobQueue) -> None:
    await queue.push("t1/u1", "poison", b"x")
    await queue.push("t1/u1", "good", b"y")
    job = await queue.claim("w", 30)
    assert job is not None and await queue.bury(job, "w", "ValueError: bad part")
    nxt = await queue.claim("w", 30)
    assert nxt is not None and nxt.id == "good"
    (dead,) = await queue.dead("t1/")
    assert (dead.id, dead.queue, dead.reason, dead.payload, dead.attempts) == ("poison", "t1/u1", "ValueError: bad part",
                                                                              b"x", 1)
    assert await queue.dead("t2/") == []
    assert await queue.pending() == 1


async def test_a_lost_lease_hands_the_job_to_another_worker(queue: JobQueue) -> None:
    """A worker that stops renewing loses the job; it can no longer finish it, the next owner can."""
    await queue.push("q", "j", b"p")
    job = await queue.claim("dead-worker", 0.2)
    assert job is not None
    await asyncio.sleep(0.35)
    taken = await queue.claim("live-worker", 30)
    assert taken is not None and taken.id == "j" and taken.claims == 2
    assert not await queue.complete(job, "dead-worker")
    assert not await queue.save(job, "dead-worker", b"stale")
    assert await queue.save(taken, "live-worker", b"progress")
    assert await queue.complete(taken, "live-worker")
    assert await queue.pending() == 0


async def test_renew_keeps_the_lease(queue: JobQueue) -> None:
    await queue.push("q", "j", b"p")
    job = await queue.claim("w", 0.3)
    assert job is not None
    for _ in range(3):
        await asyncio.sleep(0.15)
        assert await queue.renew(job, "w", 0.3)
    assert await queue.claim("other", 30) is None


async def test_saved_payload_is_what_a_rerun_sees(queue: JobQueue) -> None:
    await queue.push("q", "j", b"before")
    job = await queue.claim("w", 30)
    assert job is not None and await queue.save(job, "w", b"after")
    assert await queue.retry(job, "w", 0, "again")
    again = await queue.claim("w", 30)
    assert again is not None and again.payload == b"after"


async def test_concurrent_claims_lease_each_queue_once(queue: JobQueue) -> None:
    for q in range(5):
        for j in range(2):
            await queue.push(f"q{q}", f"q{q}j{j}", b"")
    claimed = await asyncio.gather(*(queue.claim(f"w{i}", 30) for i in range(12)))
    jobs = [c for c in claimed if c is not None]
    assert sorted(j.id for j in jobs) == [f"q{q}j0" for q in range(5)]


async def test_pushing_an_id_again_adds_nothing(queue: JobQueue) -> None:
    """A push retried after a failure that may have pushed (a timeout) leaves one job: waiting,
    running or dead, the first stays as it is."""
    await queue.push("q", "j1", b"first")
    await queue.push("q", "j1", b"again")
    job = await queue.claim("w", 30)
    assert job is not None and job.payload == b"first" and await queue.pending() == 1
    await queue.push("q", "j1", b"while it runs")
    assert await queue.bury(job, "w", "bad")
    await queue.push("q", "j1", b"when dead")
    assert await queue.pending() == 0 and await queue.claim("w", 30) is None
    assert [d.payload for d in await queue.dead("q")] == [b"first"]


@pytest.mark.parametrize("kind", CONTRACT_STORES)
async def test_dead_letters_expire_and_are_capped(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """A buried job is kept for the dead letters' TTL; past the cap the oldest go first; a job that
    waits is never dropped by either."""
    store = open_test_store(store_url(request, kind, tmp_path), DeadLetters(ttl=0.4, kept=3))
    queue = store.job_queue()
    try:
        for i in range(5):
            await queue.push("t/u", f"d{i}", b"x")
        await queue.push("t/waiting", "w0", b"keep me")
        for i in range(5):
            job = await queue.claim("w", 30)
            while job is not None and job.queue != "t/u":  # leave the waiting user's job alone
                job = await queue.claim("w", 30)
            assert job is not None and job.id == f"d{i}"
            assert await queue.bury(job, "w", "bad")
        dead = [d.id for d in await queue.dead("t/")]
        assert 1 <= len(dead) <= 3 and dead[-1] == "d4" and "d0" not in dead, dead
        await asyncio.sleep(0.5)
        assert await queue.dead("t/") == []
        assert await queue.pending() == 1, "the waiting job is still there"
    finally:
        await store.close()
