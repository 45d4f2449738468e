"""Durable after-turn memory jobs: one per new user message, on a per-user FIFO queue.

Queued once the upstream accepted the turn (deduplicated by the chain hash of the message
they judge, so a regeneration is not judged again), claimed under a lease by one worker in
any replica, retried with backoff, and buried with the reason when they keep failing. The
memory model's answer is saved on the job before it is applied, so a job re-run after a
lost lease applies the same operations instead of asking the model again.

Queueing may be tried again and again (retries, a spool replayed after a restart): the
message's marker names the job's `ticket` until the worker has finished the job, a push of
an id the queue holds does nothing, and a finished job's marker says so, so the same ask is
queued once and run once however often it is offered.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace

from proxy import jsontext
from proxy.jsontext import JsonObject
from proxy.stores import KeyValue, key
from proxy.stores.queue import DeadJob, JobQueue

JUDGED_TTL = 30 * 24 * 3600  # `store.job_marker_ttl_seconds`'s default
FINISHED = b"finished"


@dataclass(frozen=True)
class MemoryOp:
    op: str  # set | delete
    key: str
    value: str = ""


@dataclass(frozen=True)
class MemoryJob:
    tenant: str
    owner: str  # whose memory: the end user (under the caller's credential for passthrough tenants)
    chain_hash: str  # the judged user message: the job's id
    window: list[JsonObject]  # the newest user message and the few before it
    queued_at: float
    ops: list[MemoryOp] | None = None  # the memory model's answer, once it has run
    gate: str = ""  # the gate's decision, once made: run | skip | failed
    extra: JsonObject = field(default_factory=dict)
    ticket: str = field(default_factory=lambda: uuid.uuid4().hex)  # this ask, among the turns that judge one message

    @property
    def queue(self) -> str:
        return f"{self.tenant}/{self.owner}"

    def with_ops(self, ops: list[MemoryOp], gate: str) -> MemoryJob:
        return replace(self, ops=ops, gate=gate)

    def to_bytes(self) -> bytes:
        data = {"tenant": self.tenant, "owner": self.owner, "chain_hash": self.chain_hash, "window": self.window,
                "queued_at": self.queued_at, "gate": self.gate, "extra": self.extra, "ticket": self.ticket,
                "ops": None if self.ops is None else [[o.op, o.key, o.value] for o in self.ops]}
        return jsontext.dumps(data)

    @classmethod
    def from_bytes(cls, raw: bytes) -> MemoryJob:
        data = jsontext.loads(raw)
        ops = data.get("ops")
        return cls(str(data["tenant"]), str(data["owner"]), str(data["chain_hash"]), list(data.get("window") or []),
                   float(data.get("queued_at") or 0), None if ops is None else [MemoryOp(*o) for o in ops],
                   str(data.get("gate") or ""), dict(data.get("extra") or {}), str(data.get("ticket") or ""))


class MemoryJobs:
    def __init__(self, store: KeyValue, queue: JobQueue, marker_ttl: float = JUDGED_TTL) -> None:
        self.store = store
        self.queue = queue
        self.marker_ttl = marker_ttl

    @staticmethod
    def _marker(chain_hash: str) -> str:
        # tagged by the message: markers spread over a cluster's slots (one tag for all was one hot slot)
        return key(f"judged:{chain_hash}")

    async def enqueue(self, job: MemoryJob) -> bool:
        """Queue a job once per user message; False when another turn's job judges that message
        (a regeneration), or this one was finished already. Safe to call again after a failure."""
        judged, mine = self._marker(job.chain_hash), b"ticket:" + job.ticket.encode()
        if not await self.store.set_if_absent(judged, mine, self.marker_ttl) and await self.store.get(judged) != mine:
            return False
        await self.queue.push(job.queue, job.chain_hash, job.to_bytes())
        return True

    async def finished(self, job: MemoryJob) -> None:
        """Mark the message judged for good before its job leaves the queue: the same ask
        offered again (a replayed spool) is not queued again."""
        await self.store.set(self._marker(job.chain_hash), FINISHED, self.marker_ttl)

    async def dead(self, tenant: str, limit: int = 100) -> list[DeadJob]:
        return await self.queue.dead(f"{tenant}/", limit)
