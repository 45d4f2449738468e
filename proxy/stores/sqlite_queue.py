"""The job queue on SQLite: two tables, one IMMEDIATE transaction per state change.

`queues` holds one row per queue with work (when it is next ready, who leases it until
when); `jobs` holds the jobs in arrival order (`seq`), pending or dead (`died_at`: when it was
buried, so dead letters expire). Every change runs in a write transaction, so several processes
sharing the file never both lease a queue.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from proxy.stores.queue import DeadJob, DeadLetters, Job

T = TypeVar("T")
# How the store runs a function on its connection, on its own thread (`SqliteStore._run`).
# Any: a Callable alias cannot be generic in what the function returns.
Runner = Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]]

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
                                 queue TEXT NOT NULL, payload BLOB NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
                                 claims INTEGER NOT NULL DEFAULT 0, dead INTEGER NOT NULL DEFAULT 0,
                                 reason TEXT NOT NULL DEFAULT '', enqueued_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_queue ON jobs (queue, dead, seq);
CREATE TABLE IF NOT EXISTS queues (queue TEXT PRIMARY KEY, ready_at REAL NOT NULL, owner TEXT,
                                   lease_until REAL);
CREATE INDEX IF NOT EXISTS queues_ready ON queues (ready_at);
"""


def migrate(conn: sqlite3.Connection) -> None:
    """Add what a file written by an older Keel lacks (dead letters' burial time)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
    if "died_at" not in columns:
        try:
            conn.execute("ALTER TABLE jobs ADD COLUMN died_at REAL")
        except sqlite3.OperationalError as exc:  # another process added it first
            if "duplicate column" not in str(exc):
                raise


def _transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return result


def _holds(conn: sqlite3.Connection, job: Job, owner: str) -> bool:
    row = conn.execute("SELECT owner, lease_until FROM queues WHERE queue = ?", (job.queue,)).fetchone()
    return row is not None and row[0] == owner and (row[1] or 0) > time.time()


def _release(conn: sqlite3.Connection, queue: str, delay: float = 0.0) -> None:
    """Free the queue: ready again after `delay`, or gone when it has no pending job left."""
    left = conn.execute("SELECT 1 FROM jobs WHERE queue = ? AND dead = 0 LIMIT 1", (queue,)).fetchone()
    if left:
        conn.execute("UPDATE queues SET owner = NULL, lease_until = NULL, ready_at = ? WHERE queue = ?",
                     (time.time() + delay, queue))
    else:
        conn.execute("DELETE FROM queues WHERE queue = ?", (queue,))


class SqliteJobQueue:
    def __init__(self, run: Runner, dead_letters: DeadLetters | None = None) -> None:
        self.run = run  # its connection has the tables (`SqliteStore` creates them with its own)
        self.dead_letters = dead_letters or DeadLetters()

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call(conn: sqlite3.Connection) -> T:
            return _transaction(conn, fn)

        result: T = await self.run(call)
        return result

    async def push(self, queue: str, job_id: str, payload: bytes) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            now = time.time()
            added = conn.execute("INSERT OR IGNORE INTO jobs (id, queue, payload, enqueued_at) VALUES (?, ?, ?, ?)",
                                 (job_id, queue, payload, now)).rowcount
            if added:
                conn.execute("INSERT OR IGNORE INTO queues (queue, ready_at) VALUES (?, ?)", (queue, now))

        await self._run(fn)

    async def claim(self, owner: str, lease: float) -> Job | None:
        def fn(conn: sqlite3.Connection) -> Job | None:
            now = time.time()
            rows = conn.execute("SELECT queue FROM queues WHERE ready_at <= ? AND (lease_until IS NULL OR "
                                "lease_until <= ?) ORDER BY ready_at LIMIT 16", (now, now)).fetchall()
            for (queue,) in rows:
                head = conn.execute("SELECT id, payload, attempts, claims, enqueued_at FROM jobs WHERE queue = ? "
                                    "AND dead = 0 ORDER BY seq LIMIT 1", (queue,)).fetchone()
                if head is None:
                    conn.execute("DELETE FROM queues WHERE queue = ?", (queue,))
                    continue
                conn.execute("UPDATE queues SET owner = ?, lease_until = ? WHERE queue = ?", (owner, now + lease, queue))
                conn.execute("UPDATE jobs SET claims = claims + 1 WHERE id = ?", (head[0],))
                return Job(head[0], queue, head[1], head[2], head[3] + 1, head[4])
            return None

        return await self._run(fn)

    async def renew(self, job: Job, owner: str, lease: float) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            if not _holds(conn, job, owner):
                return False
            conn.execute("UPDATE queues SET lease_until = ? WHERE queue = ?", (time.time() + lease, job.queue))
            return True

        return await self._run(fn)

    async def save(self, job: Job, owner: str, payload: bytes) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            if not _holds(conn, job, owner):
                return False
            conn.execute("UPDATE jobs SET payload = ? WHERE id = ?", (payload, job.id))
            return True

        return await self._run(fn)

    async def complete(self, job: Job, owner: str) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            if not _holds(conn, job, owner):
                return False
            conn.execute("DELETE FROM jobs WHERE id = ?", (job.id,))
            _release(conn, job.queue)
            return True

        return await self._run(fn)

    async def retry(self, job: Job, owner: str, delay: float, reason: str) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            if not _holds(conn, job, owner):
                return False
            conn.execute("UPDATE jobs SET attempts = attempts + 1, reason = ? WHERE id = ?", (reason, job.id))
            _release(conn, job.queue, delay)
            return True

        return await self._run(fn)

    async def bury(self, job: Job, owner: str, reason: str) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            if not _holds(conn, job, owner):
                return False
            now = time.time()
            conn.execute("UPDATE jobs SET dead = 1, attempts = attempts + 1, reason = ?, died_at = ? WHERE id = ?",
                         (reason, now, job.id))
            conn.execute("DELETE FROM jobs WHERE dead = 1 AND (died_at <= ? OR seq NOT IN "
                         "(SELECT seq FROM jobs WHERE dead = 1 ORDER BY seq DESC LIMIT ?))",
                         (now - self.dead_letters.ttl, self.dead_letters.kept))
            _release(conn, job.queue)
            return True

        return await self._run(fn)

    async def dead(self, queue_prefix: str = "", limit: int = 100) -> list[DeadJob]:
        def fn(conn: sqlite3.Connection) -> list[DeadJob]:
            rows = conn.execute("SELECT id, queue, payload, attempts, reason, enqueued_at FROM jobs WHERE dead = 1 "
                                "AND COALESCE(died_at, 0) > ? AND substr(queue, 1, ?) = ? ORDER BY seq LIMIT ?",
                                (time.time() - self.dead_letters.ttl, len(queue_prefix), queue_prefix,
                                 limit)).fetchall()
            return [DeadJob(*row) for row in rows]

        return await self._run(fn)

    async def pending(self) -> int:
        return int(await self._run(lambda c: c.execute("SELECT COUNT(*) FROM jobs WHERE dead = 0").fetchone()[0]))
