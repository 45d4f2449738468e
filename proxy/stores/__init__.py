"""State behind one small protocol: bytes by key with TTL, plus lists and hashes.

`open_store(url)` picks the implementation from the URL: `sqlite:///path` (embedded
default) or `redis://` / `rediss://` (shared by replicas). Callers build keys with
`key()`, which hash-tags the conversation part so Redis Cluster keeps one conversation's
keys on one slot (and `get_many` on them stays a single command).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class StoreError(Exception):
    """The store could not be reached or refused an operation."""


class Store(Protocol):
    async def get(self, key: str) -> bytes | None: ...
    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]: ...
    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None: ...
    async def set_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool: ...
    async def delete(self, key: str) -> None: ...
    async def append(self, key: str, value: bytes, ttl: float | None = None) -> int: ...
    async def get_list(self, key: str) -> list[bytes]: ...
    async def hset(self, key: str, field: str, value: bytes) -> None: ...
    async def hget(self, key: str, field: str) -> bytes | None: ...
    async def hgetall(self, key: str) -> dict[str, bytes]: ...
    async def hdel(self, key: str, field: str) -> bool: ...
    async def ping(self) -> bool: ...
    async def close(self) -> None: ...


def key(tag: str, *parts: str) -> str:
    """`keel:{tag}:part:part`: everything sharing a tag lands on one Redis Cluster slot."""
    return ":".join(("keel", "{" + tag + "}", *parts))


def open_store(url: str) -> Store:
    if url.startswith("sqlite://"):
        from proxy.stores.sqlite import SqliteStore

        return SqliteStore(url.removeprefix("sqlite://").removeprefix("/") or "keel.db")
    from proxy.stores.redis import RedisStore

    return RedisStore(url)
