"""Memory as dependable as a database write, through the HTTP interface: two Keel replicas on one
store (a SQLite file, then the real Redis), a memory model that can fail, stall or go down.

Each accepted memory request is applied once, in order per user, or reported as a dead letter.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import KEY, KEY_DIGEST, REDIS_URL, ServerThread, keel_config, tenant
from conftest import eventually as conftest_eventually
from memory_model import MemoryModel

ADMIN = "sk-keel-admin"
ALICE_KEY = "sk-keel-alice"
JOBS = {"max_attempts": 3, "backoff_seconds": 0.05, "max_backoff_seconds": 0.2}


def digest(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture
def memory_model() -> Iterator[tuple[MemoryModel, ServerThread]]:
    model = MemoryModel()
    with ServerThread(model) as server:
        yield model, server


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "redis":
        from conftest import redis_or_skip

        async def flush() -> None:
            store = await redis_or_skip()
            await store.close()

        asyncio.run(flush())
        return REDIS_URL
    return f"sqlite:///{tmp_path / 'shared.db'}"


def replicas(standin: ServerThread, model_server: ServerThread, start_keel: Callable[..., ServerThread],
             store_url: str, jobs: dict[str, Any] | None = None, **store: Any) -> tuple[ServerThread, ServerThread]:
    acme = tenant(standin.url + "/v1", memory={"enabled": True, "endpoint": model_server.url + "/v1",
                                               "jobs": jobs or JOBS, "max_entry_chars": 200})
    acme["auth"] = {"keys": [f"sha256:{KEY_DIGEST}"], "admin_keys": [digest(ADMIN)],
                    "user_keys": [{"key": digest(ALICE_KEY), "user": "alice"}]}
    config = keel_config(acme, store={"url": store_url, "job_lease_seconds": 2, "budget_ms": 2000, **store})
    return start_keel(config), start_keel(config)


def say(replica: ServerThread, user: str, history: list[dict[str, Any]], text: str) -> None:
    history.append({"role": "user", "content": text})
    reply = httpx.post(replica.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}",
                                                                      "x-keel-user": user},
                       json={"model": "m", "messages": history}, timeout=10)
    assert reply.status_code == 200
    history.append(reply.json()["choices"][0]["message"])


def memory(replica: ServerThread, user: str) -> dict[str, str]:
    response = httpx.get(replica.url + "/v1/keel/memory", headers={"authorization": f"Bearer {ADMIN}"},
                         params={"user": user}, timeout=10)
    entries: dict[str, str] = response.json()["entries"]
    return entries


def eventually(check: Callable[[], bool], seconds: float = 20.0) -> bool:
    return conftest_eventually(check, seconds)


def test_a_poison_job_blocks_nothing_but_itself(standin: ServerThread, memory_model: Any,
                                                start_keel: Callable[..., ServerThread], store_url: str) -> None:
    """One job the memory model can never answer, beside 100 good ones (one of them queued after
    it for the same user): every good one is applied; the poison is a dead letter with its reason."""
    _model, server = memory_model
    a, b = replicas(standin, server, start_keel, store_url)
    say(a, "pat", [], "please remember that my POISON is x")
    pat: list[dict[str, Any]] = []
    say(b, "pat", pat, "please remember that my city is Porto")
    for n in range(99):
        say((a, b)[n % 2], f"user{n}", [], f"please remember that my color is c{n}")
    assert eventually(lambda: all(memory(a, f"user{n}") == {"color": f"c{n}"} for n in range(99)))
    assert eventually(lambda: memory(b, "pat") == {"city": "Porto"})
    dead = httpx.get(a.url + "/v1/keel/memory/dead", headers={"authorization": f"Bearer {ADMIN}"}).json()["dead"]
    assert [(d["user"], d["attempts"]) for d in dead] == [("pat", JOBS["max_attempts"])]
    assert "500" in dead[0]["reason"]
    assert httpx.get(a.url + "/v1/keel/memory/dead", headers={"authorization": f"Bearer {KEY}"}).status_code == 403


def test_corrections_land_after_the_facts_they_correct(standin: ServerThread, memory_model: Any,
                                                      start_keel: Callable[..., ServerThread], store_url: str) -> None:
    """Twenty users each state a fact and correct it at once (the two turns on different replicas,
    the memory model answering in random order): every user ends with the correction."""
    model, server = memory_model
    model.delay = 0.02
    a, b = replicas(standin, server, start_keel, store_url)

    def user(n: int) -> None:
        history: list[dict[str, Any]] = []
        say(a, f"u{n}", history, f"please remember that my color is red{n}")
        say(b, f"u{n}", history, f"actually, please remember that my color is blue{n}")

    threads = [threading.Thread(target=user, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert eventually(lambda: all(memory(a, f"u{n}") == {"color": f"blue{n}"} for n in range(20)))
    assert all(count == 1 for count in model.runs.values()), "each job ran once"


def test_memory_model_down_then_back_loses_nothing(standin: ServerThread, memory_model: Any,
                                                   start_keel: Callable[..., ServerThread], store_url: str) -> None:
    """The memory model is down for a while (retries back off meanwhile), then back: every memory
    asked for during the outage is kept."""
    model, server = memory_model
    model.down = True
    a, b = replicas(standin, server, start_keel, store_url,
                    jobs={"max_attempts": 8, "backoff_seconds": 0.3, "max_backoff_seconds": 2})
    for n in range(10):
        say((a, b)[n % 2], f"d{n}", [], f"please remember that my pet is p{n}")

    def retried() -> float:
        return sum(replica.app.state.keel.metrics.registry.get_sample_value(
            "keel_memory_jobs_total", {"tenant": "acme", "outcome": "retried"}) or 0 for replica in (a, b))

    assert eventually(lambda: retried() >= 20), "the outage was met: twice as many retries as jobs (not a fixed 3 s wait)"
    assert all(memory(a, f"d{n}") == {} for n in range(10))
    model.down = False
    assert eventually(lambda: all(memory(a, f"d{n}") == {"pet": f"p{n}"} for n in range(10)))


def test_two_replicas_run_each_job_once(standin: ServerThread, memory_model: Any,
                                        start_keel: Callable[..., ServerThread], store_url: str) -> None:
    """With two replicas claiming from one queue and no replica dying, each job's memory model run
    happens exactly once."""
    model, server = memory_model
    model.delay = 0.01
    a, b = replicas(standin, server, start_keel, store_url)
    order = list(range(40))
    random.Random(7).shuffle(order)
    for n in order:
        say((a, b)[n % 2], f"r{n}", [], f"please remember that my team is t{n}")
    assert eventually(lambda: all(memory(a, f"r{n}") == {"team": f"t{n}"} for n in range(40)))
    assert len(model.runs) == 40 and set(model.runs.values()) == {1}


def test_memory_api_scoping_and_limits(standin: ServerThread, memory_model: Any,
                                       start_keel: Callable[..., ServerThread], store_url: str) -> None:
    """A user key acts only as its user (chat and API); over-size entries are 413; the audit trail
    says what was set and from where; audit and dead letters need an admin key."""
    _, server = memory_model
    a, _ = replicas(standin, server, start_keel, store_url)
    base = a.url + "/v1/keel/memory"
    alice = {"authorization": f"Bearer {ALICE_KEY}"}
    assert httpx.put(base + "/city", json={"value": "Lisbon"}, headers=alice).status_code == 200
    assert httpx.get(base, headers={**alice, "x-keel-user": "bob"}).status_code == 403
    assert httpx.get(base, headers=alice, params={"user": "bob"}).status_code == 403
    chat = httpx.post(a.url + "/v1/chat/completions", headers=alice, json={
        "model": "m", "user": "bob", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 403 and chat.json()["error"]["code"] == "user_mismatch"
    too_big = httpx.put(base + "/bio", json={"value": "x" * 201}, headers=alice)
    assert too_big.status_code == 413 and "200 characters" in too_big.json()["error"]["message"]
    assert httpx.get(base, headers=alice).json()["entries"] == {"city": "Lisbon"}
    trail = httpx.get(base + "/audit", headers={"authorization": f"Bearer {ADMIN}"}, params={"user": "alice"})
    lines = [(line["op"], line["key"], line["source"]) for line in trail.json()["trail"]]
    assert lines == [("set", "city", "api"), ("refused", "bio", "api")]
    assert httpx.get(base + "/audit", headers=alice).status_code == 403


def test_passthrough_users_of_different_keys_have_different_memories(standin: ServerThread, memory_model: Any,
                                                                     start_keel: Callable[..., ServerThread],
                                                                     tmp_path: Path) -> None:
    """Two provider keys both claiming `user: alice`: what one asked to keep never reaches the other."""
    model, server = memory_model
    byo = {"id": "byo", "default": True, "auth": {"passthrough": True}, "upstream": {"base_url": standin.url + "/v1"},
           "memory": {"enabled": True, "endpoint": server.url + "/v1", "jobs": JOBS}, "context": {"stable": True}}
    keel = start_keel(keel_config(byo, store={"url": f"sqlite:///{tmp_path / 'k.db'}"}))

    def chat(key: str, text: str) -> None:
        httpx.post(keel.url + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, json={
            "model": "m", "user": "alice", "messages": [{"role": "user", "content": text}]}).raise_for_status()

    chat("sk-provider-one", "please remember that my passport is X123")
    assert eventually(lambda: sum(model.runs.values()) == 1)
    time.sleep(0.3)
    chat("sk-provider-two", "what do you know about me?")
    assert "X123" not in str(standin.app.state.standin.requests[-1])
    chat("sk-provider-one", "and now?")
    assert "X123" in str(standin.app.state.standin.requests[-1])


def serve(config_path: Path, port: int) -> Any:
    import os
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(config_path), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                return proc
        except httpx.ConnectError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("keel did not start")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_kill_9_runs_a_job_at_most_twice(standin: ServerThread, memory_model: Any, store_url: str,
                                         tmp_path: Path) -> None:
    """Two `keel serve` processes on one store; one is killed with SIGKILL while it works on jobs,
    then started again: every job is applied, none ran more than twice, memory is as asked."""
    import signal

    import yaml

    model, server = memory_model
    model.delay = 0.3
    config = {"store": {"url": store_url, "job_lease_seconds": 1, "budget_ms": 2000},
              "tenants": [{"id": "acme", "auth": {"keys": [f"sha256:{KEY_DIGEST}"], "admin_keys": [digest(ADMIN)]},
                           "upstream": {"base_url": standin.url + "/v1"},
                           "memory": {"enabled": True, "endpoint": server.url + "/v1", "jobs": JOBS}}]}
    path = tmp_path / "keel.yaml"
    path.write_text(yaml.safe_dump(config))
    ports = [free_port(), free_port()]
    procs = [serve(path, port) for port in ports]
    try:
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        for n in range(24):
            httpx.post(urls[n % 2] + "/v1/chat/completions", timeout=10,
                       headers={"authorization": f"Bearer {KEY}", "x-keel-user": f"k{n}"},
                       json={"model": "m", "messages": [{"role": "user",
                                                          "content": f"please remember that my code is z{n}"}]})
        eventually(lambda: sum(model.runs.values()) >= 4, 10)
        procs[0].send_signal(signal.SIGKILL)  # mid-work: its leases are left to expire
        procs[0].wait(5)
        procs[0] = serve(path, ports[0])

        def entries(n: int) -> dict[str, str]:
            response = httpx.get(urls[1] + "/v1/keel/memory", params={"user": f"k{n}"},
                                 headers={"authorization": f"Bearer {ADMIN}"}, timeout=10)
            found: dict[str, str] = response.json()["entries"]
            return found

        assert eventually(lambda: all(entries(n) == {"code": f"z{n}"} for n in range(24)), 60)
        assert len(model.runs) == 24 and max(model.runs.values()) <= 2
    finally:
        for proc in procs:
            proc.kill()
