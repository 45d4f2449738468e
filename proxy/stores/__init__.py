"""State behind small protocols: bytes by key with TTL (`KeyValue`), hashes, counters and lists;
`Store` is all of them, what a backend implements.

`proxy.defaults.open_store(url)` picks the implementation from the URL: `sqlite:///path`
(embedded default) or `redis://` / `rediss://` (shared by replicas). Callers build keys with
`key()`, which hash-tags the conversation part so Redis Cluster keeps one conversation's
keys on one slot (and `get_many` on them stays a single command).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class StoreError(Exception):
    """The store could not be reached or refused an operation."""


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

    async def ping(self) -> bool: ...
    async def close(self) -> None: ...


def key(tag: str, *parts: str) -> str:
    """`keel:{tag}:part:part`: everything sharing a tag lands on one Redis Cluster slot."""
    return ":".join(("keel", "{" + tag + "}", *parts))
