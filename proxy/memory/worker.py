"""After the turn: the gate judges the newest user message; only a yes runs the memory model.

`MemoryPlanner` queues a durable job for each new user message (before the response
completes); `MemoryWorker` processes queued jobs in the background after responses finish,
and on start (jobs left by a stopped process). Gate failures (timeout, error) run the memory
model as usual: a missed request costs a memory, a false pass costs one call.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from proxy.config import KeelConfig, TenantConfig
from proxy.conversations import TurnKind
from proxy.ingress import ChatRequest
from proxy.memory.book import MemoryBook
from proxy.memory.gate import GateResult, LexicalMemoryGate, MemoryGate, newest_window
from proxy.memory.jobs import MemoryJobs
from proxy.memory.llm_gate import LlmMemoryGate
from proxy.memory.model import run_memory_model
from proxy.metrics import Metrics
from proxy.upstream import Upstream

log = logging.getLogger("keel.memory")


def memory_user(request: ChatRequest) -> str | None:
    """Whose memory applies, or None (no user, memory off, or switched off per request).

    For a passthrough tenant the owner is the end user *under the caller's credential*: a
    provider key proves nothing about who the user is, so another key never reaches it."""
    if not request.tenant.memory.enabled or request.headers.get("x-keel-memory", "").lower() == "off":
        return None
    user = request.end_user
    if user is None:
        return None
    return f"{request.scope}/{user}" if request.scope else user


class MemoryPlanner:
    name = "memory"

    def __init__(self, jobs: MemoryJobs) -> None:
        self.jobs = jobs

    def applies(self, request: ChatRequest) -> bool:
        return memory_user(request) is not None

    async def plan(self, request: ChatRequest) -> ChatRequest:
        location, user = request.location, memory_user(request)
        newest = location.chain.newest_user if location else None
        if location is None or newest is None or user is None or location.kind is TurnKind.REGENERATED:
            return request
        cfg = request.tenant.memory.gate
        window = list(request.client_messages[max(0, newest.index - cfg.context_messages) : newest.index + 1])
        await self.jobs.enqueue({"tenant": request.tenant.id, "user": user, "chain_hash": newest.hash,
                                 "window": window})
        return request


class MemoryWorker:
    def __init__(self, config: KeelConfig, book: MemoryBook, jobs: MemoryJobs, upstream: Upstream,
                 metrics: Metrics, gate: MemoryGate | None = None) -> None:
        self.tenants = {t.id: t for t in config.tenants}
        self.book, self.jobs, self.upstream, self.metrics = book, jobs, upstream, metrics
        self.lexical = LexicalMemoryGate()
        self.injected = gate  # a gate for every tenant (tests, embedding apps); else chosen by config
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def gate_for(self, tenant: TenantConfig) -> MemoryGate:
        if self.injected is not None:
            return self.injected
        if tenant.memory.gate.backend == "llm":
            return LlmMemoryGate(self.upstream, tenant)
        return self.lexical

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())
        self._wake.set()  # finish what a stopped process left

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.run_pending()
            except Exception:
                log.exception("memory_worker_failed")

    async def run_pending(self) -> int:
        done = 0
        for job in await self.jobs.pending():
            tenant = self.tenants.get(job["tenant"])
            if tenant is not None and tenant.memory.enabled:
                await self.process(tenant, job)
            await self.jobs.done(job["chain_hash"])
            done += 1
        return done

    def _price(self, tenant: TenantConfig, judgment: str, usage: Any) -> None:
        """Record a judgment's cost from tools.pricing (never mixed into a response's usage)."""
        cost = tenant.tools.judgment_cost(tenant.memory.model, usage)
        if cost is not None:
            self.metrics.judgment_cost.labels(tenant.id, judgment).inc(cost)

    async def process(self, tenant: TenantConfig, job: dict[str, Any]) -> None:
        cfg = tenant.memory
        text, context = newest_window(job["window"], cfg.gate.context_messages)
        if not text:
            return  # a window with no user message: nothing to judge, no request
        memory = await self.book.entries(tenant.id, job["user"])
        hint = None
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
            else:
                if result.probability < cfg.gate.threshold:
                    self.metrics.memory_gate.labels(tenant.id, "skip").inc()
                    return
                self.metrics.memory_gate.labels(tenant.id, "run").inc()
                parts = [f"category: {result.category}"] if cfg.valid_keys and result.category else []
                parts += ["this updates an existing entry"] if result.updates else []
                hint = "; ".join(parts) or None
        try:
            ops, usage = await run_memory_model(self.upstream, tenant, memory, job["window"], hint)
        except Exception as exc:
            log.warning("memory_model_failed", extra={"tenant": tenant.id, "error": repr(exc)})
            self.metrics.memory_model_runs.labels(tenant.id, "failed").inc()
            return
        self.metrics.memory_model_runs.labels(tenant.id, "ok").inc()
        if isinstance(usage, dict):
            self.metrics.memory_tokens.labels(tenant.id).inc(usage.get("total_tokens", 0) or 0)
        self._price(tenant, "memory_model", usage)
        for op, key, value in ops:
            if op == "set" and (not cfg.valid_keys or key in cfg.valid_keys):
                await self.book.put(tenant.id, job["user"], key, value)
            elif op == "delete":
                await self.book.delete(tenant.id, job["user"], key)
