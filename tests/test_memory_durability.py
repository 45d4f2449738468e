"""Memory that survives its store: worker loops that outlive any error, asks that are queued only
for turns the upstream accepted, and never lost when the store is slow or down (retried, then
spooled to a local file and queued in order later, by this process or the next one)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import KEY, ServerThread, eventually, keel_config
from memory_model import MemoryModel

from proxy.memory.supervisor import LoopSupervisor
from proxy.metrics import Metrics
from proxy.stores.sqlite import SqliteStore
from proxy.testing import FaultyStore

OTHER_KEY = "sk-keel-beta"


@pytest.fixture
def memory_model() -> Iterator[tuple[MemoryModel, ServerThread]]:
    model = MemoryModel()
    with ServerThread(model) as server:
        yield model, server


def memory_tenant(upstream: str, model: ServerThread, id: str = "acme", key: str = KEY,
                  **jobs: Any) -> dict[str, Any]:
    return {"id": id, "auth": {"keys": ["sha256:" + hashlib.sha256(key.encode()).hexdigest()]},
            "upstream": {"base_url": upstream, "api_key_env": "KEEL_TEST_UPSTREAM_KEY"},
            "memory": {"enabled": True, "endpoint": model.url + "/v1", "gate": {"audit_rate": 0.0},
                       "jobs": {"max_attempts": 3, "backoff_seconds": 0.05, "max_backoff_seconds": 0.2, **jobs}}}


def say(keel: ServerThread, user: str, text: str, key: str = KEY, history: list[dict[str, Any]] | None = None) -> None:
    history = [] if history is None else history
    history.append({"role": "user", "content": text})
    reply = httpx.post(keel.url + "/v1/chat/completions", timeout=30,
                       headers={"authorization": f"Bearer {key}", "x-keel-user": user},
                       json={"model": "m", "messages": history})
    assert reply.status_code == 200
    history.append(reply.json()["choices"][0]["message"])


def memory(keel: ServerThread, user: str, key: str = KEY) -> dict[str, str]:
    reply = httpx.get(keel.url + "/v1/keel/memory", headers={"authorization": f"Bearer {key}", "x-keel-user": user},
                      timeout=10)
    found: dict[str, str] = reply.json()["entries"] if reply.status_code == 200 else {"status": str(reply.status_code)}
    return found


def test_memory_loops_survive_store_errors_when_settling(standin: ServerThread, memory_model: Any,
                                                         start_keel: Callable[..., ServerThread],
                                                         tmp_path: Path) -> None:
    """The store fails every way of settling a job (complete, retry, bury) for a dozen jobs, more
    than there are loops: no loop ends. Once it answers again the jobs are settled, later asks are
    applied, and /healthz and /metrics show every loop running."""
    _model, server = memory_model
    store = FaultyStore(SqliteStore(str(tmp_path / "k.db")), "ok")
    acme = memory_tenant(standin.url + "/v1", server, max_attempts=1)  # a failed run is buried at once
    beta = memory_tenant(standin.url + "/v1", server, id="beta", key=OTHER_KEY)  # ... or retried
    keel = start_keel(keel_config(acme, beta, store={"url": "sqlite:///:memory:", "job_lease_seconds": 0.5}),
                      store=store)
    store.mode, store.only = "raise", {"complete", "retry", "bury"}
    for n in range(12):
        poison = " POISON" if n % 3 else ""  # the memory model fails: the job is buried (acme) or retried (beta)
        say(keel, f"u{n}", f"please remember that my color is c{n}{poison}", KEY if n % 2 else OTHER_KEY)
    assert eventually(lambda: {"complete", "retry", "bury"} <= set(store.faults) and sum(store.faults.values()) >= 8,
                      15), store.faults
    store.mode = "ok"
    assert eventually(lambda: keel.app.state.keel.store.healthy, 5)  # the breaker the faults opened has closed
    say(keel, "late", "please remember that my city is Porto")
    assert eventually(lambda: memory(keel, "late") == {"city": "Porto"}, 15)
    assert eventually(lambda: all(memory(keel, f"u{n}", KEY if n % 2 else OTHER_KEY) == {"color": f"c{n}"}
                                  for n in range(0, 12, 3)), 15)
    health = httpx.get(keel.url + "/healthz").json()
    assert health["memory"] == {"loops": 4, "running": 4, "restarts": 0}, "no loop ended: none was restarted"
    assert "keel_worker_loops{loop=\"memory\"} 4.0" in httpx.get(keel.url + "/metrics").text


async def test_supervisor_restarts_loops_that_die_or_stall() -> None:
    """A loop that raises is started again; one that stops beating past `stall_seconds` is
    cancelled and started again; both are counted, and the status says how many run."""
    started: list[int] = []

    async def loop(beat: Callable[[], None]) -> None:
        started.append(len(started))
        if len(started) == 1:
            raise RuntimeError("a bug in the loop's own error handling")
        if len(started) == 2:
            await asyncio.sleep(3600)  # stalls: never beats again
        while True:
            beat()
            await asyncio.sleep(0.01)

    metrics = Metrics()
    supervisor = LoopSupervisor("memory", loop, 1, metrics, stall_seconds=0.2, check_seconds=0.05)
    supervisor.start()
    for _ in range(100):
        await asyncio.sleep(0.02)
        if len(started) >= 3 and supervisor.status()["running"] == 1:
            break
    assert supervisor.status() == {"loops": 1, "running": 1, "restarts": 2}
    value = metrics.registry.get_sample_value
    assert value("keel_worker_loop_restarts_total", {"loop": "memory", "reason": "died"}) == 1
    assert value("keel_worker_loop_restarts_total", {"loop": "memory", "reason": "stalled"}) == 1
    assert value("keel_worker_loops", {"loop": "memory"}) == 1
    await supervisor.stop()



# --- a memory ask is queued only for a turn the upstream accepted (finding 5) ---------------------

@pytest.mark.parametrize("status", [401, 503])
def test_a_refused_turn_queues_no_memory_job(standin: ServerThread, memory_model: Any,
                                             start_keel: Callable[..., ServerThread], tmp_path: Path,
                                             status: int) -> None:
    """A passthrough caller whose turn the provider refuses (a bogus key: 401; or a 503) costs
    nothing: no memory job is queued and the memory model never runs. The next accepted ask runs."""
    model, server = memory_model
    byo = {"id": "byo", "default": True, "auth": {"passthrough": True}, "upstream": {"base_url": standin.url + "/v1"},
           "memory": {"enabled": True, "endpoint": server.url + "/v1", "gate": {"audit_rate": 0.0}}}
    db = tmp_path / "k.db"
    keel = start_keel(keel_config(byo, store={"url": f"sqlite:///{db}"}))

    def chat(key: str, text: str) -> int:
        return httpx.post(keel.url + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, json={
            "model": "m", "user": "mallory", "messages": [{"role": "user", "content": text}]}).status_code

    assert chat("sk-bogus", f"please remember that my color is teal [[error {status}]]") == status
    assert chat("sk-good", "please remember that my city is Porto") == 200
    assert eventually(lambda: any("Porto" in text for text in model.runs))
    time.sleep(0.3)
    assert not any("teal" in text for text in model.runs)

    async def pending() -> int:
        store = SqliteStore(str(db))
        try:
            return await store.job_queue().pending()
        finally:
            await store.close()

    assert asyncio.run(pending()) == 0

