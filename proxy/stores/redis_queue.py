"""The job queue on Redis: a ready set, a list per queue, a lease key per queue, Lua for atomicity.

    keel:{mq}:ready        ZSET  queue -> when it is next ready (pushed forward while leased)
    keel:{mq}:q:<queue>    LIST  job ids, oldest first
    keel:{mq}:job:<id>     HASH  queue, payload, attempts, claims, enqueued_at, reason
    keel:{mq}:lease:<q>    STRING the leasing worker, expiring by itself (PX) if that worker dies
    keel:{mq}:dead         LIST  buried job ids

Every state change is one script, so two replicas never lease one queue, and a worker whose
lease has passed can no longer complete, retry or bury the job (another worker owns it now).
All keys share the `{mq}` hash tag: one Redis Cluster slot.
"""

from __future__ import annotations

import time
from typing import Any

from redis.exceptions import RedisError

from proxy.jsontext import Json
from proxy.stores import StoreError
from proxy.stores.queue import DeadJob, Job

PREFIX = "keel:{mq}:"
READY = PREFIX + "ready"
DEAD = PREFIX + "dead"

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
redis.call('LREM', ARGV[1] .. 'q:' .. ARGV[2], 1, ARGV[4])
redis.call('HINCRBY', ARGV[1] .. 'job:' .. ARGV[4], 'attempts', 1)
redis.call('HSET', ARGV[1] .. 'job:' .. ARGV[4], 'reason', ARGV[6])
redis.call('RPUSH', ARGV[1] .. 'dead', ARGV[4])
release(ARGV[1], ARGV[2], ARGV[5])
return 1
"""


class RedisJobQueue:
    def __init__(self, redis: Any) -> None:  # Any: redis-py types replies bytes | str by a runtime flag
        self.redis = redis
        self._scripts = {name: redis.register_script(source) for name, source in (
            ("push", PUSH), ("claim", CLAIM), ("renew", RENEW), ("save", SAVE), ("complete", COMPLETE),
            ("retry", RETRY), ("bury", BURY))}

    async def _script(self, name: str, *args: str | int | float | bytes) -> Json:
        try:
            return await self._scripts[name](keys=[READY], args=[PREFIX, *args])
        except (RedisError, OSError) as exc:
            raise StoreError(f"redis queue: {exc}") from exc

    async def push(self, queue: str, job_id: str, payload: bytes) -> None:
        await self._script("push", queue, job_id, payload, time.time())

    async def claim(self, owner: str, lease: float) -> Job | None:
        found = await self._script("claim", time.time(), owner, int(lease * 1000))
        if not found:
            return None
        queue, job_id, payload, attempts, claims, enqueued = found
        return Job(job_id.decode(), queue.decode(), payload, int(attempts), int(claims), float(enqueued))

    async def renew(self, job: Job, owner: str, lease: float) -> bool:
        return bool(await self._script("renew", job.queue, owner, int(lease * 1000), time.time()))

    async def save(self, job: Job, owner: str, payload: bytes) -> bool:
        return bool(await self._script("save", job.queue, owner, job.id, payload))

    async def complete(self, job: Job, owner: str) -> bool:
        return bool(await self._script("complete", job.queue, owner, job.id, time.time()))

    async def retry(self, job: Job, owner: str, delay: float, reason: str) -> bool:
        return bool(await self._script("retry", job.queue, owner, job.id, time.time(), reason, delay))

    async def bury(self, job: Job, owner: str, reason: str) -> bool:
        return bool(await self._script("bury", job.queue, owner, job.id, time.time(), reason))

    async def dead(self, queue_prefix: str = "", limit: int = 100) -> list[DeadJob]:
        try:
            ids = await self.redis.lrange(DEAD, 0, -1)
            out: list[DeadJob] = []
            for raw_id in ids:
                fields = await self.redis.hmget(PREFIX + "job:" + raw_id.decode(), "queue", "payload", "attempts",
                                                "reason", "enqueued_at")
                if fields[0] is None or not fields[0].decode().startswith(queue_prefix):
                    continue
                out.append(DeadJob(raw_id.decode(), fields[0].decode(), fields[1], int(fields[2]), fields[3].decode(),
                                   float(fields[4])))
                if len(out) >= limit:
                    break
            return out
        except (RedisError, OSError) as exc:
            raise StoreError(f"redis queue: {exc}") from exc

    async def pending(self) -> int:
        try:
            queues = await self.redis.zrange(READY, 0, -1)
            return sum([int(await self.redis.llen(PREFIX + "q:" + q.decode())) for q in queues])
        except (RedisError, OSError) as exc:
            raise StoreError(f"redis queue: {exc}") from exc
