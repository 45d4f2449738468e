"""Cached answers in the store: bounded by bytes and TTL per tenant, shared by every replica.

Per tenant (keys hash-tagged `answers:<tenant>`, so one `get_many` reads a batch's entries and
the generation together, also on Redis Cluster):

    e:<key>   an entry: a small JSON head (its generation, when it was made, model, usage),
              a newline, then the answer as bytes; expires with its TTL
    gen       the tenant's generation: a purge changes it, and an entry of another generation
              is never served (so a purge is whole the moment it returns, on every replica)
    index     a hash: each entry's key -> "size expires created", what eviction reads
    bytes     a counter of the bytes written since the last sweep corrected it

A write that takes the counter past `stored.max_bytes` sweeps: entries whose TTL ran out leave
the index, and the oldest go until the tenant is under 80% of its bound, and the counter is
set to what is left. Replicas sweep on their own: the bound may be overshot by what they
write meanwhile, never for long. Writes run after the answer (in the background), never on
the request path.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, replace

import orjson

from proxy.config import StoredAnswersConfig
from proxy.jsontext import Json
from proxy.stores import Store, key

log = logging.getLogger("keel.respcache")
FORMAT = 1
SWEEP_TO = 0.8  # a sweep leaves the tenant at this fraction of its bound


@dataclass(frozen=True)
class Entry:
    created: float
    body: bytes  # an answer: the shape's whole JSON body; or one embedding vector's JSON text
    model: str = ""
    usage: Json = None  # the answer's usage as the upstream reported it (None: a stream that carried none)
    conversation: str = ""  # the x-keel-conversation the original answer carried
    tokens: int = 0  # an embedding item's input tokens
    gen: str = ""

    def to_bytes(self) -> bytes:
        head = {"v": FORMAT, "gen": self.gen, "created": self.created, "model": self.model, "usage": self.usage,
                "conversation": self.conversation, "tokens": self.tokens}
        return orjson.dumps(head) + b"\n" + self.body

    @classmethod
    def from_bytes(cls, raw: bytes) -> Entry | None:
        head_text, _, body = raw.partition(b"\n")
        try:
            head = orjson.loads(head_text)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(head, dict) or head.get("v") != FORMAT:
            return None  # another format: a miss, overwritten by the fresh answer
        return cls(float(head["created"]), body, str(head.get("model") or ""), head.get("usage"),
                   str(head.get("conversation") or ""), int(head.get("tokens") or 0), str(head.get("gen") or ""))


class Entries:
    def __init__(self, store: Store, background: Store) -> None:
        self.store = store  # the request path's (its budget): lookups
        self.background = background  # writes, sweeps and purges
        self._sweeping: set[str] = set()

    @staticmethod
    def _key(tenant: str, *parts: str) -> str:
        return key(f"answers:{tenant}", *parts)

    async def get_many(self, tenant: str, digests: list[str]) -> list[Entry | None]:
        """The live entries of the tenant's current generation (raises `StoreError`)."""
        found = await self.store.get_many([self._key(tenant, "gen"), *(self._key(tenant, "e", d) for d in digests)])
        gen = (found[0] or b"").decode()
        entries = [Entry.from_bytes(raw) if raw else None for raw in found[1:]]
        return [e if e is not None and e.gen == gen else None for e in entries]

    async def get(self, tenant: str, digest: str) -> Entry | None:
        return (await self.get_many(tenant, [digest]))[0]

    async def put(self, tenant: str, digest: str, entry: Entry, ttl: float, bounds: StoredAnswersConfig) -> tuple[int, int]:
        """Keep an entry for `ttl` seconds; the bytes written and the bytes a sweep evicted."""
        gen = (await self.background.get(self._key(tenant, "gen")) or b"").decode()
        raw = replace(entry, gen=gen).to_bytes()
        if len(raw) > bounds.max_entry_bytes:
            return 0, 0
        await self.background.set(self._key(tenant, "e", digest), raw, ttl)
        size = len(raw) + len(digest) + 40  # the index field counts too
        meta = f"{size} {time.time() + ttl:.0f} {entry.created:.3f}".encode()
        await self.background.hset(self._key(tenant, "index"), digest, meta)
        await self.background.incr(self._key(tenant, "bytes"), {"bytes": size})
        (count,) = await self.background.counters([self._key(tenant, "bytes")])
        evicted = 0
        if count.get("bytes", 0.0) > bounds.max_bytes and tenant not in self._sweeping:
            self._sweeping.add(tenant)
            try:
                evicted = await self.sweep(tenant, bounds.max_bytes)
            finally:
                self._sweeping.discard(tenant)
        return size, evicted

    async def sweep(self, tenant: str, max_bytes: int) -> int:
        """Drop expired entries from the index and the oldest live ones past the bound; the bytes evicted."""
        index = await self.background.hgetall(self._key(tenant, "index"))
        now = time.time()
        live: list[tuple[float, str, int]] = []
        for digest, meta in index.items():
            try:
                size_text, expires_text, created_text = meta.decode().split()
                size, expires, created = int(size_text), float(expires_text), float(created_text)
            except ValueError:
                size, expires, created = 0, 0.0, 0.0
            if expires <= now:
                await self.background.hdel(self._key(tenant, "index"), digest)
            else:
                live.append((created, digest, size))
        total = sum(size for _, _, size in live)
        evicted = 0
        if total > max_bytes:
            for _, digest, size in sorted(live):
                if total <= max_bytes * SWEEP_TO:
                    break
                await self.background.delete(self._key(tenant, "e", digest))
                await self.background.hdel(self._key(tenant, "index"), digest)
                total -= size
                evicted += size
        (count,) = await self.background.counters([self._key(tenant, "bytes")])
        await self.background.incr(self._key(tenant, "bytes"), {"bytes": total - count.get("bytes", 0.0)})
        log.info("answers_swept", extra={"tenant": tenant, "bytes_left": total, "bytes_evicted": evicted})
        return evicted

    async def purge(self, tenant: str) -> int:
        """Forget every entry of the tenant: none is served from the moment this returns; the number dropped."""
        await self.background.set(self._key(tenant, "gen"), secrets.token_hex(8).encode())
        index = await self.background.hgetall(self._key(tenant, "index"))
        for digests in _batches(list(index), 64):
            await asyncio.gather(*(self.background.delete(self._key(tenant, "e", d)) for d in digests))
        await self.background.delete(self._key(tenant, "index"))
        await self.background.delete(self._key(tenant, "bytes"))
        return len(index)


def _batches(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
