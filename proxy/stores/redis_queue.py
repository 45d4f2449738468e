"""The job queue on Redis: per shard a ready set, a list per queue, a lease key per queue, Lua for atomicity.

A user's queue lives in one of `SHARDS` shards (by a CRC of its name), each under its own hash
tag, so a Redis Cluster spreads the memory jobs of every tenant over its masters instead of
one slot carrying them all:

    keel:{mq:<s>}:ready        ZSET  queue -> when it is next ready (pushed forward while leased)
    keel:{mq:<s>}:q:<queue>    LIST  job ids, oldest first
    keel:{mq:<s>}:job:<id>     HASH  queue, payload, attempts, claims, enqueued_at, reason
    keel:{mq:<s>}:lease:<q>    STRING the leasing worker, expiring by itself (PX) if that worker dies
    keel:{mq:<s>}:dead         LIST  buried job ids (each job's hash expires; the oldest past the cap go)

Every state change is one script on one shard, so two replicas never lease one queue, and a
worker whose lease has passed can no longer complete, retry or bury the job (another worker owns
it now). A claim first looks which shards have a ready queue (one pipelined read), then claims
from them starting where this process's last claim stopped, so every shard is served in turn (no
shard's users wait behind another's). Jobs queued by a Keel before
the sharding (`keel:{mq}:`) are still claimed, from a shard of their own.
"""

from __future__ import annotations

import math
import random
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from proxy.jsontext import Json
from proxy.stores.queue import DeadJob, DeadLetters, Job

SHARDS = 16  # fixed: a queue's shard is a function of its name, so this never changes under stored jobs
LEGACY = "keel:{mq}:"  # the single shard of Keels before sharding: claimed from, never pushed to
# The store's call wrapper (a connection slot, StoreError). Any: whatever the wrapped call returns
Runner = Callable[[Awaitable[Any]], Awaitable[Any]]


def shard_prefix(shard: int) -> str:
    return f"keel:{{mq:{shard}}}:"


def prefix_of(queue: str) -> str:
    return shard_prefix(zlib.crc32(queue.encode()) % SHARDS)


PREFIXES = (*(shard_prefix(s) for s in range(SHARDS)), LEGACY)

_HOLDS = "redis.call('GET', ARGV[1] .. 'lease:' .. ARGV[2]) == ARGV[3]"
_RELEASE = """
local function release(prefix, queue, at)
  redis.call('DEL', prefix .. 'lease:' .. queue)
  if redis.call('LLEN', prefix .. 'q:' .. queue) > 0 then
    redis.call('ZADD', prefix .. 'ready', at, queue)
  else
    redis.call('ZREM', prefix .. 'ready', queue)
  end
end
"""
PUSH = """
if redis.call('EXISTS', ARGV[1] .. 'job:' .. ARGV[3]) == 1 then return 0 end
redis.call('HSET', ARGV[1] .. 'job:' .. ARGV[3], 'queue', ARGV[2], 'payload', ARGV[4], 'attempts', 0, 'claims', 0,
           'enqueued_at', ARGV[5], 'reason', '')
redis.call('RPUSH', ARGV[1] .. 'q:' .. ARGV[2], ARGV[3])
redis.call('ZADD', ARGV[1] .. 'ready', 'NX', ARGV[5], ARGV[2])
"""
CLAIM = """
local now = tonumber(ARGV[2])
local queues = redis.call('ZRANGEBYSCORE', ARGV[1] .. 'ready', '-inf', ARGV[2], 'LIMIT', 0, 16)
for _, q in ipairs(queues) do
  local lease = ARGV[1] .. 'lease:' .. q
  if redis.call('EXISTS', lease) == 0 then
    local id = redis.call('LINDEX', ARGV[1] .. 'q:' .. q, 0)
    if not id then
      redis.call('ZREM', ARGV[1] .. 'ready', q)
    else
      redis.call('SET', lease, ARGV[3], 'PX', ARGV[4])
      redis.call('ZADD', ARGV[1] .. 'ready', now + tonumber(ARGV[4]) / 1000, q)
      local job = ARGV[1] .. 'job:' .. id
      local claims = redis.call('HINCRBY', job, 'claims', 1)
      local f = redis.call('HMGET', job, 'payload', 'attempts', 'enqueued_at')
      return {q, id, f[1], f[2], claims, f[3]}
    end
  end
end
return false
"""
RENEW = f"""
if not ({_HOLDS}) then return 0 end
redis.call('PEXPIRE', ARGV[1] .. 'lease:' .. ARGV[2], ARGV[4])
redis.call('ZADD', ARGV[1] .. 'ready', tonumber(ARGV[5]) + tonumber(ARGV[4]) / 1000, ARGV[2])
return 1
"""
SAVE = f"""
if not ({_HOLDS}) then return 0 end
redis.call('HSET', ARGV[1] .. 'job:' .. ARGV[4], 'payload', ARGV[5])
return 1
"""
COMPLETE = _RELEASE + f"""
if not ({_HOLDS}) then return 0 end
redis.call('LREM', ARGV[1] .. 'q:' .. ARGV[2], 1, ARGV[4])
redis.call('DEL', ARGV[1] .. 'job:' .. ARGV[4])
release(ARGV[1], ARGV[2], ARGV[5])
return 1
"""
RETRY = _RELEASE + f"""
if not ({_HOLDS}) then return 0 end
redis.call('HINCRBY', ARGV[1] .. 'job:' .. ARGV[4], 'attempts', 1)
redis.call('HSET', ARGV[1] .. 'job:' .. ARGV[4], 'reason', ARGV[6])
release(ARGV[1], ARGV[2], tonumber(ARGV[5]) + tonumber(ARGV[7]))
return 1
"""
BURY = _RELEASE + f"""
if not ({_HOLDS}) then return 0 end
local job = ARGV[1] .. 'job:' .. ARGV[4]
redis.call('LREM', ARGV[1] .. 'q:' .. ARGV[2], 1, ARGV[4])
redis.call('HINCRBY', job, 'attempts', 1)
redis.call('HSET', job, 'reason', ARGV[6])
redis.call('PEXPIRE', job, ARGV[7])
local dead = ARGV[1] .. 'dead'
redis.call('RPUSH', dead, ARGV[4])
local over = redis.call('LLEN', dead) - tonumber(ARGV[8])
if over > 0 then
  for _, old in ipairs(redis.call('LRANGE', dead, 0, over - 1)) do redis.call('DEL', ARGV[1] .. 'job:' .. old) end
  redis.call('LTRIM', dead, over, -1)
end
release(ARGV[1], ARGV[2], ARGV[5])
return 1
"""


class RedisJobQueue:
    # Any: redis-py types replies bytes | str by a runtime flag
    def __init__(self, redis: Any, run: Runner, dead_letters: DeadLetters) -> None:
        self.redis, self.run = redis, run
        self.dead_ttl_ms = int(dead_letters.ttl * 1000)
        self.dead_kept = math.ceil(dead_letters.kept / SHARDS)  # per shard
        self._cursor = random.randrange(len(PREFIXES))  # where the next claim starts looking
        self._legacy: set[str] = set()  # ids of claimed jobs that were queued in the old single shard
        self._scripts = {name: redis.register_script(source) for name, source in (
            ("push", PUSH), ("claim", CLAIM), ("renew", RENEW), ("save", SAVE), ("complete", COMPLETE),
            ("retry", RETRY), ("bury", BURY))}

    async def _script(self, name: str, prefix: str, *args: str | int | float | bytes) -> Json:
        return await self.run(self._scripts[name](keys=[prefix + "ready"], args=[prefix, *args]))

    async def push(self, queue: str, job_id: str, payload: bytes) -> None:
        await self._script("push", prefix_of(queue), queue, job_id, payload, time.time())

    async def _ready(self, now: float) -> list[bool]:
        """Which shards have a queue ready now: one pipelined look (a round trip per server), so a
        claim runs its script only where there is work, and an idle look costs no script."""
        async def look() -> list[Any]:  # Any: redis-py's replies, bytes | str by a runtime flag
            async with self.redis.pipeline(transaction=False) as pipe:
                for prefix in PREFIXES:
                    pipe.zrangebyscore(prefix + "ready", "-inf", now, start=0, num=1)
                return list(await pipe.execute())

        return [bool(found) for found in await self.run(look())]

    async def claim(self, owner: str, lease: float) -> Job | None:
        start = self._cursor
        ready = await self._ready(time.time())
        for step in range(len(PREFIXES)):
            at = (start + step) % len(PREFIXES)
            if not ready[at]:
                continue
            found = await self._script("claim", PREFIXES[at], time.time(), owner, int(lease * 1000))
            if found:
                self._cursor = (at + 1) % len(PREFIXES)  # the next claim starts at the next shard
                queue, job_id, payload, attempts, claims, enqueued = found
                if PREFIXES[at] == LEGACY:
                    self._legacy.add(job_id.decode())
                return Job(job_id.decode(), queue.decode(), payload, int(attempts), int(claims), float(enqueued))
        return None

    async def renew(self, job: Job, owner: str, lease: float) -> bool:
        return bool(await self._script("renew", self._where(job), job.queue, owner, int(lease * 1000), time.time()))

    async def save(self, job: Job, owner: str, payload: bytes) -> bool:
        return bool(await self._script("save", self._where(job), job.queue, owner, job.id, payload))

    async def complete(self, job: Job, owner: str) -> bool:
        done = bool(await self._script("complete", self._where(job), job.queue, owner, job.id, time.time()))
        self._legacy.discard(job.id)
        return done

    async def retry(self, job: Job, owner: str, delay: float, reason: str) -> bool:
        return bool(await self._script("retry", self._where(job), job.queue, owner, job.id, time.time(), reason,
                                       delay))

    async def bury(self, job: Job, owner: str, reason: str) -> bool:
        buried = bool(await self._script("bury", self._where(job), job.queue, owner, job.id, time.time(), reason,
                                         self.dead_ttl_ms, self.dead_kept))
        self._legacy.discard(job.id)
        return buried

    def _where(self, job: Job) -> str:
        """The shard that holds a claimed job: its queue's, or the old single one it was queued in."""
        return LEGACY if job.id in self._legacy else prefix_of(job.queue)

    async def dead(self, queue_prefix: str = "", limit: int = 100) -> list[DeadJob]:
        found: list[DeadJob] = []
        for prefix in PREFIXES:
            ids = await self.run(self.redis.lrange(prefix + "dead", 0, -1))
            for raw_id in ids:
                fields = await self.run(self.redis.hmget(prefix + "job:" + raw_id.decode(), "queue", "payload",
                                                         "attempts", "reason", "enqueued_at"))
                if fields[0] is None or not fields[0].decode().startswith(queue_prefix):
                    continue  # expired, or another tenant's
                found.append(DeadJob(raw_id.decode(), fields[0].decode(), fields[1], int(fields[2]),
                                     fields[3].decode(), float(fields[4])))
        return sorted(found, key=lambda d: d.enqueued_at)[:limit]

    async def pending(self) -> int:
        total = 0
        for prefix in PREFIXES:
            queues = await self.run(self.redis.zrange(prefix + "ready", 0, -1))
            for q in queues:
                total += int(await self.run(self.redis.llen(prefix + "q:" + q.decode())))
        return total
