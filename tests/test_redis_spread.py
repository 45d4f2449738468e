"""Load that spreads: memory jobs sharded over a Cluster's masters and claimed in turn, a worker's
Redis connections capped, an idle process polling once per interval, not once per loop."""

from __future__ import annotations

import asyncio
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import STORES, keel_config, open_test_store, store_url, tenant
from redis_servers import Server, command, free_ports, redis_binary

from proxy.app import create_app
from proxy.stores.queue import Job
from proxy.stores.redis import RedisStore
from proxy.stores.redis_queue import SHARDS
from proxy.stores.sqlite import SqliteStore


async def test_memory_jobs_spread_over_every_cluster_master(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """64 users' jobs: every master holds some of the queues (one slot carried them all before)."""
    store = open_test_store(store_url(request, "cluster", tmp_path))
    cluster = request.getfixturevalue("redis_cluster")
    queue = store.job_queue()
    try:
        for n in range(64):
            await queue.push(f"acme/user{n}", f"job{n}", b"{}")
        held = [len(command(m.port, "KEYS", "keel:{mq:*}:q:*").splitlines()) for m in cluster.masters()]
        assert len(held) == 3 and all(h > 0 for h in held) and sum(held) == 64, held
    finally:
        await store.close()


@pytest.mark.parametrize("kind", [k for k in STORES if k != "sqlite"])
async def test_claims_take_the_shards_in_turn(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """With work in every shard, consecutive claims come from different shards until each has
    been served once: no shard's users wait behind another shard's."""
    store = open_test_store(store_url(request, kind, tmp_path))
    queue = store.job_queue()
    try:
        users = [f"acme/u{n}" for n in range(200)]
        for user in users:
            for j in range(2):
                await queue.push(user, f"{user}/{j}", b"{}")
        shards = {zlib.crc32(u.encode()) % SHARDS for u in users}
        assert len(shards) == SHARDS
        order: list[int] = []
        for _ in range(SHARDS):
            job: Job | None = await queue.claim("w", 30)
            assert job is not None
            order.append(zlib.crc32(job.queue.encode()) % SHARDS)
        assert sorted(order) == list(range(SHARDS)), order
    finally:
        await store.close()


async def test_a_worker_holds_at_most_max_connections(tmp_path: Path) -> None:
    """200 calls at once through a store capped at 3: the server never sees more than 3 of its
    connections (the test's own INFO connection aside)."""
    binary = redis_binary()
    if binary is None:
        pytest.skip("redis-server is not installed")
    server = Server(free_ports(1)[0], binary).start()
    store = RedisStore(f"redis://127.0.0.1:{server.port}/0", max_connections=3)
    try:
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                clients = int(server.info("clients")["connected_clients"]) - 1
                peak = max(peak, clients)
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        await asyncio.gather(*(store.append(f"l{n % 7}", b"x" * 2000, 60) for n in range(200)),
                             *(store.get_many([f"k{n}", f"j{n}"]) for n in range(200)))
        await asyncio.sleep(0.05)
        watcher.cancel()
        assert 1 <= peak <= 3, peak
        assert await store.get_list("l0") == [b"x" * 2000] * 29
    finally:
        await store.close()
        server.remove()


class CountingStore(SqliteStore):
    """A SQLite store whose job queue counts claims."""

    claims = 0

    def job_queue(self) -> Any:
        inner = super().job_queue()
        outer = self

        class Counting:
            def __getattr__(self, name: str) -> Any:
                return getattr(inner, name)

            async def claim(self, owner: str, lease: float) -> Job | None:
                outer.claims += 1
                return await inner.claim(owner, lease)

        return Counting()


async def test_an_idle_process_polls_once_per_interval(tmp_path: Path) -> None:
    """Four worker loops, nothing queued: about one claim a second for the process (a claim looks
    through all 17 shards on Redis), not four."""
    store = CountingStore(str(tmp_path / "k.db"))
    config = keel_config(tenant("http://127.0.0.1:9/v1", memory={"enabled": True}))
    keel = create_app(config, store=store).state.keel
    keel.memory_worker.start()
    try:
        await asyncio.sleep(0.5)
        start, began = store.claims, time.monotonic()
        await asyncio.sleep(3.2)
        per_second = (store.claims - start) / (time.monotonic() - began)
        assert per_second <= 1.5, per_second
        assert keel.memory_worker.status()["running"] == 4
    finally:
        await keel.memory_worker.stop()
        await store.close()
