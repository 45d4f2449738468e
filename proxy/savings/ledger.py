"""Savings in the store: bounded, with retention, shared by every worker and replica.

Per tenant (keys hash-tagged `savings:<tenant>`):

    h:<YYYYMMDDHH>    hourly counters (turns, tokens and dollars direct and through Keel, by cause,
                      tool_search rounds, first-shot calls, gate decisions, memory-gate outcomes)
    c:<YYYYMMDD>      per-day counters per conversation (`<conversation>|usd_keel` …), for the
                      top conversations
    t:<conversation>  the conversation's turns (`TurnFacts`), the first `conversation_turns` kept
    memory            all-time memory-model runs and cost (the average a skipped run is priced at)

Hourly and daily keys and turn lists expire after `savings.retention_days`. A write that fails
is logged and dropped: figures are bookkeeping, never a reason to fail or slow a turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterable

from proxy.config import SavingsConfig
from proxy.savings.facts import TurnFacts
from proxy.stores import Store, key

log = logging.getLogger("keel.savings")
HOUR = 3600
DAY = 24 * HOUR


def hour_of(ts: float) -> str:
    return time.strftime("%Y%m%d%H", time.gmtime(ts))


def day_of(ts: float) -> str:
    return time.strftime("%Y%m%d", time.gmtime(ts))


class Ledger:
    def __init__(self, store: Store, config: SavingsConfig) -> None:
        self.store = store
        self.config = config
        self.ttl = config.retention_days * DAY
        self._tasks: set[asyncio.Task[None]] = set()
        self._full: set[str] = set()  # conversations whose turn list reached its cap (this process knows)

    @staticmethod
    def _key(tenant: str, *parts: str) -> str:
        return key(f"savings:{tenant}", *parts)

    def spawn(self, work: Coroutine[object, None, None]) -> None:
        """Run bookkeeping in the background; a failure is logged, never raised."""
        if not self.config.enabled:
            work.close()
            return

        async def guarded() -> None:
            try:
                await work
            except Exception as exc:
                log.warning("savings_not_recorded", extra={"error": repr(exc)})

        task = asyncio.get_running_loop().create_task(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for the writes in flight (shutdown, tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def write(self, facts: TurnFacts) -> None:
        tenant, conversation = facts.tenant, facts.conversation
        await self.store.incr(self._key(tenant, "h", hour_of(facts.at)), facts.counters(), self.ttl + HOUR)
        per_conversation = {f"{conversation}|turns": 1, f"{conversation}|usd_keel": facts.keel_usd,
                            f"{conversation}|usd_direct": facts.direct_usd,
                            f"{conversation}|input_keel": facts.usage.input}
        await self.store.incr(self._key(tenant, "c", day_of(facts.at)), per_conversation, self.ttl + DAY)
        turns = self._key(tenant, "t", conversation)
        if turns not in self._full:
            count = await self.store.append(turns, facts.to_bytes(), self.ttl)
            if count >= self.config.conversation_turns:
                self._full.add(turns)

    async def memory(self, tenant: str, outcome: str, usd: float = 0.0, estimate: float = 0.0) -> None:
        """A memory job's gate decision (run, skip, failed), the model's cost, or a skipped run's estimate."""
        deltas = {f"memory_{outcome}": 1, "usd_memory": usd, "usd_memory_skipped_estimate": estimate}
        await self.store.incr(self._key(tenant, "h", hour_of(time.time())), {k: v for k, v in deltas.items() if v},
                              self.ttl + HOUR)
        if outcome == "run" and usd:
            await self.store.incr(self._key(tenant, "memory"), {"runs": 1, "usd": usd})

    async def judgment(self, tenant: str, usd: float) -> None:
        """A judgment Keel made outside a turn (the memory gate's model)."""
        if usd:
            await self.store.incr(self._key(tenant, "h", hour_of(time.time())), {"usd_memory_gate": usd},
                                  self.ttl + HOUR)

    # Reading

    def _bounded(self, since: float, until: float) -> float:
        """A range's start, no earlier than the oldest figures kept (a range reaching back centuries
        would otherwise ask the store for every hour of it)."""
        return max(since, until - self.ttl - DAY)

    async def hours(self, tenant: str, since: float, until: float) -> list[tuple[float, dict[str, float]]]:
        since = self._bounded(since, until)
        starts = [h for h in range(int(since // HOUR * HOUR), int(until) + 1, HOUR)]
        found = await self.store.counters([self._key(tenant, "h", hour_of(h)) for h in starts])
        return [(float(h), c) for h, c in zip(starts, found, strict=True) if c]

    async def conversations(self, tenant: str, since: float, until: float) -> dict[str, dict[str, float]]:
        since = self._bounded(since, until)
        days, day = [], int(since // DAY * DAY)
        while day <= until:
            days.append(day_of(day))
            day += DAY
        out: dict[str, dict[str, float]] = {}
        for counters in await self.store.counters([self._key(tenant, "c", d) for d in days]):
            for name, value in counters.items():
                conversation, _, field = name.rpartition("|")
                totals = out.setdefault(conversation, {})
                totals[field] = totals.get(field, 0.0) + value
        return out

    async def turns(self, tenant: str, conversation: str) -> list[TurnFacts]:
        return [TurnFacts.from_bytes(raw) for raw in await self.store.get_list(self._key(tenant, "t", conversation))]

    async def memory_average(self, tenant: str) -> float | None:
        """The memory model's average cost per run, over every run recorded (None before the first)."""
        (found,) = await self.store.counters([self._key(tenant, "memory")])
        return found["usd"] / found["runs"] if found.get("runs") else None


def summed(rows: Iterable[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for row in rows:
        for name, value in row.items():
            total[name] = total.get(name, 0.0) + value
    return total
