"""Durable after-turn memory jobs: written before the response completes, processed at least
once, idempotent by the chain hash of the user message they judge, finished after a restart."""

from __future__ import annotations

from typing import Any

from proxy import jsontext
from proxy.stores import Store, key

JUDGED_TTL = 90 * 24 * 3600


class MemoryJobs:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._pending = key("memory-jobs", "pending")

    async def enqueue(self, job: dict[str, Any]) -> bool:
        """Queue a job once per user message; False when that message was already queued or judged."""
        if not await self.store.set_if_absent(key("memory-jobs", "judged", job["chain_hash"]), b"1", JUDGED_TTL):
            return False
        await self.store.hset(self._pending, job["chain_hash"], jsontext.dumps(job))
        return True

    async def pending(self) -> list[dict[str, Any]]:
        return [jsontext.loads(raw) for raw in (await self.store.hgetall(self._pending)).values()]

    async def done(self, chain_hash: str) -> None:
        await self.store.hdel(self._pending, chain_hash)
