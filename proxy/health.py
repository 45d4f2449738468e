"""Liveness that never waits on a dependency: /healthz answers from a background monitor's last reading.

A hung Redis (a SIGSTOPped one accepts connections and never answers) would hold a probe that
asks it for the probe's whole timeout, and the kubelet restarts every replica at once when its
liveness probe waits past 1 s. So nothing /healthz does awaits the store: `HealthMonitor` pings
it every `interval` seconds, each ping within `timeout`, and keeps the reading; a ping still
running past `timeout` already reads as unavailable. Other parts report details the same way,
from memory (`details`: the memory worker's loops and spool).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from proxy.jsontext import Json, JsonObject
from proxy.metrics import Metrics
from proxy.stores.guard import GuardedStore

log = logging.getLogger("keel.health")
INTERVAL = 2.0  # seconds between two readings
TIMEOUT = 1.0  # a ping that takes longer reads as unavailable


class HealthMonitor:
    def __init__(self, store: GuardedStore, metrics: Metrics, interval: float = INTERVAL, timeout: float = TIMEOUT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.metrics = store, metrics
        self.interval, self.timeout, self.clock = interval, timeout, clock
        self.details: dict[str, Callable[[], Json]] = {}  # name -> a reading kept in memory (never awaits)
        self._store_ok = True
        self._pinging_since: float | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Take a first reading (within `timeout`), then keep reading in the background."""
        await self._read()
        self._task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def reading(self) -> JsonObject:
        """What /healthz says: at once, whatever the store is doing."""
        hung = self._pinging_since is not None and self.clock() - self._pinging_since > self.timeout
        store = "ok" if self._store_ok and not hung else "unavailable"
        body: JsonObject = {"status": "ok", "store": store}
        for name, detail in self.details.items():
            body[name] = detail()
        return body

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            with contextlib.suppress(Exception):  # a reading that fails is a store that is down, never a dead monitor
                await self._read()

    async def _read(self) -> None:
        self._pinging_since = self.clock()
        try:
            ok = await asyncio.wait_for(self.store.ping(), self.timeout)
        except Exception as exc:  # TimeoutError, or a store that raised instead of answering False
            log.debug("health_ping_failed", extra={"error": repr(exc)})
            ok = False
        finally:
            self._pinging_since = None
        if ok != self._store_ok:
            log.warning("store_health", extra={"store": "ok" if ok else "unavailable"})
        self._store_ok = ok
        self.metrics.store_up.set(1 if ok else 0)
