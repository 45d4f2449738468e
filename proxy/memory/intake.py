"""After the upstream accepted a turn: its memory job queued in order, and never lost.

The turn waits for the store at most its own budget (`store.budget_ms`); whatever is left
goes on in the background. A job the store does not take is tried `ATTEMPTS` times with the
background budget, then kept in the local spool (`MemorySpool`) and offered to the store from
there every `DRAIN_SECONDS`, in order, until it takes it; a process that stops spools what it
still holds, and spools left by stopped processes are taken over at start and every
`ADOPT_SECONDS`. Per user, jobs keep their order: one never passes an earlier one that is
still being tried or waits in the spool (a correction never lands before the fact it corrects).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable

from proxy.memory.jobs import MemoryJob, MemoryJobs
from proxy.memory.spool import MemorySpool
from proxy.metrics import Metrics

log = logging.getLogger("keel.memory")
ATTEMPTS = 3  # tries at the store before a job is spooled
BACKOFF = 0.25  # seconds before the second try, doubled before each next one
DRAIN_SECONDS = 1.0  # how often the spool is offered to the store while it holds jobs
ADOPT_SECONDS = 10.0  # how often spools of stopped processes are looked for


class MemoryIntake:
    def __init__(self, jobs: MemoryJobs, spool: MemorySpool, metrics: Metrics, wait: float,
                 queued: Callable[[], None] = lambda: None) -> None:
        self.jobs, self.spool, self.metrics, self.wait, self.queued = jobs, spool, metrics, wait, queued
        self._waiting: dict[str, deque[tuple[MemoryJob, asyncio.Future[None]]]] = {}  # per user queue, in order
        self._feeders: dict[str, asyncio.Task[None]] = {}
        self._drainer: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    async def start(self) -> None:
        """Take over spools left by stopped processes (before any new job can pass theirs), then drain."""
        await self._adopt()
        self._drainer = asyncio.create_task(self._drain_loop())

    async def stop(self) -> None:
        """Spool every job not in the store yet (the next process queues them), then let go."""
        for task in [*self._feeders.values(), *([self._drainer] if self._drainer else [])]:
            task.cancel()
        await asyncio.gather(*self._feeders.values(), *([self._drainer] if self._drainer else []),
                             return_exceptions=True)
        for waiting in self._waiting.values():
            for job, _ in waiting:  # the head may have reached the store too: queueing is idempotent
                try:
                    await self.spool.add(job)
                except OSError as exc:
                    log.error("memory_ask_lost", extra={"tenant": job.tenant, "error": repr(exc)})
                    self.metrics.memory_asks.labels(job.tenant, "lost").inc()
        self._waiting.clear()
        self._gauge()
        await self.spool.close()

    def status(self) -> dict[str, int]:
        """For /healthz: jobs kept in the spool, and jobs being tried now."""
        return {"spooled": len(self.spool), "trying": sum(len(w) for w in self._waiting.values())}

    async def submit(self, job: MemoryJob) -> None:
        """Take a job whose turn the upstream accepted; wait for the store at most `wait` seconds."""
        placed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(job.queue, deque()).append((job, placed))
        if job.queue not in self._feeders:
            self._feeders[job.queue] = asyncio.create_task(self._feed(job.queue))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(placed), self.wait)

    async def _feed(self, queue: str) -> None:
        """One user's jobs, one at a time, in order: each to the store, or to the spool."""
        waiting = self._waiting[queue]
        try:
            while waiting:
                job, placed = waiting[0]
                try:
                    await self._place(job)
                except Exception as exc:  # a job that can be neither queued nor written down (a bug): say so
                    log.error("memory_ask_lost", exc_info=exc, extra={"tenant": job.tenant})
                    self.metrics.memory_asks.labels(job.tenant, "lost").inc()
                waiting.popleft()
                if not placed.done():
                    placed.set_result(None)
        finally:
            self._feeders.pop(queue, None)
            if not waiting:
                self._waiting.pop(queue, None)

    async def _place(self, job: MemoryJob) -> None:
        delay = BACKOFF
        while True:
            if not self.spool.holds(job.queue):  # nothing of this user's waits in the spool: try the store
                for attempt in range(ATTEMPTS):
                    if await self._offer(job, "queued"):
                        return
                    if attempt + 1 < ATTEMPTS:
                        await asyncio.sleep(delay * 2**attempt)
            try:
                await self.spool.add(job)
            except OSError as exc:  # the disk refuses too: keep it here and try both again
                log.error("memory_spool_failed", extra={"tenant": job.tenant, "error": repr(exc)})
                await asyncio.sleep(DRAIN_SECONDS)
                continue
            self.metrics.memory_asks.labels(job.tenant, "spooled").inc()
            self._gauge()
            self._wake.set()
            return

    async def _offer(self, job: MemoryJob, outcome: str) -> bool:
        """One try at the store; True once it holds the job (or had judged its message already)."""
        try:
            queued = await self.jobs.enqueue(job)
        except Exception as exc:
            log.warning("memory_enqueue_failed", extra={"tenant": job.tenant, "error": repr(exc)})
            return False
        self.metrics.memory_asks.labels(job.tenant, outcome if queued else "duplicate").inc()
        if queued:
            self.queued()
        return True

    async def _drain_loop(self) -> None:
        adopted_at = asyncio.get_running_loop().time()
        while True:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), DRAIN_SECONDS)
            try:
                if asyncio.get_running_loop().time() - adopted_at >= ADOPT_SECONDS:
                    adopted_at = asyncio.get_running_loop().time()
                    await self._adopt()
                await self._drain()
            except Exception as exc:  # the spool's disk: try again at the next pass
                log.error("memory_spool_drain_failed", extra={"error": repr(exc)})

    async def _drain(self) -> None:
        """Offer the spool's jobs to the store in order; stop at the first it does not take."""
        taken = 0
        for job in self.spool.jobs():
            if not await self._offer(job, "replayed"):
                break
            taken += 1
        if taken:
            await self.spool.done(taken)
            self._gauge()

    async def _adopt(self) -> None:
        try:
            if await self.spool.adopt():
                self._gauge()
                self._wake.set()
        except OSError as exc:
            log.error("memory_spool_adopt_failed", extra={"error": repr(exc)})

    def _gauge(self) -> None:
        self.metrics.memory_spooled.set(len(self.spool))
