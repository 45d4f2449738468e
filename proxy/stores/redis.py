"""Redis store (redis-py asyncio): shared by replicas, Cluster-safe through hash-tagged keys."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from proxy.stores import StoreError
from proxy.stores.queue import JobQueue
from proxy.stores.redis_queue import RedisJobQueue

T = TypeVar("T")


class RedisStore:
    def __init__(self, url: str) -> None:
        self.url = url
        # Any: redis-py types every reply bytes | str (decode_responses decides at runtime); Keel reads bytes
        self._redis: Any = aioredis.from_url(url, socket_connect_timeout=2.0, socket_timeout=5.0)

    @staticmethod
    async def _run(op: Awaitable[T]) -> T:
        try:
            return await op
        except (RedisError, OSError) as exc:
            raise StoreError(f"redis: {exc}") from exc

    async def get(self, key: str) -> bytes | None:
        return await self._run(self._redis.get(key))

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        return list(await self._run(self._redis.mget(list(keys))))

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        await self._run(self._redis.set(key, value, px=int(ttl * 1000) if ttl else None))

    async def set_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        return bool(await self._run(self._redis.set(key, value, nx=True, px=int(ttl * 1000) if ttl else None)))

    async def delete(self, key: str) -> None:
        await self._run(self._redis.delete(key))

    async def append(self, key: str, value: bytes, ttl: float | None = None) -> int:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.rpush(key, value)
            if ttl:
                pipe.pexpire(key, int(ttl * 1000))
            results = await self._run(pipe.execute())
        return int(results[0])

    async def get_list(self, key: str) -> list[bytes]:
        return list(await self._run(self._redis.lrange(key, 0, -1)))

    async def hset(self, key: str, field: str, value: bytes) -> None:
        await self._run(self._redis.hset(key, field, value))

    async def hget(self, key: str, field: str) -> bytes | None:
        return await self._run(self._redis.hget(key, field))

    async def hgetall(self, key: str) -> dict[str, bytes]:
        raw = await self._run(self._redis.hgetall(key))
        return {k.decode(): v for k, v in sorted(raw.items())}

    async def hdel(self, key: str, field: str) -> bool:
        return bool(await self._run(self._redis.hdel(key, field)))

    async def incr(self, key: str, deltas: Mapping[str, float], ttl: float | None = None) -> None:
        if not deltas:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            for field, delta in deltas.items():
                if float(delta).is_integer():
                    pipe.hincrby(key, field, int(delta))
                else:
                    pipe.hincrbyfloat(key, field, float(delta))
            if ttl:
                pipe.pexpire(key, int(ttl * 1000))
            await self._run(pipe.execute())

    async def counters(self, keys: Sequence[str]) -> list[dict[str, float]]:
        if not keys:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for k in keys:
                pipe.hgetall(k)
            found = await self._run(pipe.execute())
        return [{f.decode(): float(v) for f, v in raw.items()} for raw in found]

    async def ping(self) -> bool:
        """Can the store write? (A replica that turned read-only, or an out-of-memory Redis, reads fine.)"""
        try:
            return bool(await self._redis.set("keel:health", b"1", ex=60))
        except (RedisError, OSError):
            return False

    def job_queue(self) -> JobQueue:
        return RedisJobQueue(self._redis)

    async def close(self) -> None:
        await self._redis.aclose()
