"""A Store in this process's memory, with its job queue: for tests and a single short-lived process.

It keeps the same contracts as SQLite and Redis (`tests/test_store_contract.py`,
`tests/test_queue_contract.py`): values expire after their TTL, a hash or a counter key expires
whole, `set_if_absent` has one winner; the queue is FIFO per queue with leases and bounded dead
letters. Each call runs without awaiting, so it is atomic among the event loop's tasks. Nothing
survives the process and nothing is shared with another replica, so Keel does not open it from a
URL; pass it where a store is wanted (`create_app(config, store=MemoryStore())`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from proxy.stores import Op, one_by_one
from proxy.stores.queue import DeadJob, DeadLetters, Job

V = TypeVar("V")


@dataclass
class _Kept(Generic[V]):
    value: V
    expires: float | None = None


class _Kind(Generic[V]):
    """The keys holding one kind of value, each expiring by `clock`."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.kept: dict[str, _Kept[V]] = {}

    def live(self, key: str) -> V | None:
        found = self.kept.get(key)
        if found is not None and found.expires is not None and found.expires <= self.clock():
            del self.kept[key]
            return None
        return found.value if found is not None else None

    def put(self, key: str, value: V, ttl: float | None) -> None:
        self.kept[key] = _Kept(value, None if ttl is None else self.clock() + ttl)

    def change(self, key: str, empty: Callable[[], V], ttl: float | None) -> V:
        """The live value of `key` (a new one if none) to change in place; `ttl` renews it whole."""
        value = self.live(key)
        if value is None:
            value = empty()
            self.put(key, value, ttl)
        elif ttl is not None:
            self.kept[key].expires = self.clock() + ttl
        return value


class MemoryStore:
    """Every `Store` piece over plain dicts; `clock`: the monotonic seconds expiry is measured in."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, dead_letters: DeadLetters | None = None) -> None:
        self._queue = MemoryJobQueue(clock, dead_letters or DeadLetters())
        self._values: _Kind[bytes] = _Kind(clock)
        self._lists: _Kind[list[bytes]] = _Kind(clock)
        self._hashes: _Kind[dict[str, bytes]] = _Kind(clock)
        self._counts: _Kind[dict[str, float]] = _Kind(clock)

    async def get(self, key: str) -> bytes | None:
        return self._values.live(key)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self._values.live(k) for k in keys]

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        self._values.put(key, value, ttl)

    async def set_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        if self._values.live(key) is not None:
            return False
        self._values.put(key, value, ttl)
        return True

    async def delete(self, key: str) -> None:
        for kind in (self._values, self._lists, self._hashes, self._counts):
            kind.kept.pop(key, None)

    async def append(self, key: str, value: bytes, ttl: float | None = None) -> int:
        items = self._lists.change(key, list, ttl)
        items.append(value)
        return len(items)

    async def get_list(self, key: str) -> list[bytes]:
        return list(self._lists.live(key) or ())

    async def hset(self, key: str, field: str, value: bytes, ttl: float | None = None) -> None:
        self._hashes.change(key, dict, ttl)[field] = value

    async def hget(self, key: str, field: str) -> bytes | None:
        return (self._hashes.live(key) or {}).get(field)

    async def hgetall(self, key: str) -> dict[str, bytes]:
        return dict(self._hashes.live(key) or {})

    async def hdel(self, key: str, field: str) -> bool:
        fields = self._hashes.live(key)
        return fields is not None and fields.pop(field, None) is not None

    async def incr(self, key: str, deltas: Mapping[str, float], ttl: float | None = None) -> None:
        counts = self._counts.change(key, dict, ttl)
        for name, delta in deltas.items():
            counts[name] = counts.get(name, 0.0) + float(delta)

    async def batch(self, ops: Sequence[Op]) -> list[object]:
        return await one_by_one(self, ops)

    async def counters(self, keys: Sequence[str]) -> list[dict[str, float]]:
        return [dict(self._counts.live(k) or {}) for k in keys]

    async def ping(self) -> bool:
        return True

    def job_queue(self) -> MemoryJobQueue:
        return self._queue

    async def close(self) -> None:
        return None


@dataclass
class _Waiting:
    id: str
    payload: bytes
    enqueued_at: float
    attempts: int = 0
    claims: int = 0


class MemoryJobQueue:
    """The `JobQueue` contract over plain lists: one FIFO per queue, one lease per queue."""

    def __init__(self, clock: Callable[[], float], dead_letters: DeadLetters) -> None:
        self.clock, self.bounds = clock, dead_letters
        self._queues: dict[str, list[_Waiting]] = {}  # waiting and running jobs, head first
        self._ready_at: dict[str, float] = {}  # a queue waiting out a retry's delay
        self._leases: dict[str, tuple[str, float]] = {}  # queue -> owner, until
        self._dead: list[tuple[float, DeadJob]] = []  # with their burial time, oldest first

    def _buried(self) -> list[DeadJob]:
        now = self.clock()
        self._dead = [(at, d) for at, d in self._dead if at + self.bounds.ttl > now][-self.bounds.kept:]
        return [d for _, d in self._dead]

    def _head(self, job: Job, owner: str) -> _Waiting | None:
        """The job at its queue's head, while `owner` holds the queue's lease."""
        lease = self._leases.get(job.queue)
        jobs = self._queues.get(job.queue)
        if lease is None or lease[0] != owner or lease[1] <= self.clock() or not jobs or jobs[0].id != job.id:
            return None
        return jobs[0]

    def _free(self, queue: str) -> None:
        self._leases.pop(queue, None)
        if not self._queues.get(queue):
            self._queues.pop(queue, None)
            self._ready_at.pop(queue, None)

    async def push(self, queue: str, job_id: str, payload: bytes) -> None:
        held = any(j.id == job_id for j in self._queues.get(queue, ()))
        if held or any(d.queue == queue and d.id == job_id for d in self._buried()):
            return
        self._queues.setdefault(queue, []).append(_Waiting(job_id, payload, time.time()))

    async def claim(self, owner: str, lease: float) -> Job | None:
        now = self.clock()
        for queue, jobs in self._queues.items():
            held = self._leases.get(queue)
            if not jobs or self._ready_at.get(queue, 0.0) > now or (held is not None and held[1] > now):
                continue
            head = jobs[0]
            head.claims += 1
            self._leases[queue] = (owner, now + lease)
            return Job(head.id, queue, head.payload, head.attempts, head.claims, head.enqueued_at)
        return None

    async def renew(self, job: Job, owner: str, lease: float) -> bool:
        if self._head(job, owner) is None:
            return False
        self._leases[job.queue] = (owner, self.clock() + lease)
        return True

    async def save(self, job: Job, owner: str, payload: bytes) -> bool:
        head = self._head(job, owner)
        if head is not None:
            head.payload = payload
        return head is not None

    async def complete(self, job: Job, owner: str) -> bool:
        if self._head(job, owner) is None:
            return False
        self._queues[job.queue].pop(0)
        self._free(job.queue)
        return True

    async def retry(self, job: Job, owner: str, delay: float, reason: str) -> bool:
        head = self._head(job, owner)
        if head is None:
            return False
        head.attempts += 1
        self._ready_at[job.queue] = self.clock() + delay
        self._free(job.queue)
        return True

    async def bury(self, job: Job, owner: str, reason: str) -> bool:
        head = self._head(job, owner)
        if head is None:
            return False
        self._queues[job.queue].pop(0)
        self._dead.append((self.clock(), DeadJob(head.id, job.queue, head.payload, head.attempts + 1, reason,
                                                 head.enqueued_at)))
        self._buried()
        self._free(job.queue)
        return True

    async def dead(self, queue_prefix: str = "", limit: int = 100) -> list[DeadJob]:
        return [d for d in self._buried() if d.queue.startswith(queue_prefix)][:limit]

    async def pending(self) -> int:
        return sum(len(jobs) for jobs in self._queues.values())
