"""Redis store (redis-py asyncio) on one server, a Cluster or a Sentinel-managed master.

Every multi-key call keeps to one hash tag (`stores.key`), so it is one slot of a Cluster;
appends and counters are Lua scripts (atomic on each topology, no MULTI across a cluster
pipeline). At most `max_connections` calls of one process are in flight at once (a semaphore
in front of the client), so a worker never holds more connections than that per server.
Every failure, the cluster client's own exceptions included, is raised as a `StoreError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

from proxy.stores import Append, Get, Incr, Op, ReadCounters, Set, StoreError, one_by_one
from proxy.stores.queue import DeadLetters, JobQueue
from proxy.stores.redis_client import STORE_ERRORS, connect
from proxy.stores.redis_queue import RedisJobQueue
from proxy.stores.redis_url import RedisTarget, masked_url, parse_redis_url

T = TypeVar("T")
HEALTH_TTL = 60  # seconds a health probe's key lives
HEALTH_KEYS = 4096  # candidate health keys searched for one on each cluster master's slots

APPEND = """
local n = redis.call('RPUSH', KEYS[1], ARGV[1])
if tonumber(ARGV[2]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return n
"""
HSET = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return 1
"""
INCR = """
for i = 2, #ARGV, 2 do
  local delta = ARGV[i + 1]
  if string.find(delta, '[%.eEn]') then
    redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], delta)
  else
    redis.call('HINCRBY', KEYS[1], ARGV[i], delta)
  end
end
if tonumber(ARGV[1]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return 1
"""


def _ms(ttl: float | None) -> int:
    return int(ttl * 1000) if ttl else 0


def _incr_args(deltas: Mapping[str, float], ttl: float | None) -> list[str | int]:
    args: list[str | int] = [_ms(ttl)]
    for field, delta in deltas.items():
        number = float(delta)
        args += [field, int(number) if number.is_integer() else repr(number)]
    return args


class RedisStore:
    def __init__(self, url: str | RedisTarget, max_connections: int = 16, password: str | None = None,
                 sentinel_password: str | None = None, dead_letters: DeadLetters | None = None) -> None:
        target = parse_redis_url(url) if isinstance(url, str) else url
        self.target = target.with_passwords(password)
        self.url = masked_url(url) if isinstance(url, str) else target.topology
        self.topology = target.topology
        self.dead_letters = dead_letters or DeadLetters()
        # Any: redis-py types every reply bytes | str (decode_responses decides at runtime); Keel reads bytes
        self._redis: Any = connect(self.target, max_connections, sentinel_password)
        self._slots = asyncio.Semaphore(max_connections)
        self._append = self._redis.register_script(APPEND)
        self._incr = self._redis.register_script(INCR)
        self._hset = self._redis.register_script(HSET)

    async def _run(self, op: Awaitable[T]) -> T:
        try:
            async with self._slots:
                return await op
        except STORE_ERRORS as exc:
            raise StoreError(f"redis: {exc!r}") from exc
        finally:
            if asyncio.iscoroutine(op):
                op.close()  # never awaited when the wait for a slot was cancelled

    async def get(self, key: str) -> bytes | None:
        return await self._run(self._redis.get(key))

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        if self.topology == "cluster":  # one MGET per slot (keys of one tag: one call)
            return list(await self._run(self._redis.mget_nonatomic(list(keys))))
        return list(await self._run(self._redis.mget(list(keys))))

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        await self._run(self._redis.set(key, value, px=_ms(ttl) or None))

    async def set_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        return bool(await self._run(self._redis.set(key, value, nx=True, px=_ms(ttl) or None)))

    async def delete(self, key: str) -> None:
        await self._run(self._redis.delete(key))

    async def append(self, key: str, value: bytes, ttl: float | None = None) -> int:
        return int(await self._run(self._append(keys=[key], args=[value, _ms(ttl)])))

    async def get_list(self, key: str) -> list[bytes]:
        return list(await self._run(self._redis.lrange(key, 0, -1)))

    async def hset(self, key: str, field: str, value: bytes, ttl: float | None = None) -> None:
        await self._run(self._hset(keys=[key], args=[field, value, _ms(ttl)]))

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
        await self._run(self._incr(keys=[key], args=_incr_args(deltas, ttl)))

    async def batch(self, ops: Sequence[Op]) -> list[object]:
        """One pipeline (a Cluster's: one call after another, each as its own)."""
        if not ops:
            return []
        if self.topology == "cluster":
            return await one_by_one(self, ops)

        async def send() -> list[Any]:  # Any: redis-py's replies
            async with self._redis.pipeline(transaction=False) as pipe:
                for op in ops:
                    if isinstance(op, Get):
                        pipe.get(op.key)
                    elif isinstance(op, Set):
                        pipe.set(op.key, op.value, px=_ms(op.ttl) or None)
                    elif isinstance(op, Append):  # EVAL, not EVALSHA: no SCRIPT EXISTS round trip first
                        pipe.eval(APPEND, 1, op.key, op.value, _ms(op.ttl))
                    elif isinstance(op, Incr):
                        if op.deltas:  # as `incr`: nothing to add, nothing sent
                            pipe.eval(INCR, 1, op.key, *_incr_args(op.deltas, op.ttl))
                    else:
                        for k in op.keys:
                            pipe.hgetall(k)
                return list(await pipe.execute())

        replies = iter(await self._run(send()))
        out: list[object] = []
        for op in ops:
            if isinstance(op, ReadCounters):
                out.append([{f.decode(): float(v) for f, v in next(replies).items()} for _ in op.keys])
            elif isinstance(op, Incr) and not op.deltas:
                out.append(None)
            else:
                reply = next(replies)
                out.append(reply if isinstance(op, Get) else int(reply) if isinstance(op, Append) else None)
        return out

    async def counters(self, keys: Sequence[str]) -> list[dict[str, float]]:
        if not keys:
            return []

        async def read() -> list[Any]:  # Any: redis-py's replies, bytes | str by a runtime flag
            async with self._redis.pipeline(transaction=False) as pipe:
                for k in keys:
                    pipe.hgetall(k)
                return list(await pipe.execute())

        found = await self._run(read())
        return [{f.decode(): float(v) for f, v in raw.items()} for raw in found]

    async def ping(self) -> bool:
        """Can the store write everywhere it keeps keys? (A replica that turned read-only, an
        out-of-memory Redis, or one cluster master of three down reads fine but cannot.)"""
        try:
            if self.topology == "cluster":
                return await self._run(self._ping_cluster())
            return bool(await self._run(self._redis.set("keel:health", b"1", ex=HEALTH_TTL)))
        except StoreError:
            return False

    async def _ping_cluster(self) -> bool:
        """One write on each master: a key whose slot that master serves."""
        await self._redis.initialize()
        masters = {node.name for node in self._redis.get_primaries()}
        keys: dict[str, str] = {}
        for i in range(HEALTH_KEYS):
            name = f"keel:{{health-{i}}}"
            keys.setdefault(self._redis.get_node_from_key(name).name, name)
            if len(keys) == len(masters):
                break
        if set(keys) != masters:
            return False
        written = await asyncio.gather(*(self._redis.set(k, b"1", ex=HEALTH_TTL) for k in keys.values()))
        return all(written)

    def job_queue(self) -> JobQueue:
        return RedisJobQueue(self._redis, self._run, self.dead_letters)

    async def close(self) -> None:
        with contextlib.suppress(*STORE_ERRORS):
            await self._redis.aclose()
