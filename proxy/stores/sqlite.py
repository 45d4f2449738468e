"""SQLite store: one file, WAL, safe for several worker processes on one host.

sqlite3 calls block, so they run on one dedicated thread per store (a connection is not
shared across threads); WAL lets other processes read while one writes, and a busy timeout
makes concurrent writers wait instead of failing. Every call first checks that the file the
connection holds is still the one at the path: a deleted or replaced file is reopened, every
table (the job queue's too) created again, so writes never vanish with an unlinked inode.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from proxy.stores import Append, Get, Op, ReadCounters, Set, StoreError
from proxy.stores.queue import DeadLetters, JobQueue
from proxy.stores.sqlite_queue import SCHEMA as QUEUE_SCHEMA
from proxy.stores.sqlite_queue import SqliteJobQueue, migrate

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL, expires REAL);
CREATE TABLE IF NOT EXISTS lists (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL,
                                  value BLOB NOT NULL, expires REAL);
CREATE INDEX IF NOT EXISTS lists_key ON lists (key, seq);
CREATE TABLE IF NOT EXISTS hashes (key TEXT NOT NULL, field TEXT NOT NULL, value BLOB NOT NULL, expires REAL,
                                   PRIMARY KEY (key, field));
CREATE TABLE IF NOT EXISTS counters (key TEXT NOT NULL, field TEXT NOT NULL, value REAL NOT NULL, expires REAL,
                                     PRIMARY KEY (key, field));
"""


class SqliteStore:
    def __init__(self, path: str, dead_letters: DeadLetters | None = None) -> None:
        self.path = path
        self.dead_letters = dead_letters or DeadLetters()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="keel-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._inode: int | None = None  # the file the connection has open
        self._ops = 0

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA + QUEUE_SCHEMA)
            migrate(conn)
            if "expires" not in {row[1] for row in conn.execute("PRAGMA table_info(hashes)")}:
                with contextlib.suppress(sqlite3.OperationalError):  # another process added it first
                    conn.execute("ALTER TABLE hashes ADD COLUMN expires REAL")  # written by an older Keel
            self._conn = conn
            self._inode = self._file_inode()
        return self._conn

    def _file_inode(self) -> int | None:
        if self.path == ":memory:":
            return None
        try:
            return os.stat(self.path).st_ino  # once per call: os.stat, not a Path built each time
        except OSError:
            return -1  # gone

    def _check_file(self) -> sqlite3.Connection:
        """A deleted or replaced database file: writes would vanish with the old inode, so
        reconnect (recreating it and its tables); a directory that cannot be written fails.
        A -wal or -shm left beside a deleted file belongs to the old one: SQLite would replay
        it into the new file, so it goes too."""
        if self._conn is not None and self._file_inode() != self._inode:
            self._conn.close()
            self._conn = None
            if self._file_inode() == -1:
                for stale in (Path(self.path + "-wal"), Path(self.path + "-shm")):
                    stale.unlink(missing_ok=True)
        return self._connect()

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            conn = self._check_file()
            self._ops += 1
            if self._ops % 1000 == 0:
                self._purge(conn)
            return fn(conn)

        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, call)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"sqlite: {exc}") from exc

    @staticmethod
    def _purge(conn: sqlite3.Connection) -> None:
        now = time.time()
        conn.execute("DELETE FROM kv WHERE expires IS NOT NULL AND expires <= ?", (now,))
        conn.execute("DELETE FROM lists WHERE expires IS NOT NULL AND expires <= ?", (now,))
        conn.execute("DELETE FROM counters WHERE expires IS NOT NULL AND expires <= ?", (now,))
        conn.execute("DELETE FROM hashes WHERE expires IS NOT NULL AND expires <= ?", (now,))

    @staticmethod
    def _expiry(ttl: float | None) -> float | None:
        return time.time() + ttl if ttl else None

    async def get(self, key: str) -> bytes | None:
        return (await self.get_many([key]))[0]

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        return await self._run(lambda conn: _get_many(conn, keys))

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        expires = self._expiry(ttl)
        await self._run(lambda conn: _set(conn, key, value, expires))

    async def set_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        expires = self._expiry(ttl)

        def fn(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "INSERT INTO kv (key, value, expires) VALUES (?, ?, ?) ON CONFLICT(key) DO UPDATE SET "
                "value = excluded.value, expires = excluded.expires "
                "WHERE kv.expires IS NOT NULL AND kv.expires <= ?",
                (key, value, expires, time.time()),
            )
            return cur.rowcount > 0

        return await self._run(fn)

    async def delete(self, key: str) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM kv WHERE key = ?", (key,))
            conn.execute("DELETE FROM lists WHERE key = ?", (key,))
            conn.execute("DELETE FROM hashes WHERE key = ?", (key,))
            conn.execute("DELETE FROM counters WHERE key = ?", (key,))

        await self._run(fn)

    async def append(self, key: str, value: bytes, ttl: float | None = None) -> int:
        expires = self._expiry(ttl)

        return await self._run(lambda conn: _transaction(conn, lambda: _append(conn, key, value, expires)))

    async def get_list(self, key: str) -> list[bytes]:
        def fn(conn: sqlite3.Connection) -> list[bytes]:
            rows = conn.execute(
                "SELECT value FROM lists WHERE key = ? AND (expires IS NULL OR expires > ?) ORDER BY seq",
                (key, time.time()),
            )
            return [r[0] for r in rows]

        return await self._run(fn)

    async def hset(self, key: str, field: str, value: bytes, ttl: float | None = None) -> None:
        expires = self._expiry(ttl)

        def fn(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("DELETE FROM hashes WHERE key = ? AND expires IS NOT NULL AND expires <= ?",
                             (key, time.time()))
                conn.execute("INSERT OR REPLACE INTO hashes (key, field, value, expires) VALUES (?, ?, ?, ?)",
                             (key, field, value, expires))
                if expires is not None:
                    conn.execute("UPDATE hashes SET expires = ? WHERE key = ?", (expires, key))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        await self._run(fn)

    async def hget(self, key: str, field: str) -> bytes | None:
        def fn(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute("SELECT value FROM hashes WHERE key = ? AND field = ? AND (expires IS NULL OR "
                               "expires > ?)", (key, field, time.time())).fetchone()
            return row[0] if row else None

        return await self._run(fn)

    async def hgetall(self, key: str) -> dict[str, bytes]:
        def fn(conn: sqlite3.Connection) -> dict[str, bytes]:
            return dict(conn.execute("SELECT field, value FROM hashes WHERE key = ? AND (expires IS NULL OR "
                                     "expires > ?) ORDER BY field", (key, time.time())))

        return await self._run(fn)

    async def hdel(self, key: str, field: str) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            return conn.execute("DELETE FROM hashes WHERE key = ? AND field = ?", (key, field)).rowcount > 0

        return await self._run(fn)

    async def incr(self, key: str, deltas: Mapping[str, float], ttl: float | None = None) -> None:
        expires = self._expiry(ttl)
        if deltas:
            await self._run(lambda conn: _transaction(conn, lambda: _incr(conn, key, deltas, expires)))

    async def counters(self, keys: Sequence[str]) -> list[dict[str, float]]:
        return await self._run(lambda conn: _counters(conn, keys)) if keys else []

    async def batch(self, ops: Sequence[Op]) -> list[object]:
        """One hop to the store's thread, one transaction."""
        steps = [self._step(op) for op in ops]

        def fn(conn: sqlite3.Connection) -> list[object]:
            return _transaction(conn, lambda: [step(conn) for step in steps])

        return await self._run(fn) if steps else []

    def _step(self, op: Op) -> Callable[[sqlite3.Connection], object]:
        if isinstance(op, Get):
            return lambda conn: _get_many(conn, [op.key])[0]
        if isinstance(op, ReadCounters):
            return lambda conn: _counters(conn, op.keys)
        expires = self._expiry(op.ttl)
        if isinstance(op, Set):
            return lambda conn: _set(conn, op.key, op.value, expires)
        if isinstance(op, Append):
            return lambda conn: _append(conn, op.key, op.value, expires)
        return lambda conn: _incr(conn, op.key, op.deltas, expires) if op.deltas else None

    async def ping(self) -> bool:
        """Can the store write? (A read would pass on a deleted file or a full disk.)"""

        def probe() -> bool:
            conn = self._check_file()
            conn.execute("INSERT OR REPLACE INTO kv (key, value, expires) VALUES ('keel:health', ?, ?)",
                         (b"1", time.time() + 60))
            return True

        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, probe)
        except (sqlite3.Error, OSError):
            return False

    def job_queue(self) -> JobQueue:
        return SqliteJobQueue(self._run, self.dead_letters)

    async def close(self) -> None:
        def fn() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, fn)
        self._executor.shutdown(wait=True)


def _transaction(conn: sqlite3.Connection, work: Callable[[], T]) -> T:
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = work()
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return result


def _get_many(conn: sqlite3.Connection, keys: Sequence[str]) -> list[bytes | None]:
    found: dict[str, bytes] = {}
    now = time.time()
    for start in range(0, len(keys), 500):
        chunk = list(keys[start : start + 500])
        marks = ",".join("?" * len(chunk))
        rows = conn.execute(
            f"SELECT key, value FROM kv WHERE key IN ({marks}) AND (expires IS NULL OR expires > ?)",
            (*chunk, now),
        )
        found.update(rows)
    return [found.get(k) for k in keys]


def _set(conn: sqlite3.Connection, key: str, value: bytes, expires: float | None) -> None:
    conn.execute("INSERT OR REPLACE INTO kv (key, value, expires) VALUES (?, ?, ?)", (key, value, expires))


def _append(conn: sqlite3.Connection, key: str, value: bytes, expires: float | None) -> int:
    conn.execute("DELETE FROM lists WHERE key = ? AND expires IS NOT NULL AND expires <= ?", (key, time.time()))
    conn.execute("INSERT INTO lists (key, value, expires) VALUES (?, ?, ?)", (key, value, expires))
    if expires is not None:
        conn.execute("UPDATE lists SET expires = ? WHERE key = ?", (expires, key))
    (count,) = conn.execute("SELECT COUNT(*) FROM lists WHERE key = ?", (key,)).fetchone()
    return int(count)


def _incr(conn: sqlite3.Connection, key: str, deltas: Mapping[str, float], expires: float | None) -> None:
    rows = [(key, field, float(delta), expires) for field, delta in deltas.items()]
    conn.execute("DELETE FROM counters WHERE key = ? AND expires IS NOT NULL AND expires <= ?", (key, time.time()))
    conn.executemany("INSERT INTO counters (key, field, value, expires) VALUES (?, ?, ?, ?) "
                     "ON CONFLICT(key, field) DO UPDATE SET value = value + excluded.value, "
                     "expires = excluded.expires", rows)
    if expires is not None:
        conn.execute("UPDATE counters SET expires = ? WHERE key = ?", (expires, key))


def _counters(conn: sqlite3.Connection, keys: Sequence[str]) -> list[dict[str, float]]:
    found: dict[str, dict[str, float]] = {k: {} for k in keys}
    now = time.time()
    for start in range(0, len(keys), 500):
        chunk = list(keys[start : start + 500])
        marks = ",".join("?" * len(chunk))
        for k, field, value in conn.execute(
                f"SELECT key, field, value FROM counters WHERE key IN ({marks}) "
                "AND (expires IS NULL OR expires > ?)", (*chunk, now)):
            found[k][field] = value
    return [found[k] for k in keys]
