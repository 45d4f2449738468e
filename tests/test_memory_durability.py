"""Memory that survives its store: worker loops that outlive any error, asks that are queued only
for turns the upstream accepted, and never lost when the store is slow or down (retried, then
spooled to a local file and queued in order later, by this process or the next one)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import KEY, REDIS_URL, ServerThread, eventually, keel_config, redis_or_skip
from memory_model import MemoryModel

from proxy.memory.supervisor import LoopSupervisor
from proxy.metrics import Metrics
from proxy.stores.redis import RedisStore
from proxy.stores.sqlite import SqliteStore
from proxy.testing import FaultyStore, QueueStore

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
    loops = {name: health["memory"][name] for name in ("loops", "running", "restarts")}
    assert loops == {"loops": 4, "running": 4, "restarts": 0}, "no loop ended: none was restarted"
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


# --- never lost when the store is slow or down (finding 4) ---------------------------------------

@pytest.fixture(params=["sqlite", "redis"])
def real_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], QueueStore]:
    """A maker of the real store under test (a SQLite file, or the real Redis, flushed once)."""
    if request.param == "redis":
        async def flush() -> None:
            await (await redis_or_skip()).close()

        asyncio.run(flush())
        return lambda: RedisStore(REDIS_URL)
    return lambda: SqliteStore(str(tmp_path / "k.db"))


def fact_and_correction(keel: ServerThread, users: int, prefix: str = "u") -> None:
    """Each user states a fact, then corrects it in the same conversation; users in parallel."""
    def user(n: int) -> None:
        history: list[dict[str, Any]] = []
        say(keel, f"{prefix}{n}", f"please remember that my color is red{n}", history=history)
        say(keel, f"{prefix}{n}", f"actually, please remember that my color is blue{n}", history=history)

    threads = [threading.Thread(target=user, args=(n,)) for n in range(users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def corrected(keel: ServerThread, users: int, prefix: str = "u") -> bool:
    return all(memory(keel, f"{prefix}{n}") == {"color": f"blue{n}"} for n in range(users))


def spooled(directory: Path) -> int:
    return sum(len(path.read_bytes().splitlines()) for path in directory.glob("*.spool"))


def durable_config(standin: ServerThread, model: ServerThread, spool: Path, url: str = "sqlite:///:memory:",
                   **store: Any) -> Any:
    return keel_config(memory_tenant(standin.url + "/v1", model),
                       store={"url": url, "spool_dir": str(spool), "job_lease_seconds": 2, **store})


def test_memory_asks_survive_a_slow_store(standin: ServerThread, memory_model: Any,
                                          start_keel: Callable[..., ServerThread], tmp_path: Path,
                                          real_store: Callable[[], QueueStore]) -> None:
    """Every store call takes 0.3 s, past the request's 250 ms budget (a store that is merely
    slow): every user's fact and its correction are applied, in order, each judged once."""
    model, server = memory_model
    store = FaultyStore(real_store(), "slow", delay=0.3)
    keel = start_keel(durable_config(standin, server, tmp_path / "spool"), store=store)
    fact_and_correction(keel, 4)
    assert eventually(lambda: corrected(keel, 4), 60)
    assert len(model.runs) == 8 and set(model.runs.values()) == {1}


def test_memory_asks_wait_in_the_spool_while_the_store_is_down(standin: ServerThread, memory_model: Any,
                                                               start_keel: Callable[..., ServerThread],
                                                               tmp_path: Path,
                                                               real_store: Callable[[], QueueStore]) -> None:
    """The store refuses every call while users state facts and correct them: the turns are
    answered, the asks wait in a file under store.spool_dir (and /healthz counts them); when the
    store is back they are queued from there in order, every correction after its fact."""
    model, server = memory_model
    store = FaultyStore(real_store(), "raise")
    spool = tmp_path / "spool"
    keel = start_keel(durable_config(standin, server, spool), store=store)
    fact_and_correction(keel, 4)
    assert eventually(lambda: spooled(spool) == 8, 15)
    assert httpx.get(keel.url + "/healthz").json()["memory"]["spooled"] == 8
    assert not model.runs
    store.mode = "ok"
    assert eventually(lambda: corrected(keel, 4), 30)
    assert len(model.runs) == 8 and set(model.runs.values()) == {1}
    assert eventually(lambda: spooled(spool) == 0)


def test_asks_of_a_stopped_keel_are_queued_by_the_next(standin: ServerThread, memory_model: Any,
                                                       start_keel: Callable[..., ServerThread], tmp_path: Path) -> None:
    """Keel stops while the store is down, its asks still being retried: they wait in its spool,
    and the next Keel on the same spool directory queues them, in order."""
    model, server = memory_model
    db, spool = tmp_path / "k.db", tmp_path / "spool"
    config = durable_config(standin, server, spool, f"sqlite:///{db}")
    first = start_keel(config, store=FaultyStore(SqliteStore(str(db)), "raise"))
    fact_and_correction(first, 3)
    first.__exit__()
    assert spooled(spool) >= 6 and not model.runs  # an ask spooled twice at shutdown is queued once (ids)
    second = start_keel(config)
    assert eventually(lambda: corrected(second, 3), 30)
    assert set(model.runs.values()) == {1} and spooled(spool) == 0


def test_the_spool_of_a_killed_keel_is_taken_over(standin: ServerThread, memory_model: Any,
                                                  start_keel: Callable[..., ServerThread], tmp_path: Path) -> None:
    """`keel serve` on a dead Redis spools the asks it accepted, then is killed (SIGKILL): the next
    Keel on the spool directory takes its file over and queues every ask, in order."""
    model, server = memory_model
    spool = tmp_path / "spool"
    config = {"store": {"url": "redis://127.0.0.1:1/0", "spool_dir": str(spool)},
              "tenants": [memory_tenant(standin.url + "/v1", server)]}
    path = tmp_path / "keel.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(path), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
    try:
        url = f"http://127.0.0.1:{port}"
        assert eventually(lambda: up(url), 20)
        for n in range(3):
            history: list[dict[str, Any]] = []
            for text in (f"please remember that my color is red{n}", f"actually, please remember that my color is blue{n}"):
                history.append({"role": "user", "content": text})
                reply = httpx.post(url + "/v1/chat/completions", timeout=10, json={"model": "m", "messages": history},
                                   headers={"authorization": f"Bearer {KEY}", "x-keel-user": f"k{n}"})
                history.append(reply.json()["choices"][0]["message"])
        assert eventually(lambda: spooled(spool) == 6, 20)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    second = start_keel(durable_config(standin, server, spool, f"sqlite:///{tmp_path / 'k.db'}"))
    assert eventually(lambda: corrected(second, 3, "k"), 30)
    assert set(model.runs.values()) == {1} and spooled(spool) == 0


def up(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_correction_never_passes_its_spooled_fact(standin: ServerThread, memory_model: Any,
                                                    start_keel: Callable[..., ServerThread], tmp_path: Path) -> None:
    """A fact waits in the spool (the store took nothing for a while); the store is back and the
    user corrects the fact at once, before the spool is replayed: the correction waits behind
    the fact, so the memory ends with the correction."""
    model, server = memory_model
    store = FaultyStore(SqliteStore(str(tmp_path / "k.db")), "raise", only={"push"})
    spool = tmp_path / "spool"
    keel = start_keel(durable_config(standin, server, spool), store=store)
    history: list[dict[str, Any]] = []
    say(keel, "ana", "please remember that my color is red", history=history)
    assert eventually(lambda: spooled(spool) == 1, 10)
    store.mode = "ok"
    say(keel, "ana", "actually, please remember that my color is blue", history=history)
    assert eventually(lambda: len(model.runs) == 2, 15)
    assert memory(keel, "ana") == {"color": "blue"}


async def test_an_ask_offered_again_is_queued_once(tmp_path: Path) -> None:
    """Offering one ask again (a retry after a timeout that may have queued it, a spool replayed
    after a restart) queues it once; another turn's ask for the same message (a regeneration) is
    not queued; once the worker finished the job, a late replay queues nothing."""
    from proxy.memory.jobs import MemoryJob, MemoryJobs

    store = SqliteStore(str(tmp_path / "k.db"))
    jobs = MemoryJobs(store, store.job_queue())
    ask = MemoryJob("acme", "ana", "h1", [{"role": "user", "content": "remember my color is red"}], time.time())
    assert await jobs.enqueue(ask) and await jobs.enqueue(ask)
    assert await jobs.queue.pending() == 1
    assert not await jobs.enqueue(MemoryJob("acme", "ana", "h1", ask.window, time.time()))
    job = await jobs.queue.claim("w", 30)
    assert job is not None
    await jobs.finished(ask)
    assert await jobs.queue.complete(job, "w")
    assert not await jobs.enqueue(ask) and await jobs.queue.pending() == 0
    await store.close()


def test_a_refused_provider_key_leaves_nothing_stored(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                                      tmp_path: Path) -> None:
    """Requests a provider refuses (a bogus key of a passthrough tenant) store nothing: no anchor,
    no record, no content; once the provider accepts a key, its turns are planned in full."""
    import sqlite3

    byo = {"id": "byo", "default": True, "auth": {"passthrough": True}, "upstream": {"base_url": standin.url + "/v1"},
           "context": {"stable": True}, "tools": {"enabled": True}}
    db = tmp_path / "k.db"
    keel = start_keel(keel_config(byo, store={"url": f"sqlite:///{db}"}))
    system = "\n\n".join(f"## Section {i}\n" + "policy text " * 200 for i in range(50))

    def chat(key: str, text: str) -> httpx.Response:
        return httpx.post(keel.url + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, json={
            "model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": text}]})

    def rows() -> int:
        with sqlite3.connect(db) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM kv").fetchone()[0])

    before = rows()
    for n in range(5):
        assert chat("sk-bogus", f"hello {n} [[error 401]]").status_code == 401
    assert rows() == before, "a refused key stores nothing"
    assert chat("sk-good", "hello").status_code == 200
    assert chat("sk-good", "hello again").status_code == 200
    assert rows() > before, "an accepted key's turns are planned and stored"
