"""After the turn: the gate judges the newest user message; only a yes runs the memory model.

`MemoryPlanner` (`proxy/memory/planner.py`) makes a durable job for each new user message,
queued by `MemoryIntake` once the upstream accepts the turn; `MemoryWorker` claims jobs from
the per-user FIFO queues (any replica, one lease per user), as they are queued and on start
(jobs left by a stopped process). Gate
failures (timeout, error) run the memory model as usual: a missed request costs a memory, a
false pass costs one call. A job whose memory model or store fails, or whose run overruns
`memory.jobs.timeout_seconds`, is retried with backoff and buried with the reason after
`memory.jobs.max_attempts`; it blocks only the same user's later jobs, and only until then.
The loops outlive any error (a job the store could not settle is leased again once its
lease runs out), and a `LoopSupervisor` restarts one that ends or stalls anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import time
import uuid

from proxy.config import KeelConfig, TenantConfig
from proxy.jsontext import Json
from proxy.memory.book import Limits, MemoryBook, MemoryLimitError
from proxy.memory.gate import GateResult, LexicalMemoryGate, MemoryGate, newest_window
from proxy.memory.jobs import MemoryJob, MemoryJobs, MemoryOp
from proxy.memory.llm_gate import LlmMemoryGate
from proxy.memory.model import run_memory_model
from proxy.memory.supervisor import Beat, LoopSupervisor
from proxy.metrics import Metrics
from proxy.savings.ledger import Ledger
from proxy.stores.queue import Job
from proxy.upstream import Upstream

log = logging.getLogger("keel.memory")
POLL_SECONDS = 1.0  # how often an idle worker looks for jobs another replica queued
CONCURRENCY = 4  # jobs one process works on at once (each on another user's queue)
STALL_MARGIN = 30.0  # seconds past the longest job run (settling it, claiming the next) before a loop is stalled


class PermanentJobError(Exception):
    """The job itself cannot be processed (unreadable, its tenant's memory is off): bury it now."""


class LeaseLostError(Exception):
    """Another worker owns the job now (this one was too slow to renew): leave it to them."""


def audited(chain_hash: str, rate: float) -> bool:
    """Is this skipped turn in the audit sample? (By its hash: every replica agrees, a re-run too.)"""
    draw = int.from_bytes(hashlib.blake2b(chain_hash.encode(), digest_size=4).digest(), "big") / 2**32
    return draw < rate


def limits(tenant: TenantConfig) -> Limits:
    cfg = tenant.memory
    return Limits(cfg.max_entry_chars, cfg.max_entries, cfg.max_total_chars)


class MemoryWorker:
    def __init__(self, config: KeelConfig, book: MemoryBook, jobs: MemoryJobs, upstream: Upstream,
                 metrics: Metrics, gate: MemoryGate | None = None, ledger: Ledger | None = None) -> None:
        self.tenants = {t.id: t for t in config.tenants}
        self.book, self.jobs, self.upstream, self.metrics = book, jobs, upstream, metrics
        self.ledger = ledger  # the gate's decisions and the model's cost, for the savings figures
        self.lexical = LexicalMemoryGate()
        self.injected = gate  # a gate for every tenant (tests, embedding apps); else chosen by config
        self.lease = config.store.job_lease_seconds
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._wake = asyncio.Event()
        self._empty_at = -POLL_SECONDS  # when a claim last found nothing (monotonic)
        self._looking = False  # a loop is claiming now
        longest = max((t.memory.jobs.timeout_seconds for t in config.tenants if t.memory.enabled), default=0.0)
        self.loops = LoopSupervisor("memory", self._loop, CONCURRENCY, metrics, longest + STALL_MARGIN)

    def gate_for(self, tenant: TenantConfig) -> MemoryGate:
        if self.injected is not None:
            return self.injected
        if tenant.memory.gate.backend == "llm":
            return LlmMemoryGate(self.upstream, tenant)
        return self.lexical

    def start(self) -> None:
        self.loops.start()
        self._wake.set()  # finish what a stopped process left

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        await self.loops.stop()

    def status(self) -> dict[str, int]:
        return self.loops.status()

    async def _loop(self, beat: Beat) -> None:
        """Claim and run jobs, forever: no error ends it (the supervisor restarts it if one does).
        An idle process looks once per POLL_SECONDS, not once per loop: after one loop found
        nothing, the others wait for a wake (a job queued here) or the next poll (one claim looks
        through every shard of a sharded queue, so idle polls are what a fleet pays for)."""
        while True:
            beat()
            idle = self._looking or time.monotonic() - self._empty_at < POLL_SECONDS * 0.9
            if idle and not self._wake.is_set():  # another loop looks, or just found nothing
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), POLL_SECONDS)
                continue
            self._wake.clear()  # before looking: a job queued while we look wakes the wait below
            self._looking = True
            try:
                job = await self.jobs.queue.claim(self.owner, self.lease)
            except Exception as exc:  # the store is down: try again after a pause
                log.warning("memory_claim_failed", extra={"error": repr(exc)})
                job = None
            finally:
                self._looking = False
            if job is None:
                self._empty_at = time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), POLL_SECONDS)
                continue
            self._empty_at = -POLL_SECONDS  # there was work: there may be more, so another loop looks too
            self._wake.set()
            beat()
            try:
                await self.run(job)
            except Exception as exc:  # settling failed (the store): the job's lease runs out and it is run again
                log.warning("memory_job_unsettled", extra={"job": job.id, "error": repr(exc)})
                await asyncio.sleep(POLL_SECONDS)

    async def run(self, job: Job) -> None:
        """One job, under a lease renewed while it runs: completed, retried with backoff, or buried."""
        renewing = asyncio.create_task(self._renew(job))
        tenant_id = job.queue.split("/", 1)[0]
        tenant = self.tenants.get(tenant_id)
        queue = self.jobs.queue
        timeout = tenant.memory.jobs.timeout_seconds if tenant is not None else None
        try:
            async with asyncio.timeout(timeout):
                await self.handle(job)
        except LeaseLostError:
            log.warning("memory_job_lease_lost", extra={"job": job.id})
        except PermanentJobError as exc:
            await queue.bury(job, self.owner, str(exc))
            self._count(tenant_id, "buried", exc)
        except Exception as exc:
            cfg = tenant.memory.jobs if tenant is not None else None
            attempts = job.attempts + 1
            if cfg is None or attempts >= cfg.max_attempts:
                await queue.bury(job, self.owner, f"{attempts} attempts; last: {exc!r}"[:500])
                self._count(tenant_id, "buried", exc)
            else:
                delay = min(cfg.backoff_seconds * 2 ** (attempts - 1), cfg.max_backoff_seconds)
                await queue.retry(job, self.owner, delay, repr(exc)[:500])
                self._count(tenant_id, "retried", exc)
        else:
            if await queue.complete(job, self.owner):
                self._count(tenant_id, "completed")
        finally:
            renewing.cancel()
            await asyncio.gather(renewing, return_exceptions=True)

    async def _renew(self, job: Job) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            if not await self.jobs.queue.renew(job, self.owner, self.lease):
                return

    def _count(self, tenant: str, outcome: str, exc: BaseException | None = None) -> None:
        self.metrics.memory_jobs.labels(tenant, outcome).inc()
        if exc is not None:
            log.warning(f"memory_job_{outcome}", extra={"tenant": tenant, "error": repr(exc)})

    def _price(self, tenant: TenantConfig, judgment: str, usage: Json) -> float:
        """Record a judgment's cost, priced from the models table (never mixed into a response's usage)."""
        cost = tenant.tools.judgment_cost(tenant.memory.model, usage)
        if cost is not None:
            self.metrics.judgment_cost.labels(tenant.id, judgment).inc(cost)
            if judgment == "memory_gate" and self.ledger is not None:
                self.ledger.spawn(self.ledger.judgment(tenant.id, cost))
        return cost or 0.0

    def _tally(self, tenant: TenantConfig, outcome: str, usd: float = 0.0, estimate: float = 0.0) -> None:
        if self.ledger is not None:
            self.ledger.spawn(self.ledger.memory(tenant.id, outcome, usd, estimate))

    @staticmethod
    def _skipped_run(tenant: TenantConfig, memory: object, window: list[Json]) -> float:
        """What the memory model would have cost on this message: its prompt (instructions, memory,
        the messages) estimated at 4 characters a token, and a short answer."""
        chars = len(tenant.memory.instructions) + len(str(memory or "")) + len(str(window)) + 800  # + its tools
        price = tenant.prices.price(tenant.memory.model)
        return (chars / 4 * price.input + 60 * price.output) / 1e6

    async def handle(self, job: Job) -> None:
        try:
            memory_job = MemoryJob.from_bytes(job.payload)
        except Exception as exc:
            raise PermanentJobError(f"unreadable job: {exc!r}") from exc
        tenant = self.tenants.get(memory_job.tenant)
        if tenant is None or not tenant.memory.enabled:
            raise PermanentJobError(f"memory is off for tenant {memory_job.tenant!r}")
        if memory_job.ops is None:  # not decided yet (a re-run reuses what a first run saved)
            ops, gate = await self.decide(tenant, memory_job)
            memory_job = memory_job.with_ops(ops, gate)
            if not await self.jobs.queue.save(job, self.owner, memory_job.to_bytes()):
                raise LeaseLostError(job.id)
        await self.apply(tenant, memory_job)
        await self.jobs.finished(memory_job)  # before `complete`: a replay of this ask finds it done
        self.metrics.memory_job_delay.labels(tenant.id).observe(max(0.0, time.time() - memory_job.queued_at))

    async def decide(self, tenant: TenantConfig, job: MemoryJob) -> tuple[list[MemoryOp], str]:
        """The gate's decision, and (when it says run, or fails) the memory model's operations."""
        cfg = tenant.memory
        text, context = newest_window(job.window, cfg.gate.context_messages)
        if not text:
            return [], "empty"  # a window with no user message: nothing to judge, no request
        memory = await self.book.shown(tenant.id, job.owner, cfg.token_limit * 4)
        hint = None
        decision = "run"
        if cfg.gate.enabled:
            try:
                gate = self.gate_for(tenant)
                result = await asyncio.wait_for(gate.judge(text, context, cfg.valid_keys, memory),
                                                cfg.gate.timeout_ms / 1000)
                if not isinstance(result, GateResult) or not 0 <= result.probability <= 1:
                    raise ValueError(f"unparseable gate answer: {result!r}")
                self._price(tenant, "memory_gate", getattr(gate, "usage", None))
            except Exception as exc:  # timeout, error, unparseable: the memory model runs as usual
                log.warning("memory_gate_failed", extra={"tenant": tenant.id, "error": repr(exc)})
                self.metrics.memory_gate.labels(tenant.id, "failed").inc()
                self._tally(tenant, "failed")
                decision = "failed"
            else:
                if result.probability < cfg.gate.threshold:
                    self.metrics.memory_gate.labels(tenant.id, "skip").inc()
                    if not audited(job.chain_hash, cfg.gate.audit_rate):
                        self._tally(tenant, "skip", estimate=self._skipped_run(tenant, memory, job.window))
                        return [], "skip"
                    decision = "audit"  # the gate said no: ask the model anyway, and count what it finds
                else:
                    self.metrics.memory_gate.labels(tenant.id, "run").inc()
                parts = [f"category: {result.category}"] if cfg.valid_keys and result.category else []
                parts += ["this updates an existing entry"] if result.updates else []
                hint = "; ".join(parts) or None
        try:
            ops, usage = await run_memory_model(self.upstream, tenant, memory, job.window, hint)
        except Exception:
            self.metrics.memory_model_runs.labels(tenant.id, "failed").inc()
            raise  # retried with backoff: the memory is not lost
        self.metrics.memory_model_runs.labels(tenant.id, "ok").inc()
        if decision == "audit":
            self.metrics.memory_gate_audit.labels(tenant.id, "missed" if ops else "confirmed").inc()
        if isinstance(usage, dict):
            self.metrics.memory_tokens.labels(tenant.id).inc(usage.get("total_tokens", 0) or 0)
        self._tally(tenant, "run", self._price(tenant, "memory_model", usage))
        return [MemoryOp(op, key, value) for op, key, value in ops], decision

    async def apply(self, tenant: TenantConfig, job: MemoryJob) -> None:
        """Apply the saved operations: idempotent (the same job twice writes the same entries)."""
        cfg = tenant.memory
        for n, op in enumerate(job.ops or []):
            at = job.queued_at + n * 1e-6
            if op.op == "set" and (not cfg.valid_keys or op.key in cfg.valid_keys):
                with contextlib.suppress(MemoryLimitError):  # refused, and audited as such
                    await self.book.put(tenant.id, job.owner, op.key, op.value, limits(tenant), job.chain_hash, at)
            elif op.op == "delete":
                await self.book.delete(tenant.id, job.owner, op.key, job.chain_hash, at)
