"""The fakes `proxy.testing` ships, used as a user's own tests would: passed to `create_app`,
driven over HTTP in front of the stand-in, their choices read off what the upstream received."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import KEY, ServerThread, eventually, keel_config, tenant, tool

from proxy.defaults import create_upstream
from proxy.stores.sqlite import SqliteStore
from proxy.testing import FakeMemoryGate, FakeRanker, FaultyStore, RecordingUpstream

NAMES = ["get_weather", "create_branch", "create_issue", "list_issues", "search_code", "send_email", "read_file",
         "write_file", "delete_file", "fetch", "convert_time", "maps_geocode"]
PARAMS = {f"p{i}": "string" for i in range(12)}  # every schema well over defer.schema_chars
FEATURES: dict[str, Any] = {"tools": {"enabled": True, "stability": "per_turn"},
                            "memory": {"enabled": True, "gate": {"audit_rate": 0.0}}}


def ask(keel: ServerThread, user: str) -> httpx.Response:
    tools = [tool(n, f"Does {n.replace('_', ' ')}.", **PARAMS) for n in NAMES]
    return httpx.post(keel.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}", "x-keel-user": user},
                      json={"model": "m", "tools": tools, "messages": [{"role": "user", "content": "tell the customer"}]})


def shipped(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools", [])]


def last_turn(standin: ServerThread) -> dict[str, Any]:
    """The newest upstream request of a turn (the memory model's run in the background may come after)."""
    return [r for r in standin.app.state.standin.requests if "set_memory" not in shipped(r)][-1]


def memory_runs(standin: ServerThread) -> int:
    return sum(1 for r in standin.app.state.standin.requests if "set_memory" in shipped(r))


def test_fake_ranker_and_gate_decide_what_the_upstream_gets(standin: ServerThread,
                                                            start_keel: Callable[..., ServerThread]) -> None:
    """The ranker's pick is the one tool shipped beside tool_search; a gate at 0 keeps the memory
    model from running, a gate at 1 runs it."""
    config = keel_config(tenant(standin.url + "/v1", **FEATURES))
    skip = FakeMemoryGate(probability=0.0)
    keel = start_keel(config, ranker=FakeRanker(best=["send_email"]), memory_gate=skip)
    assert ask(keel, "ana").status_code == 200
    assert shipped(last_turn(standin)) == ["send_email", "tool_search"]
    assert eventually(lambda: skip.judged == ["tell the customer"])
    threading.Event().wait(0.2)
    assert memory_runs(standin) == 0

    run = FakeMemoryGate(probability=1.0)
    keel = start_keel(config, ranker=FakeRanker(best=["fetch", "read_file"]), memory_gate=run)
    assert ask(keel, "bo").status_code == 200
    assert shipped(last_turn(standin)) == ["fetch", "read_file", "tool_search"]
    assert eventually(lambda: memory_runs(standin) == 1)
    assert run.judged == ["tell the customer"]


def test_faulty_store_on_demand_and_recording_upstream(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                                       tmp_path: Path) -> None:
    """A store switched to failing: Keel plans the tools afresh, without it (ranked lexically: the
    fake ranker is not asked); switched back, the ranker's pick ships again. The recording
    upstream holds the exact bytes each time."""
    config = keel_config(tenant(standin.url + "/v1", tools={"enabled": True, "stability": "per_turn"}))
    store = FaultyStore(SqliteStore(str(tmp_path / "k.db")), mode="raise")
    upstream = RecordingUpstream(create_upstream(config.server))
    keel = start_keel(config, store=store, upstream=upstream, ranker=FakeRanker(best=["send_email"]))
    assert ask(keel, "ana").status_code == 200
    assert shipped(orjson.loads(upstream.sent[-1].content or b"")) == ["tool_search"]  # nothing ranked lexically
    assert store.calls - store.faults["ping"] == 1  # the turn's one call (the health monitor pings on its own)
    store.mode = "ok"
    assert ask(keel, "ana").status_code == 200
    assert shipped(orjson.loads(upstream.sent[-1].content or b"")) == ["send_email", "tool_search"]
    assert upstream.sent[-1].url == standin.url + "/v1/chat/completions"


async def test_faulty_store_faults_only_the_calls_named_and_can_be_slow(tmp_path: Path) -> None:
    """`only` picks the calls that fail (the rest pass); "slow" delays each call, and it succeeds."""
    import time

    from proxy.stores import StoreError

    store = FaultyStore(SqliteStore(str(tmp_path / "k.db")), mode="raise", only={"complete"})
    queue = store.job_queue()
    await queue.push("t/u", "j1", b"x")
    job = await queue.claim("me", 5)
    assert job is not None
    with pytest.raises(StoreError):
        await queue.complete(job, "me")
    assert store.faults == {"complete": 1} and queue.calls == 1
    store.mode, store.only, store.delay = "slow", None, 0.2
    started = time.monotonic()
    assert await queue.complete(job, "me")
    assert time.monotonic() - started >= 0.2 and store.calls == 1
    await store.close()


def test_keel_runs_on_the_in_memory_store(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """`MemoryStore` is a whole store for `create_app(store=)`: a conversation's state is kept in it
    (its second turn continues the first's conversation) and its memory job queue takes the job."""
    from proxy.stores.memory import MemoryStore

    store = MemoryStore()
    keel = start_keel(keel_config(tenant(standin.url + "/v1", context={"stable": True},
                                         memory={"enabled": True})), store=store)
    headers = {"authorization": f"Bearer {KEY}", "x-keel-user": "ana"}
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    seen = []
    for text in ("I live in Lisbon now", "and what is new?"):
        history.append({"role": "user", "content": text})
        reply = httpx.post(keel.url + "/v1/chat/completions", headers=headers, json={"model": "m", "messages": history})
        assert reply.status_code == 200
        history.append(reply.json()["choices"][0]["message"])
        seen.append(reply.headers["x-keel-conversation"])
    assert seen[0] == seen[1], "the first turn's records, kept in memory, place the second"
    assert eventually(lambda: memory_runs(standin) >= 1), "a memory job went through the in-memory queue"
