"""State behind small protocols: bytes by key with TTL (`KeyValue`), hashes, counters and lists;
`Store` is all of them, what a backend implements.

`proxy.defaults.open_store(url)` picks the implementation from the URL: `sqlite:///path`
(embedded default) or `redis://` / `rediss://` (shared by replicas). Callers build keys with
`key()`, which hash-tags the conversation part so Redis Cluster keeps one conversation's
keys on one slot (and `get_many` on them stays a single command).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


class StoreError(Exception):
    """The store could not be reached or refused an operation."""


@dataclass(frozen=True)
class Get:
    key: str


@dataclass(frozen=True)
class Set:
    key: str
    value: bytes
    ttl: float | None = None


@dataclass(frozen=True)
class Append:
    key: str
    value: bytes
    ttl: float | None = None


@dataclass(frozen=True)
class Incr:
    key: str
    deltas: Mapping[str, float]
    ttl: float | None = None


@dataclass(frozen=True)
class ReadCounters:
    keys: tuple[str, ...]


Op = Get | Set | Append | Incr | ReadCounters  # what `Store.batch` takes: each as the call of its name


class KeyValue(Protocol):
    """Bytes by key, each with an optional expiry: what most state needs (records, anchors, blobs)."""

    async def get(self, key: str) -> bytes | None: ...
    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]: ...
    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None: ...
    async def set_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool: ...
    async def delete(self, key: str) -> None: ...


class Hashes(Protocol):
    """Named fields under one key, expiring together (memory entries, learned phrases)."""

    async def hset(self, key: str, field: str, value: bytes, ttl: float | None = None) -> None:
        """Set one field; `ttl`: the whole hash expires that long after this write."""
        ...
    async def hget(self, key: str, field: str) -> bytes | None: ...
    async def hgetall(self, key: str) -> dict[str, bytes]: ...
    async def hdel(self, key: str, field: str) -> bool: ...
    async def delete(self, key: str) -> None: ...


class Counters(Protocol):
    """Numbers added to by many replicas at once (the savings ledger, the answer cache's counts)."""

    async def incr(self, key: str, deltas: Mapping[str, float], ttl: float | None = None) -> None:
        """Add each delta to its named counter under `key`, atomically (replicas count together)."""
        ...
    async def counters(self, keys: Sequence[str]) -> list[dict[str, float]]:
        """Every counter under each key (an empty dict for a key with none)."""
        ...


class Lists(Protocol):
    """Values appended under one key, read back in order."""

    async def append(self, key: str, value: bytes, ttl: float | None = None) -> int: ...
    async def get_list(self, key: str) -> list[bytes]: ...


class Store(KeyValue, Hashes, Counters, Lists, Protocol):
    """Every piece, and the store's health: what a backend implements (`stores/sqlite.py`,
    `stores/redis.py`, `stores/memory.py`) and what the guard wraps. A user asks for the smallest
    piece it needs."""

    async def batch(self, ops: Sequence[Op]) -> list[object]:
        """The ops in order, in one round trip (SQLite: one transaction on the store's thread; Redis:
        one pipeline, not atomic across keys), each result as its own call returns it (None for a
        write, bytes | None for Get, int for Append, list of dicts for ReadCounters)."""
        ...

    async def ping(self) -> bool: ...
    async def close(self) -> None: ...


async def one_by_one(store: Store, ops: Sequence[Op]) -> list[object]:
    """`Store.batch` as one call after another: for a store with no cheaper way (in process) or
    whose keys sit on several nodes (a Redis Cluster)."""
    out: list[object] = []
    for op in ops:
        if isinstance(op, Get):
            out.append(await store.get(op.key))
        elif isinstance(op, Append):
            out.append(await store.append(op.key, op.value, op.ttl))
        elif isinstance(op, ReadCounters):
            out.append(await store.counters(op.keys))
        else:
            if isinstance(op, Set):
                await store.set(op.key, op.value, op.ttl)
            elif op.deltas:  # as `incr`: nothing to add, nothing sent
                await store.incr(op.key, op.deltas, op.ttl)
            out.append(None)
    return out


def key(tag: str, *parts: str) -> str:
    """`keel:{tag}:part:part`: everything sharing a tag lands on one Redis Cluster slot."""
    return ":".join(("keel", "{" + tag + "}", *parts))
