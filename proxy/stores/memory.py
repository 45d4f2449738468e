"""A Store in this process's memory: for tests and for a single short-lived process.

It keeps the same contract as SQLite and Redis (`tests/test_store_contract.py`): values expire
after their TTL, a hash or a counter key expires whole, `set_if_absent` has one winner. Nothing
survives the process and nothing is shared with another replica, so Keel itself does not open
it from a URL; pass it where a store is wanted (`create_app(config, store=MemoryStore())`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

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

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
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

    async def counters(self, keys: Sequence[str]) -> list[dict[str, float]]:
        return [dict(self._counts.live(k) or {}) for k in keys]

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None
