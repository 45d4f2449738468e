"""One contract for every Store: SQLite (a real file), and Redis, Valkey, a Redis Cluster and a
Sentinel-managed Redis (real servers: tests/redis_servers.py), and the in-memory store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import CONTRACT_STORES, open_test_store, store_url

from proxy.stores import Append, Get, Incr, ReadCounters, Set, Store, key
from proxy.stores.redis import RedisStore
from proxy.stores.sqlite import SqliteStore


@pytest.fixture(params=CONTRACT_STORES)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s: Store = open_test_store(store_url(request, request.param, tmp_path))
    yield s
    await s.close()


async def test_get_set_delete(store: Store) -> None:
    assert await store.get("a") is None
    await store.set("a", b"\x00bytes\xff")
    assert await store.get("a") == b"\x00bytes\xff"
    await store.set("a", b"two")
    assert await store.get("a") == b"two"
    await store.delete("a")
    assert await store.get("a") is None


async def test_get_many_keeps_order(store: Store) -> None:
    await store.set("k1", b"1")
    await store.set("k3", b"3")
    assert await store.get_many(["k3", "k2", "k1"]) == [b"3", None, b"1"]
    assert await store.get_many([]) == []


async def test_ttl_expires(store: Store) -> None:
    await store.set("short", b"x", ttl=0.2)
    await store.set("long", b"y", ttl=60)
    assert await store.get("short") == b"x"
    await asyncio.sleep(0.35)
    assert await store.get("short") is None
    assert await store.get("long") == b"y"


async def test_set_if_absent(store: Store) -> None:
    assert await store.set_if_absent("once", b"first") is True
    assert await store.set_if_absent("once", b"second") is False
    assert await store.get("once") == b"first"
    assert await store.set_if_absent("brief", b"a", ttl=0.2) is True
    await asyncio.sleep(0.35)
    assert await store.set_if_absent("brief", b"b") is True, "an expired key counts as absent"
    assert await store.get("brief") == b"b"


async def test_set_if_absent_concurrent_single_winner(store: Store) -> None:
    results = await asyncio.gather(*(store.set_if_absent("race", str(i).encode()) for i in range(20)))
    assert results.count(True) == 1


async def test_lists(store: Store) -> None:
    assert await store.get_list("l") == []
    assert await store.append("l", b"a") == 1
    assert await store.append("l", b"b", ttl=60) == 2
    assert await store.get_list("l") == [b"a", b"b"]
    await store.delete("l")
    assert await store.get_list("l") == []


async def test_hashes(store: Store) -> None:
    assert await store.hgetall("h") == {}
    await store.hset("h", "b", b"2")
    await store.hset("h", "a", b"1")
    await store.hset("h", "a", b"one")
    assert await store.hget("h", "a") == b"one"
    assert await store.hgetall("h") == {"a": b"one", "b": b"2"}
    assert await store.hdel("h", "a") is True
    assert await store.hdel("h", "a") is False
    assert await store.hget("h", "missing") is None


async def test_a_hash_with_a_ttl_expires_whole(store: Store) -> None:
    """Each write with a TTL renews the whole hash's; without one a hash stays (memories)."""
    await store.hset("brief", "a", b"1", ttl=0.3)
    await asyncio.sleep(0.2)
    await store.hset("brief", "b", b"2", ttl=0.3)
    await store.hset("kept", "a", b"1")
    await asyncio.sleep(0.2)
    assert await store.hgetall("brief") == {"a": b"1", "b": b"2"}, "the second write renewed it"
    await asyncio.sleep(0.2)
    assert await store.hgetall("brief") == {} and await store.hget("brief", "a") is None
    assert await store.hgetall("kept") == {"a": b"1"}


async def test_counters(store: Store) -> None:
    """Counters add up under concurrent writers, floats too, and expire with their key."""
    assert await store.counters(["c", "d"]) == [{}, {}]
    await asyncio.gather(*(store.incr("c", {"turns": 1, "usd": 0.25}, ttl=60) for _ in range(20)))
    await store.incr("d", {"turns": 2})
    assert await store.counters(["c", "d", "none"]) == [{"turns": 20.0, "usd": 5.0}, {"turns": 2.0}, {}]
    await store.incr("gone", {"x": 1}, ttl=0.05)
    await asyncio.sleep(0.1)
    assert await store.counters(["gone"]) == [{}]
    await store.delete("c")
    assert await store.counters(["c"]) == [{}]


async def test_a_batch_is_its_calls_in_order(store: Store) -> None:
    """A batch does what its ops would do one call after another, in order (a read after a write
    sees it), and answers each as its call would; its TTLs hold."""
    t = key("batch", "t")
    await store.set(key("batch", "old"), b"before")
    answers = await store.batch([
        Incr(key("batch", "c"), {"turns": 1, "usd": 0.25}, 60), Incr(key("batch", "c"), {"turns": 2}),
        Incr(key("batch", "c"), {}), ReadCounters((key("batch", "c"), key("batch", "none"))),
        Get(key("batch", "old")), Set(key("batch", "old"), b"after", 60), Get(key("batch", "old")),
        Append(t, b"one", 60), Append(t, b"two", 60), Set(key("batch", "brief"), b"x", 0.05),
    ])
    assert answers == [None, None, None, [{"turns": 3.0, "usd": 0.25}, {}], b"before", None, b"after", 1, 2, None]
    assert await store.get_list(t) == [b"one", b"two"] and await store.batch([]) == []
    await asyncio.sleep(0.1)
    assert await store.batch([Get(key("batch", "brief")), Get(key("batch", "old"))]) == [None, b"after"]


async def test_a_batch_that_fails_part_way_is_a_store_error_and_leaves_the_store_usable(store: Store) -> None:
    """An op a store refuses inside a batch (a Redis list op on a key holding a string: WRONGTYPE)
    fails the whole batch as StoreError, the error every caller is fail-open for, never a
    client library's own; the next calls, batched or not, go through. Stores that keep each kind
    in its own namespace refuse nothing here and answer in order."""
    from proxy.stores import StoreError

    plain = key("batchfail", "plain")
    await store.set(plain, b"a string")
    ops = [Set(key("batchfail", "a"), b"1"), Append(plain, b"x"), Incr(plain, {"n": 1}),
           ReadCounters((plain,)), Set(key("batchfail", "b"), b"2")]
    try:
        answers = await store.batch(ops)
    except StoreError:  # what went before the refused op is done (a batch is not a transaction on Redis)
        assert await store.get(key("batchfail", "a")) == b"1"
    else:
        assert answers == [None, 1, None, [{"n": 1.0}], None]
    after = await store.batch([Set(key("batchfail", "c"), b"3"), Get(key("batchfail", "c"))])
    assert after == [None, b"3"] and await store.get(plain) == b"a string"


async def test_ping(store: Store) -> None:
    assert await store.ping() is True


def test_keys_are_hash_tagged() -> None:
    """Keys of one conversation share a Redis Cluster hash tag."""
    assert key("seed1", "turn", "abc") == "keel:{seed1}:turn:abc"


async def test_sqlite_shared_by_two_processes_worth_of_connections(tmp_path: Path) -> None:
    """Two SqliteStore instances (as two workers would) see each other's writes on one file."""
    a, b = SqliteStore(str(tmp_path / "shared.db")), SqliteStore(str(tmp_path / "shared.db"))
    await a.set("k", b"from-a")
    assert await b.get("k") == b"from-a"
    assert await b.set_if_absent("anchor", b"b") is True
    assert await a.set_if_absent("anchor", b"a") is False
    await a.close()
    await b.close()


async def test_unreachable_redis_reports_not_ready() -> None:
    store = RedisStore("redis://127.0.0.1:1/0")
    assert await store.ping() is False
    from proxy.stores import StoreError

    with pytest.raises(StoreError):
        await store.get("x")
    await store.close()
