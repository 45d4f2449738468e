"""Background loops that cannot die quietly: started, watched, restarted, and reported.

One store error once ended a memory worker loop for good (jobs stuck until a restart, with
nothing in metrics or /healthz). A loop catches what it can; `LoopSupervisor` catches the
rest: each loop calls its `beat` as it goes, and a loop that ended (any exception, even one
raised by its own error handling) or has not beaten for `stall_seconds` is cancelled,
counted in `keel_worker_loop_restarts_total{loop, reason}` and started again.
`keel_worker_loops{loop}` and /healthz (`status()`) say how many run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from proxy.metrics import Metrics

log = logging.getLogger("keel.memory")
Beat = Callable[[], None]


class LoopSupervisor:
    def __init__(self, name: str, loop: Callable[[Beat], Awaitable[None]], count: int, metrics: Metrics,
                 stall_seconds: float, check_seconds: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.loop, self.count, self.metrics = name, loop, count, metrics
        self.stall_seconds, self.check_seconds, self.clock = stall_seconds, check_seconds, clock
        self.restarts = 0
        self._beats: list[float] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._watcher: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._beats = [self.clock()] * self.count
        self._tasks = [self._spawn(i) for i in range(self.count)]
        self._watcher = asyncio.create_task(self._watch())
        self.metrics.worker_loops.labels(self.name).set(self.count)

    async def stop(self) -> None:
        tasks = [*self._tasks, *([self._watcher] if self._watcher else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks, self._watcher = [], None
        self.metrics.worker_loops.labels(self.name).set(0)

    def status(self) -> dict[str, int]:
        """For /healthz: loops wanted, loops alive and beating, restarts so far."""
        return {"loops": self.count, "running": self.running(), "restarts": self.restarts}

    def running(self) -> int:
        now = self.clock()
        return sum(1 for task, beat in zip(self._tasks, self._beats, strict=True)
                   if not task.done() and now - beat <= self.stall_seconds)

    def check(self) -> None:
        """Restart every loop that ended or stalled."""
        now = self.clock()
        for i, task in enumerate(self._tasks):
            if task.done():
                reason = "died"
                error = None if task.cancelled() else task.exception()
                log.error("worker_loop_died", exc_info=error, extra={"loop": self.name, "error": repr(error)})
            elif now - self._beats[i] > self.stall_seconds:
                reason = "stalled"
                task.cancel()  # whatever it waits on, it waits no more
                log.error("worker_loop_stalled", extra={"loop": self.name, "seconds": round(now - self._beats[i], 1)})
            else:
                continue
            self.restarts += 1
            self.metrics.worker_loop_restarts.labels(self.name, reason).inc()
            self._tasks[i] = self._spawn(i)
        self.metrics.worker_loops.labels(self.name).set(self.running())

    def _spawn(self, i: int) -> asyncio.Task[None]:
        self._beats[i] = self.clock()

        def beat() -> None:
            self._beats[i] = self.clock()

        async def run() -> None:
            await self.loop(beat)

        return asyncio.create_task(run())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.check_seconds)
            try:
                self.check()
            except Exception as exc:  # the watcher itself must outlive anything
                log.error("worker_supervisor_failed", exc_info=exc, extra={"loop": self.name})
