"""Test doubles for every seam `create_app` takes, for your own tests (and Keel's).

Plain classes, no patching: pass them in and read what they saw.

    FakeRanker        ranker=       the named tools first, fixed scores, needs-tool and confidence
    FakeMemoryGate    memory_gate=  a fixed probability (or a delay, or an error)
    FaultyStore       store=        a real store that fails, hangs or slows on demand ("ok", "raise", "hang", "slow")
    FailingPlanner    planners=     a stage that raises or never finishes
    RecordingUpstream upstream=     the real upstream client, keeping every request it sent
    FakeClock         clock=        time that moves only when the test says (`advance`)

    keel = create_app(config, ranker=FakeRanker(best=["send_email"]), memory_gate=FakeMemoryGate(0.0))
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from proxy.jsontext import JsonObject
from proxy.memory.gate import GateResult
from proxy.stores import Op, Store, StoreError
from proxy.stores.queue import DeadJob, Job, JobQueue
from proxy.tools.catalog import Catalog
from proxy.tools.ranking import Ranking
from proxy.turn import Turn
from proxy.upstream import Upstream, UpstreamResponse

Fault = Literal["ok", "raise", "hang", "slow"]
HANG_SECONDS = 3600.0  # "never": far beyond any budget or deadline Keel gives a call


@dataclass
class FakeRanker:
    """Ranks the named tools first, in the given order, with fixed needs-tool and confidence.

    `scores` default to 10, 9, 8, …; `delay` and `error` stand for a slow or broken backend
    (Keel falls back to its lexical ranking at `select.timeout_ms`). `calls` counts rankings."""

    best: Sequence[str] = ()
    needs_tool: float = 1.0
    confidence: float | None = 1.0
    delay: float = 0.0
    error: Exception | None = None
    scores: Sequence[float] = ()
    calls: int = 0

    async def rank(self, query: str, catalog: Catalog, candidates: Sequence[int], shortlist: int) -> Ranking:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.error:
            raise self.error
        allowed = set(candidates)
        order = tuple(catalog.by_name[n] for n in self.best if n in catalog.by_name and catalog.by_name[n] in allowed)
        scores = tuple(self.scores[: len(order)]) if self.scores else tuple(10.0 - i for i in range(len(order)))
        return Ranking(order, scores, self.needs_tool, self.confidence)


@dataclass
class FakeMemoryGate:
    """Judges every message with a fixed probability of asking to remember something.

    Below the tenant's `memory.gate.threshold` the memory model does not run; a `delay` past
    `gate.timeout_ms`, or an `error`, is a failed gate (the memory model runs as usual).
    `judged` keeps the texts it was asked about."""

    probability: float = 1.0
    category: str | None = None
    updates: bool = False
    delay: float = 0.0
    error: Exception | None = None
    judged: list[str] = field(default_factory=list)

    async def judge(self, text: str, context: Sequence[JsonObject], valid_keys: Sequence[str],
                    memory: dict[str, str]) -> GateResult:
        self.judged.append(text)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.error:
            raise self.error
        return GateResult(self.probability, self.category, self.updates)


class QueueStore(Store, Protocol):
    """A store with its durable job queue (what `create_app` needs for memory jobs)."""

    def job_queue(self) -> JobQueue: ...


class FaultyStore:
    """A real store behind a switch: `mode` "ok" passes every call through, "raise" makes each
    one raise `StoreError`, "hang" makes it never return (a hung Redis) and "slow" makes it take
    `delay` seconds before it goes through (a store that is merely slow); `ping` answers False
    instead of raising or hanging. `only` limits the faults to the calls named (e.g. the job
    queue's "complete", "retry", "bury"); None: every call. Change `mode` and `only` at any time.
    `calls` counts the calls that failed, `faults` counts them by name; the job queue
    (`job_queue()`) follows the same switch and counts its own `calls` too."""

    def __init__(self, inner: QueueStore, mode: Fault = "raise", only: Collection[str] | None = None,
                 delay: float = 0.0) -> None:
        self.inner = inner
        self.mode: Fault = mode
        self.only: Collection[str] | None = only
        self.delay = delay
        self.calls = 0
        self.faults: Counter[str] = Counter()

    def faulty(self, name: str) -> bool:
        return self.mode != "ok" and (self.only is None or name in self.only)

    async def fault(self, name: str) -> None:
        """Whatever the switch says for this call: nothing, a pause, an error, or no return."""
        if not self.faulty(name):
            return
        if self.mode == "slow":
            await asyncio.sleep(self.delay)
            return
        self.calls += 1
        self.faults[name] += 1
        if self.mode == "hang":
            await asyncio.sleep(HANG_SECONDS)
        raise StoreError(f"{name}: injected fault")

    async def get(self, key: str) -> bytes | None:
        await self.fault("get")
        return await self.inner.get(key)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        await self.fault("get_many")
        return await self.inner.get_many(keys)

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        await self.fault("set")
        await self.inner.set(key, value, ttl)

    async def set_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        await self.fault("set_if_absent")
        return await self.inner.set_if_absent(key, value, ttl)

    async def delete(self, key: str) -> None:
        await self.fault("delete")
        await self.inner.delete(key)

    async def append(self, key: str, value: bytes, ttl: float | None = None) -> int:
        await self.fault("append")
        return await self.inner.append(key, value, ttl)

    async def get_list(self, key: str) -> list[bytes]:
        await self.fault("get_list")
        return await self.inner.get_list(key)

    async def hset(self, key: str, field: str, value: bytes, ttl: float | None = None) -> None:
        await self.fault("hset")
        await self.inner.hset(key, field, value, ttl)

    async def hget(self, key: str, field: str) -> bytes | None:
        await self.fault("hget")
        return await self.inner.hget(key, field)

    async def hgetall(self, key: str) -> dict[str, bytes]:
        await self.fault("hgetall")
        return await self.inner.hgetall(key)

    async def hdel(self, key: str, field: str) -> bool:
        await self.fault("hdel")
        return await self.inner.hdel(key, field)

    async def incr(self, key: str, deltas: Mapping[str, float], ttl: float | None = None) -> None:
        await self.fault("incr")
        await self.inner.incr(key, deltas, ttl)

    async def counters(self, keys: Sequence[str]) -> list[dict[str, float]]:
        await self.fault("counters")
        return await self.inner.counters(keys)

    async def batch(self, ops: Sequence[Op]) -> list[object]:
        await self.fault("batch")
        return await self.inner.batch(ops)

    async def ping(self) -> bool:
        try:
            await self.fault("ping")
        except StoreError:
            return False
        return await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()

    def job_queue(self) -> FaultyQueue:
        return FaultyQueue(self.inner.job_queue(), self)


class FaultyQueue:
    """A store's job queue behind its `FaultyStore`'s switch (with a `calls` count of its own)."""

    def __init__(self, inner: JobQueue, switch: FaultyStore) -> None:
        self.inner = inner
        self.switch = switch
        self.calls = 0

    async def _check(self, name: str) -> None:
        if self.switch.faulty(name) and self.switch.mode != "slow":
            self.calls += 1
        await self.switch.fault(name)

    async def push(self, queue: str, job_id: str, payload: bytes) -> None:
        await self._check("push")
        await self.inner.push(queue, job_id, payload)

    async def claim(self, owner: str, lease: float) -> Job | None:
        await self._check("claim")
        return await self.inner.claim(owner, lease)

    async def renew(self, job: Job, owner: str, lease: float) -> bool:
        await self._check("renew")
        return await self.inner.renew(job, owner, lease)

    async def save(self, job: Job, owner: str, payload: bytes) -> bool:
        await self._check("save")
        return await self.inner.save(job, owner, payload)

    async def complete(self, job: Job, owner: str) -> bool:
        await self._check("complete")
        return await self.inner.complete(job, owner)

    async def retry(self, job: Job, owner: str, delay: float, reason: str) -> bool:
        await self._check("retry")
        return await self.inner.retry(job, owner, delay, reason)

    async def bury(self, job: Job, owner: str, reason: str) -> bool:
        await self._check("bury")
        return await self.inner.bury(job, owner, reason)

    async def dead(self, queue_prefix: str = "", limit: int = 100) -> list[DeadJob]:
        await self._check("dead")
        return await self.inner.dead(queue_prefix, limit)

    async def pending(self) -> int:
        await self._check("pending")
        return await self.inner.pending()


class FailingPlanner:
    """A planner that raises ("raise") or never finishes ("hang"): Keel logs it as `stage_failed`,
    counts it under its `name` and sends the turn on as it was."""

    def __init__(self, mode: Literal["raise", "hang"] = "raise", name: str = "failing") -> None:
        self.mode = mode
        self.name = name
        self.after: tuple[str, ...] = ()

    def applies(self, request: Turn) -> bool:
        return True

    async def plan(self, request: Turn) -> Turn:
        if self.mode == "hang":
            await asyncio.sleep(HANG_SECONDS)
        raise RuntimeError("planner bug")


@dataclass(frozen=True)
class SentRequest:
    """One request Keel sent upstream, as it went: the body is the exact bytes."""

    method: str
    url: str
    headers: Mapping[str, str]
    content: bytes | None


class RecordingUpstream:
    """An `Upstream` that passes every request to `inner` (a real client, e.g.
    `proxy.defaults.create_upstream(config.server)`) and keeps it in `sent`, in order."""

    def __init__(self, inner: Upstream) -> None:
        self.inner = inner
        self.sent: list[SentRequest] = []

    async def open(self, method: str, url: str, headers: Mapping[str, str],
                   content: bytes | None) -> UpstreamResponse:
        self.sent.append(SentRequest(method, url, dict(headers), content))
        return await self.inner.open(method, url, headers, content)

    async def aclose(self) -> None:
        await self.inner.aclose()


class FakeClock:
    """A `proxy.clock.Clock` that moves only when the test calls `advance` (wall and monotonic
    time together). `sleep` waits until the clock has been advanced past its end, from any thread:
    Keel may run in a server thread's loop while the test advances the clock from its own."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start
        self._lock = threading.Lock()
        self._sleepers: list[tuple[float, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if seconds <= 0:
                woken.set_result(None)
            else:
                self._sleepers.append((self.now + seconds, loop, woken))
        await woken

    @property
    def sleeping(self) -> int:
        """How many sleeps are waiting for the clock to move."""
        with self._lock:
            return len(self._sleepers)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds
            due = [s for s in self._sleepers if s[0] <= self.now]
            self._sleepers = [s for s in self._sleepers if s[0] > self.now]
        for _, loop, woken in due:
            loop.call_soon_threadsafe(_wake, woken)


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():  # a sleeper cancelled meanwhile
        woken.set_result(None)
