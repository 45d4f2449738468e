"""Bookkeeping after the answer: work that runs on its own task, never fails a turn, and is
waited for at shutdown (`drain`), so nothing a replica accepted is dropped by a clean stop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine


class Background:
    """A set of guarded tasks: a failure is logged as `event`, never raised."""

    def __init__(self, event: str, log: logging.Logger) -> None:
        self.event = event
        self.log = log
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, work: Coroutine[object, None, None]) -> asyncio.Task[None]:
        async def guarded() -> None:
            try:
                await work
            except Exception as exc:
                self.log.warning(self.event, extra={"error": repr(exc)})

        task = asyncio.get_running_loop().create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self) -> None:
        """Wait for the work in flight (shutdown, tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
