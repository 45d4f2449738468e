"""One conversation with tools, context, memory and savings, the same on every store, and through
each Redis topology's failover: real servers (tests/redis_servers.py), Keel and the stand-in over
HTTP, a memory model that writes what it is asked to remember.

Failover: a Cluster master (the one holding the user's memory) or the Sentinel-managed master is
SIGKILLed mid-conversation. Every client call still succeeds (Keel passes through while the store
is away), the memory written before is still there after the replica is promoted, a memory asked
for during the outage is applied once the store is back, and /healthz and keel_store_up say so.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import KEY, KEY_DIGEST, ServerThread, eventually, keel_config, small_catalog, store_url, tenant
from memory_model import MemoryModel
from redis_servers import command

from proxy.standin.app import StandIn, create_standin_app
from proxy.tokens import TokenCounter

ADMIN = "sk-keel-admin"
POLICIES = "\n".join(f"Policy {i}: tickets about product {i} go to team {i % 7}; refunds over {i * 40} dollars need "
                     "a human." for i in range(60))
SYSTEM = "You are the help desk's assistant. Be brief.\n\n" + POLICIES + "\n\nNow: 2026-11-30 10:{second:02d}"
TURNS = ("please remember that my city is Porto", "Open a ticket for the broken printer.",
         "Thanks. What did I say my city was?", "please remember that my team is Blue")


@pytest.fixture
def memory_model() -> Iterator[ServerThread]:
    with ServerThread(MemoryModel()) as server:
        yield server


def keel_on(url: str, standin: ServerThread, model: ServerThread, start_keel: Callable[..., ServerThread],
            **store: Any) -> ServerThread:
    acme = tenant(standin.url + "/v1", tools={"enabled": True}, context={"stable": True},
                  memory={"enabled": True, "endpoint": model.url + "/v1",
                          "jobs": {"backoff_seconds": 0.2, "max_backoff_seconds": 1}})
    acme["auth"] = {"keys": [f"sha256:{KEY_DIGEST}"], "admin_keys": ["sha256:" + hashlib.sha256(ADMIN.encode())
                                                                     .hexdigest()]}
    return start_keel(keel_config(acme, store={"url": url, "job_lease_seconds": 3, **store}))


class Chat:
    """One user's conversation through Keel: the history, and what each reply said."""

    def __init__(self, keel: ServerThread, user: str = "alice") -> None:
        self.keel, self.user = keel, user
        self.history: list[dict[str, Any]] = []
        self.seen: list[tuple[str | None, str | None]] = []

    def say(self, text: str, second: int = 0) -> httpx.Response:
        self.history.append({"role": "user", "content": text})
        body = {"model": "gpt-4o-mini", "user": self.user, "tools": small_catalog(),
                "messages": [{"role": "system", "content": SYSTEM.format(second=second)}, *self.history]}
        reply = httpx.post(self.keel.url + "/v1/chat/completions", json=body, timeout=30,
                           headers={"authorization": f"Bearer {KEY}"})
        assert reply.status_code == 200, reply.text
        self.history.append({k: v for k, v in reply.json()["choices"][0]["message"].items() if v is not None})
        self.seen.append((reply.headers.get("x-keel-tools"), reply.headers.get("x-keel-cache")))
        return reply

    def memory(self) -> dict[str, str]:
        got = httpx.get(self.keel.url + "/v1/keel/memory", params={"user": self.user}, timeout=10,
                        headers={"authorization": f"Bearer {ADMIN}"})
        return dict(got.json()["entries"]) if got.status_code == 200 else {"status": str(got.status_code)}


def health(keel: ServerThread) -> tuple[str, float]:
    store = httpx.get(keel.url + "/healthz", timeout=5).json()["store"]
    up = keel.app.state.keel.metrics.registry.get_sample_value("keel_store_up")
    return store, up


def summary(keel: ServerThread) -> dict[str, Any]:
    got = httpx.get(keel.url + "/keel/api/summary", params={"tenant": "acme", "since": "1h"}, timeout=10,
                    headers={"authorization": f"Bearer {ADMIN}"})
    assert got.status_code == 200, got.text
    return dict(got.json())


def converse(keel: ServerThread) -> dict[str, Any]:
    chat = Chat(keel)
    for n, text in enumerate(TURNS):
        chat.say(text, second=n)
        if "remember" in text:
            wanted = text.rsplit(" ", 3)
            assert eventually(lambda w=wanted: chat.memory().get(w[1]) == w[3], 15), chat.memory()
    assert eventually(lambda: summary(keel)["turns"] == len(TURNS), 10)
    figures = summary(keel)
    return {"seen": chat.seen, "memory": chat.memory(), "turns": figures["turns"],
            "input_tokens": figures["input_tokens"]}


_reference: dict[str, Any] = {}


@pytest.fixture
def reference(tmp_path: Path, token_counter: TokenCounter, memory_model: ServerThread,
              start_keel: Callable[..., ServerThread]) -> dict[str, Any]:
    """The conversation on SQLite (once per test process, before the test's own, in front of a
    stand-in of its own whose prompt cache is cold): what every other store must give."""
    if not _reference:
        with ServerThread(create_standin_app(standin=StandIn(tokens=token_counter))) as standin:
            keel = keel_on(f"sqlite:///{tmp_path / 'reference.db'}", standin, memory_model, start_keel)
            _reference.update(converse(keel))
        assert _reference["memory"] == {"city": "Porto", "team": "Blue"}
        assert all(tools is not None for tools, _ in _reference["seen"]), "every turn planned its tools"
        assert sum(int(cache.split("/")[0]) for _, cache in _reference["seen"]) > 0, _reference["seen"]
    return _reference


@pytest.mark.parametrize("kind", ["redis", "valkey", "cluster", "sentinel"])
def test_a_conversation_is_the_same_on_every_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path,
                                                   standin: ServerThread, memory_model: ServerThread,
                                                   start_keel: Callable[..., ServerThread],
                                                   reference: dict[str, Any]) -> None:
    """Tools shipped, cached tokens, memory and savings figures: as on SQLite, turn for turn."""
    keel = keel_on(store_url(request, kind, tmp_path), standin, memory_model, start_keel)
    assert health(keel) == ("ok", 1.0)
    assert converse(keel) == reference


def cluster_master_of(cluster: Any, pattern: str) -> Any:
    """The live master holding a key that matches `pattern`."""
    for node in cluster.masters():
        if command(node.port, "KEYS", pattern):
            return node
    raise AssertionError(f"no master holds {pattern}")


def drive_through(chat: Chat, outage: Callable[[], bool], seconds: float = 40) -> list[tuple[str, float]]:
    """Keep the conversation going (each call must succeed) until `outage()` says it is over and
    Keel's store is back; what /healthz and keel_store_up said along the way."""
    readings = []
    opened = False
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        chat.say(f"Turn {n} during the failover: list my tickets.", second=n % 60)
        readings.append(health(chat.keel))
        opened = opened or chat.keel.app.state.keel.metrics.registry.get_sample_value("keel_store_breaker_open") == 1
        n += 1
        if outage() and readings[-1] == ("ok", 1.0) and n > 3:
            assert opened, readings  # the turns saw the outage: the breaker opened (passthrough), then closed
            assert chat.keel.app.state.keel.metrics.registry.get_sample_value("keel_store_breaker_open") == 0
            return readings
        time.sleep(0.2)
    raise AssertionError(f"the store did not come back: {readings[-5:]}")


def test_cluster_master_failover(request: pytest.FixtureRequest, tmp_path: Path, standin: ServerThread,
                                 memory_model: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    url = store_url(request, "cluster", tmp_path)
    cluster = request.getfixturevalue("redis_cluster")
    keel = keel_on(url, standin, memory_model, start_keel)
    chat = Chat(keel)
    chat.say(TURNS[0])
    assert eventually(lambda: chat.memory() == {"city": "Porto"}, 15)
    victim = cluster_master_of(cluster, "keel:{memory:*")
    cluster.wait_synced()
    victim.kill()
    chat.say("please remember that my team is Blue")  # asked while the store is away: spooled, then applied
    drive_through(chat, cluster.healthy)
    assert eventually(lambda: chat.memory() == {"city": "Porto", "team": "Blue"}, 20), chat.memory()
    assert chat.say("Open a ticket for the broken printer.").headers.get("x-keel-tools")
    victim.start()  # back, as a replica of the promoted one
    cluster.wait_healthy()


def test_sentinel_master_failover(request: pytest.FixtureRequest, tmp_path: Path, standin: ServerThread,
                                  memory_model: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    url = store_url(request, "sentinel", tmp_path)
    sentinels = request.getfixturevalue("redis_sentinel")
    keel = keel_on(url, standin, memory_model, start_keel)
    chat = Chat(keel)
    chat.say(TURNS[0])
    assert eventually(lambda: chat.memory() == {"city": "Porto"}, 15)
    old = sentinels.current_master()
    sentinels.wait_synced()
    sentinels.server(old).kill()
    chat.say("please remember that my team is Blue")
    drive_through(chat, lambda: sentinels.current_master() != old)
    assert eventually(lambda: chat.memory() == {"city": "Porto", "team": "Blue"}, 20), chat.memory()
    assert chat.say("Open a ticket for the broken printer.").headers.get("x-keel-tools")
    sentinels.server(old).start()  # back, and the sentinels make it the new master's replica
    sentinels.wait_replica_of(sentinels.current_master())


def test_health_tells_the_truth_when_part_of_a_cluster_is_down(
        request: pytest.FixtureRequest, tmp_path: Path, standin: ServerThread, memory_model: ServerThread,
        start_keel: Callable[..., ServerThread]) -> None:
    """A master and its replica down: a third of the slots has no server. /healthz says the store is
    unavailable and keel_store_up is 0 (a single key on a live master would still answer), until
    they are back."""
    url = store_url(request, "cluster", tmp_path)
    cluster = request.getfixturevalue("redis_cluster")
    keel = keel_on(url, standin, memory_model, start_keel)
    assert health(keel) == ("ok", 1.0)
    master = cluster.masters()[0]
    replica = cluster.replica_of(master)
    replica.kill()
    master.kill()
    try:
        assert eventually(lambda: health(keel) == ("unavailable", 0.0), 10), health(keel)
        Chat(keel).say("Open a ticket for the broken printer.")  # passthrough: no client error
    finally:
        master.start()
        replica.start()
    cluster.wait_healthy()
    assert eventually(lambda: health(keel) == ("ok", 1.0), 15), health(keel)
