"""Cached answers in the store, on the real SQLite and Redis: bounded by bytes per tenant (the
oldest go first), expiring with their TTL, gone the moment a purge returns, and one tenant's
never another's; `keel purge-cache` purges a config's store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from conftest import KEY_DIGEST, redis_or_skip

from proxy.cli import main
from proxy.config import StoredAnswersConfig
from proxy.respcache.entries import Entries, Entry
from proxy.stores import Store
from proxy.stores.sqlite import SqliteStore


@pytest.fixture(params=["sqlite", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    made: Store = SqliteStore(str(tmp_path / "answers.db")) if request.param == "sqlite" else await redis_or_skip()
    yield made
    await made.close()


def entry(n: int, size: int = 1000) -> Entry:
    return Entry(time.time() + n / 1000, b"x" * size, "gpt-4o-mini", {"prompt_tokens": n})


async def test_a_tenant_stays_within_its_bytes_oldest_first(store: Store) -> None:
    """Past `max_bytes` a write sweeps: the oldest entries go until the tenant is under 80% of it."""
    entries = Entries(store, store)
    bounds = StoredAnswersConfig(max_bytes=20_000)
    evicted = 0
    for n in range(40):
        evicted += (await entries.put("t", f"k{n}", entry(n), 60, bounds))[1]
    kept = [await entries.get("t", f"k{n}") for n in range(40)]
    assert evicted > 0 and kept[0] is None and kept[-1] is not None
    first = next(n for n, e in enumerate(kept) if e is not None)
    assert all(e is not None for e in kept[first:])  # the newest stay, the oldest went
    index = await store.hgetall(entries._key("t", "index"))
    assert sum(int(v.split()[0]) for v in index.values()) <= 20_000
    assert await store.counters([entries._key("t", "bytes")]) != [{}]


async def test_an_entry_larger_than_the_limit_is_not_kept(store: Store) -> None:
    entries = Entries(store, store)
    assert await entries.put("t", "big", entry(1, 5000), 60, StoredAnswersConfig(max_entry_bytes=4000)) == (0, 0)
    assert await entries.get("t", "big") is None


async def test_entries_expire_with_their_ttl(store: Store) -> None:
    entries = Entries(store, store)
    await entries.put("t", "k", entry(1), 0.5, StoredAnswersConfig())
    assert (await entries.get("t", "k")) is not None
    await asyncio.sleep(0.7)
    assert await entries.get("t", "k") is None


async def test_a_purge_forgets_one_tenant_at_once(store: Store) -> None:
    """Nothing of the purged tenant is served again; another tenant's entries stay; new ones are kept."""
    entries = Entries(store, store)
    for tenant in ("t", "u"):
        await entries.put(tenant, "k", entry(1), 60, StoredAnswersConfig())
    assert await entries.purge("t") == 1
    assert await entries.get("t", "k") is None and await entries.get("u", "k") is not None
    await entries.put("t", "k", entry(2), 60, StoredAnswersConfig())
    assert await entries.get("t", "k") is not None


async def test_an_entry_written_before_a_purge_is_never_served_after_it(store: Store) -> None:
    """The generation, not the index, decides: an entry the index missed is still purged."""
    entries = Entries(store, store)
    await entries.put("t", "k", entry(1), 60, StoredAnswersConfig())
    await store.delete(entries._key("t", "index"))  # as if its index write had been lost
    await entries.purge("t")
    assert await entries.get("t", "k") is None


def test_keel_purge_cache_purges_the_configs_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "keel.db"
    config = {"store": {"url": f"sqlite:///{db}"}, "tenants": [
        {"id": "acme", "auth": {"keys": [f"sha256:{KEY_DIGEST}"]}, "upstream": {"base_url": "http://127.0.0.1:9/v1"}}]}
    (tmp_path / "keel.yaml").write_text(yaml.safe_dump(config))

    async def put_and_read(purged: bool) -> None:
        store = SqliteStore(str(db))
        entries = Entries(store, store)
        if not purged:
            await entries.put("acme", "k", entry(1), 60, StoredAnswersConfig())
        assert (await entries.get("acme", "k") is None) is purged
        await store.close()

    asyncio.run(put_and_read(False))
    assert main(["purge-cache", "--config", str(tmp_path / "keel.yaml")]) == 0
    assert "purged 1 cached answers" in capsys.readouterr().out
    asyncio.run(put_and_read(True))
    assert main(["purge-cache", "--config", str(tmp_path / "keel.yaml"), "--tenant", "nobody"]) == 2
