"""Bounded state on Redis: the shipped config (deploy/kubernetes/redis/keel-redis.conf) filled past maxmemory
evicts conversation state and never a memory or a queued job; after a conversation with every
feature on, the only keys without a TTL are the kinds meant to last."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import redis as redis_sync
from conftest import ServerThread, store_url
from redis_servers import Server, free_ports, redis_binary
from test_store_topologies import converse, keel_on

from proxy.memory.book import Limits, MemoryBook
from proxy.stores import StoreError, key
from proxy.stores.redis import RedisStore

CONF = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes" / "redis" / "keel-redis.conf"
USERS = 300


def shipped_config() -> dict[str, str]:
    lines = [line.split(None, 1) for line in CONF.read_text().splitlines() if line and not line.startswith("#")]
    return {name: value.strip() for name, value in lines}


def test_the_shipped_config_evicts_only_keys_with_a_ttl() -> None:
    config = shipped_config()
    assert config["maxmemory-policy"] == "volatile-lru"
    assert re.fullmatch(r"\d+mb", config["maxmemory"]) and config["appendonly"] == "yes"


async def test_past_maxmemory_no_memory_or_job_is_lost(tmp_path: Path) -> None:
    """Redis on the shipped config (maxmemory lowered to 8 MB so the test fills it in seconds):
    300 users' memories and queued jobs first, then 40 MB of conversation records with a TTL.
    Redis evicts records, every write succeeds, and every memory and job is still there."""
    binary = redis_binary()
    if binary is None:
        pytest.skip("redis-server is not installed")
    # the file first (redis-server reads it, then the overrides: a test port, files in a temporary directory)
    server = Server(free_ports(1)[0], binary, [str(CONF), "--maxmemory", "8mb"]).start()
    store = RedisStore(f"redis://127.0.0.1:{server.port}/0")
    book, queue = MemoryBook(store), store.job_queue()
    limits = Limits(2000, 200, 40_000)
    try:
        assert server.info("memory")["maxmemory_policy"] == "volatile-lru"
        for n in range(USERS):
            await book.put("acme", f"user{n}", "city", f"City number {n}", limits, source="api")
            await queue.push(f"acme/user{n}", f"job{n}", b'{"window": "%d"}' % n)
        failures = 0
        record = b"r" * 3000
        for n in range(40 * 1024 * 1024 // len(record)):
            try:
                await store.set(key(f"seed{n % 5000}", "turn", str(n)), record, ttl=3600)
            except StoreError:
                failures += 1
        memory = server.info("memory")
        stats = server.info("stats")
        assert int(stats["evicted_keys"]) > 1000, stats["evicted_keys"]
        assert int(memory["used_memory"]) <= 8 * 1024 * 1024 * 1.1
        assert failures == 0, "writes never fail: Redis makes room by evicting what has a TTL"
        for n in range(USERS):
            assert await book.entries("acme", f"user{n}") == {"city": f"City number {n}"}
        assert await queue.pending() == USERS
        claimed = await asyncio.gather(*(queue.claim(f"w{n}", 30) for n in range(USERS)))
        assert sorted(int(job.id[3:]) for job in claimed if job is not None) == list(range(USERS))
    finally:
        await store.close()
        server.remove()


LASTING = re.compile(r"keel:\{memory:[^}]*\}:(entries|audit)$"  # user data
                     r"|keel:\{mq:\d+\}:(ready|dead|q:.*)$"  # the queue's structure while it holds jobs
                     r"|keel:\{savings:[^}]*\}:memory$")  # the memory model's all-time average per tenant


def test_only_lasting_kinds_have_no_ttl(request: pytest.FixtureRequest, tmp_path: Path, standin: ServerThread,
                                        start_keel: Callable[..., ServerThread]) -> None:
    """Tools, context, memory and savings on Redis: every key Keel wrote has a TTL, but memories,
    their audit, the queue and one counter per tenant (each bounded: README, Sizing)."""
    from memory_model import MemoryModel

    url = store_url(request, "redis", tmp_path)
    with ServerThread(MemoryModel()) as model:
        keel = keel_on(url, standin, model, start_keel)
        converse(keel)
    client = redis_sync.Redis.from_url(url)
    try:
        forever = [k.decode() for k in client.scan_iter(count=1000) if client.pttl(k) == -1]
        kinds = {re.sub(r"[0-9a-f]{16,}", "…", k) for k in forever if not LASTING.match(k)}
        assert not kinds, f"keys that never expire: {sorted(kinds)}"
        assert any("memory" in k for k in forever), "the memories are there, without a TTL"
    finally:
        client.close()
