"""The clock seam: what Keel reads the time and waits through where a test needs to move time.

`SYSTEM_CLOCK` is the real one. A part whose behaviour depends on time passing (phrases that
expire, a record write retried after a wait) takes a `Clock` where it is composed
(`create_app(config, clock=…)`), so a test passes `proxy.testing.FakeClock` and moves time itself
instead of patching `time.time` for the whole process.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds since the epoch (what is stored and compared across processes)."""
        ...

    def monotonic(self) -> float:
        """Seconds for intervals within this process."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


SYSTEM_CLOCK = SystemClock()
