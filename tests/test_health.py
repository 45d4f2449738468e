"""Health that tells the truth and never waits: a deleted SQLite file is reopened (tables and
all), /healthz answers from the last reading of a background monitor, and a stopped or broken
memory worker shows in /healthz and /metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from conftest import KEY, ServerThread, eventually, keel_config, tenant

from proxy.stores.sqlite import SqliteStore
from proxy.testing import FaultyStore

AUTH = {"authorization": f"Bearer {KEY}"}


def memory_on(url: str, **memory: Any) -> dict[str, Any]:
    return tenant(url, memory={"enabled": True, "gate": {"audit_rate": 0.0}, **memory})


def remember(keel: ServerThread, user: str, text: str) -> None:
    reply = httpx.post(keel.url + "/v1/chat/completions", headers={**AUTH, "x-keel-user": user}, timeout=10,
                       json={"model": "m", "messages": [{"role": "user", "content": text}]})
    assert reply.status_code == 200


def entries(keel: ServerThread, user: str) -> dict[str, str]:
    reply = httpx.get(keel.url + "/v1/keel/memory", headers={**AUTH, "x-keel-user": user}, timeout=10)
    found: dict[str, str] = reply.json().get("entries", {}) if reply.status_code == 200 else {"status": reply.text}
    return found


def test_a_deleted_sqlite_file_is_reopened_with_its_tables(standin: ServerThread,
                                                         start_keel: Callable[..., ServerThread],
                                                         tmp_path: Path) -> None:
    """The database file (with its -wal and -shm) deleted under a running Keel: the next writes land
    in a new file, the memory queue's tables are there again, memory jobs run, the memory API
    answers and /healthz says the store is ok because it is."""
    db = tmp_path / "keel.db"
    keel = start_keel(keel_config(memory_on(standin.url + "/v1"), store={"url": f"sqlite:///{db}"}))
    assert httpx.put(keel.url + "/v1/keel/memory/city", json={"value": "Lisbon"},
                     headers={**AUTH, "x-keel-user": "ana"}).status_code == 200
    for path in tmp_path.glob("keel.db*"):
        path.unlink()
    assert httpx.put(keel.url + "/v1/keel/memory/city", json={"value": "Porto"},
                     headers={**AUTH, "x-keel-user": "ana"}).status_code == 200

    async def on_disk() -> dict[str, bytes]:
        fresh = SqliteStore(str(db))
        try:
            return await fresh.hgetall("keel:{memory:acme:ana}:entries")
        finally:
            await fresh.close()

    assert list(asyncio.run(on_disk())) == ["city"], "the write landed in the file on disk, not the deleted one"
    assert httpx.get(keel.url + "/healthz").json()["store"] == "ok"
    remember(keel, "bo", "please remember that my editor is helix")
    assert eventually(lambda: entries(keel, "bo") == {"editor": "my editor is helix"}, 10)
    assert entries(keel, "ana") == {"city": "Porto"}
    assert httpx.get(keel.url + "/healthz").json()["store"] == "ok"


def test_healthz_never_waits_on_a_hung_store(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                            tmp_path: Path) -> None:
    """A store that stops answering (a SIGSTOPped Redis): /healthz keeps answering at once, from the
    monitor's last reading, and soon says the store is unavailable; when it answers again, ok."""
    store = FaultyStore(SqliteStore(str(tmp_path / "k.db")), "ok")
    keel = start_keel(keel_config(tenant(standin.url + "/v1")), store=store)
    assert httpx.get(keel.url + "/healthz").json()["store"] == "ok"
    store.mode = "hang"
    took = []
    for _ in range(8):
        started = time.monotonic()
        assert httpx.get(keel.url + "/healthz", timeout=5).status_code == 200
        took.append(time.monotonic() - started)
        time.sleep(0.25)
    assert max(took) < 0.2, took
    assert eventually(lambda: httpx.get(keel.url + "/healthz").json()["store"] == "unavailable", 5)
    assert "keel_store_up 0.0" in httpx.get(keel.url + "/metrics").text
    store.mode = "ok"
    assert eventually(lambda: httpx.get(keel.url + "/healthz").json()["store"] == "ok", 5)
