"""Each user's memory entries, by key, in the store: durable user data, never expired silently.

Every change is written with when and from which job (or the API) it came, and appended to
the user's audit trail, so an operator can answer "why does it think I live in Lisbon?".
Changes made by a memory job are idempotent: the same job applied twice writes the same
entries and the same audit lines (they are keyed by the job), so a job re-run after a lost
lease leaves memory as one run would. Sizes are bounded per entry and per user.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import orjson

from proxy.stores import Hashes, key

AUDIT_KEEP = 1000  # audit lines kept per user (the oldest go first)


class MemoryLimitError(ValueError):
    """An entry or a user's memory would exceed its configured size."""


@dataclass(frozen=True)
class Entry:
    value: str
    updated_at: float = 0.0
    source: str = ""  # "api", or the job (chain hash of the turn) that wrote it

    def to_bytes(self) -> bytes:
        return orjson.dumps({"value": self.value, "updated_at": self.updated_at, "source": self.source})

    @classmethod
    def from_bytes(cls, raw: bytes) -> Entry:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("value"), str):
            return cls(raw.decode(errors="replace"))  # written before entries carried metadata
        return cls(data["value"], float(data.get("updated_at") or 0), str(data.get("source") or ""))


@dataclass(frozen=True)
class AuditLine:
    at: float
    op: str  # set | delete | clear | refused
    key: str
    value: str
    source: str  # "api" or the job id (the chain hash of the turn)
    note: str = ""

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.__dict__)

    @classmethod
    def from_bytes(cls, raw: bytes) -> AuditLine:
        return cls(**orjson.loads(raw))


@dataclass(frozen=True)
class Limits:
    entry_chars: int
    entries: int
    total_chars: int


class MemoryBook:
    def __init__(self, store: Hashes) -> None:
        self.store = store

    @staticmethod
    def _key(tenant: str, user: str) -> str:
        return key(f"memory:{tenant}:{user}", "entries")

    @staticmethod
    def _audit_key(tenant: str, user: str) -> str:
        return key(f"memory:{tenant}:{user}", "audit")

    async def records(self, tenant: str, user: str) -> dict[str, Entry]:
        raw = await self.store.hgetall(self._key(tenant, user))
        return {k: Entry.from_bytes(v) for k, v in raw.items()}

    async def entries(self, tenant: str, user: str) -> dict[str, str]:
        return {k: e.value for k, e in (await self.records(tenant, user)).items()}

    async def shown(self, tenant: str, user: str, chars: int) -> dict[str, str]:
        """What the model is shown: the newest entries first, as many as fit in `chars`."""
        records = await self.records(tenant, user)
        kept: dict[str, str] = {}
        used = 0
        for name, entry in sorted(records.items(), key=lambda kv: (-kv[1].updated_at, kv[0])):
            size = len(name) + len(entry.value) + 4
            if used + size > chars:
                continue
            kept[name] = entry.value
            used += size
        return kept

    def check(self, records: dict[str, Entry], name: str, value: str, limits: Limits) -> None:
        if len(value) > limits.entry_chars:
            raise MemoryLimitError(f"a memory entry may hold at most {limits.entry_chars} characters "
                                   f"(this one has {len(value)})")
        if name not in records and len(records) >= limits.entries:
            raise MemoryLimitError(f"a user may keep at most {limits.entries} memory entries")
        total = sum(len(k) + len(e.value) for k, e in records.items() if k != name) + len(name) + len(value)
        if total > limits.total_chars:
            raise MemoryLimitError(f"a user's memory may hold at most {limits.total_chars} characters in all")

    async def put(self, tenant: str, user: str, name: str, value: str, limits: Limits, source: str = "api",
                  at: float | None = None) -> None:
        """Set one entry (raises `MemoryLimitError` over the limits); audited."""
        records = await self.records(tenant, user)
        at = time.time() if at is None else at
        try:
            self.check(records, name, value, limits)
        except MemoryLimitError as exc:
            await self.audit(tenant, user, AuditLine(at, "refused", name, value[:200], source, str(exc)))
            raise
        await self.store.hset(self._key(tenant, user), name, Entry(value, at, source).to_bytes())
        await self.audit(tenant, user, AuditLine(at, "set", name, value, source))

    async def delete(self, tenant: str, user: str, name: str, source: str = "api", at: float | None = None) -> bool:
        deleted = await self.store.hdel(self._key(tenant, user), name)
        await self.audit(tenant, user, AuditLine(time.time() if at is None else at, "delete", name, "", source))
        return deleted

    async def clear(self, tenant: str, user: str) -> None:
        await self.store.delete(self._key(tenant, user))
        await self.audit(tenant, user, AuditLine(time.time(), "clear", "*", "", "api"))

    async def audit(self, tenant: str, user: str, line: AuditLine) -> None:
        """One audit line, keyed by time, source and key: writing it again (a re-run job) is a no-op."""
        name = f"{line.at:017.6f}:{line.source}:{line.op}:{line.key}"
        audit_key = self._audit_key(tenant, user)
        await self.store.hset(audit_key, name, line.to_bytes())
        lines = await self.store.hgetall(audit_key)
        for oldest in sorted(lines)[: max(0, len(lines) - AUDIT_KEEP)]:
            await self.store.hdel(audit_key, oldest)

    async def trail(self, tenant: str, user: str) -> list[AuditLine]:
        lines = await self.store.hgetall(self._audit_key(tenant, user))
        return [AuditLine.from_bytes(lines[name]) for name in sorted(lines)]
