"""A small durable job queue: per-queue FIFO, leases, retries with backoff, dead letters.

The guarantees of RQ/arq-style queues, scoped to what after-turn memory needs:
- FIFO per queue (one queue per user): a queue's head job runs before the next one, so a
  correction never lands before the fact it corrects.
- A lease per queue: one worker (in any replica) holds a queue at a time; a worker that dies
  loses its lease when it expires and another worker takes the head job again (at least once;
  the consumer makes a second run harmless). A live worker renews its lease while it works.
- `retry` puts the job back at the head with a backoff on its queue; `bury` moves it to the
  dead letters with the reason and frees the queue. A job that keeps failing blocks only the
  jobs behind it in its own queue, and only until it is buried.

- Dead letters are bounded: each expires `DeadLetters.ttl` after its burial, and past
  `DeadLetters.kept` the oldest go first (a waiting or running job never expires).

Two implementations share one contract suite (tests/test_queue_contract.py): SQLite (one
transaction per claim, safe for several processes on one file) and Redis (Lua scripts over a
ready set, per-queue lists and lease keys, in a fixed number of shards, each under its own hash
tag: a Redis Cluster spreads the shards over its masters, and a user's queue stays on one slot).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class DeadLetters:
    """How long buried jobs are kept (`store.dead_letter_ttl_seconds`) and how many at most
    (`store.dead_letters_max`)."""

    ttl: float = 14 * 24 * 3600
    kept: int = 10_000


@dataclass(frozen=True)
class Job:
    id: str
    queue: str
    payload: bytes
    attempts: int  # failed runs so far
    claims: int  # times a worker took it (more than attempts + 1 means a lease was lost)
    enqueued_at: float


@dataclass(frozen=True)
class DeadJob:
    id: str
    queue: str
    payload: bytes
    attempts: int
    reason: str
    enqueued_at: float


class JobQueue(Protocol):
    async def push(self, queue: str, job_id: str, payload: bytes) -> None:
        """Append a job at the tail of `queue`. An id the queue holds (waiting, running or dead)
        is not added again: pushing again after a failure that may have pushed is harmless."""
        ...

    async def claim(self, owner: str, lease: float) -> Job | None:
        """The head job of some queue that is ready and not leased, now leased to `owner`."""
        ...

    async def renew(self, job: Job, owner: str, lease: float) -> bool:
        """Extend `owner`'s lease on the job's queue; False when the lease was lost."""
        ...

    async def save(self, job: Job, owner: str, payload: bytes) -> bool:
        """Replace the job's payload (progress a rerun should reuse); False when the lease was lost."""
        ...

    async def complete(self, job: Job, owner: str) -> bool:
        """Remove the finished job and free its queue; False when the lease was lost."""
        ...

    async def retry(self, job: Job, owner: str, delay: float, reason: str) -> bool:
        """Count a failed run; the job stays at the head and its queue waits `delay` seconds."""
        ...

    async def bury(self, job: Job, owner: str, reason: str) -> bool:
        """Move the job to the dead letters with `reason` and free its queue."""
        ...

    async def dead(self, queue_prefix: str = "", limit: int = 100) -> list[DeadJob]:
        """Dead letters whose queue starts with `queue_prefix`, oldest first (expired ones gone)."""
        ...

    async def pending(self) -> int:
        """Jobs waiting or running, in all queues."""
        ...
