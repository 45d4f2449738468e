"""Savings in the store: bounded, with retention, shared by every worker and replica.

Per tenant (keys hash-tagged `savings:<tenant>`):

    h:<YYYYMMDDHH>    hourly counters (turns, tokens and dollars direct and through Keel, by cause,
                      tool_search rounds, first-shot calls, gate decisions, memory-gate outcomes)
    conv:<conversation>  the conversation's counters (turns, input tokens, dollars both ways)
    top:<YYYYMMDD>    the day's `TOP_KEPT` costliest conversations (a small JSON object)
    t:<conversation>  the conversation's turns (`TurnFacts`), the first `conversation_turns` kept, for
                      `savings.detail_days` after its last turn
    memory            all-time memory-model runs and cost (the average a skipped run is priced at)

Answers from Keel's own cache (`proxy.respcache`) count in the hourly figures too: hits, and the
dollars and tokens the upstream calls they replaced cost (`usd_answers`, a cause of its own).

Every key a turn writes is of a bounded size, so a turn costs the same at the end of a busy day
as at its start, and the page's reads are bounded too (an hour's counters, a day's top list,
the counters of the conversations in it): none grows with the day's traffic. A turn's writes take
two round trips (`Store.batch`: the counters added and read back with the top list, then the
top list, the turn's row and the meter's estimate for the next turn). The top list is
read, changed and written back, so two replicas writing at once may each keep the other's
change or not: it ranks, it does not account (the hourly counters do). Keys expire after
`savings.retention_days` (a conversation's turns after `detail_days`). A write that fails is logged and dropped: figures are bookkeeping,
never a reason to fail or slow a turn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Coroutine, Iterable, Sequence
from typing import cast

import orjson

from proxy.background import Background
from proxy.config import SavingsConfig
from proxy.savings.facts import TurnFacts
from proxy.stores import Append, Get, Incr, Op, ReadCounters, Set, Store, key

log = logging.getLogger("keel.savings")
HOUR = 3600
DAY = 24 * HOUR
TOP_KEPT = 100  # conversations a day's top list keeps (the page shows 10)


def hour_of(ts: float) -> str:
    return time.strftime("%Y%m%d%H", time.gmtime(ts))


def day_of(ts: float) -> str:
    return time.strftime("%Y%m%d", time.gmtime(ts))


class Ledger:
    def __init__(self, store: Store, config: SavingsConfig) -> None:
        self.store = store
        self.config = config
        self.ttl = config.retention_days * DAY
        self.detail_ttl = config.detail_days * DAY
        self.background = Background("savings_not_recorded", log)
        self._full: set[str] = set()  # conversations whose turn list reached its cap (this process knows)

    @staticmethod
    def _key(tenant: str, *parts: str) -> str:
        return key(f"savings:{tenant}", *parts)

    def spawn(self, work: Coroutine[object, None, None]) -> None:
        """Run bookkeeping in the background; a failure is logged, never raised."""
        if not self.config.enabled:
            work.close()
            return
        self.background.spawn(work)

    async def drain(self) -> None:
        """Wait for the writes in flight (shutdown, tests)."""
        await self.background.drain()

    async def write(self, facts: TurnFacts, also: Sequence[Op] = ()) -> None:
        """The turn's figures in two round trips: its counters added and read back with the day's top
        list, then the top list (when this conversation enters it), its row and `also` (the meter's own
        writes) stored."""
        tenant, conversation = facts.tenant, facts.conversation
        totals, top = self._key(tenant, "conv", conversation), self._key(tenant, "top", day_of(facts.at))
        _, _, counted, raw = await self.store.batch([
            Incr(self._key(tenant, "h", hour_of(facts.at)), facts.counters(), self.ttl + HOUR),
            Incr(totals, {"turns": 1, "usd_keel": facts.keel_usd, "usd_direct": facts.direct_usd,
                          "input_keel": facts.usage.input}, self.ttl),
            ReadCounters((totals,)), Get(top)])
        writes: list[Op] = list(also)
        (total,) = cast("list[dict[str, float]]", counted)
        ranked = self._rank(raw, conversation, total.get("usd_keel", 0.0))
        if ranked is not None:
            writes.append(Set(top, ranked, self.ttl + DAY))
        turns = self._key(tenant, "t", conversation)
        if turns not in self._full:
            writes.append(Append(turns, facts.to_bytes(), self.detail_ttl))
        answers = await self.store.batch(writes)
        count = answers[-1] if turns not in self._full else None
        if isinstance(count, int) and count >= self.config.conversation_turns:
            self._full.add(turns)

    @staticmethod
    def _rank(raw: object, conversation: str, usd: float) -> bytes | None:
        """The day's costliest conversations with this one in (None: it does not beat the cheapest kept)."""
        top = _top(raw)
        if conversation not in top and len(top) >= TOP_KEPT and usd <= min(top.values()):
            return None
        top[conversation] = usd
        if len(top) > TOP_KEPT:
            del top[min(top, key=lambda c: top[c])]
        return orjson.dumps(top)

    async def memory(self, tenant: str, outcome: str, usd: float = 0.0, estimate: float = 0.0) -> None:
        """A memory job's gate decision (run, skip, failed), the model's cost, or a skipped run's estimate."""
        deltas = {f"memory_{outcome}": 1, "usd_memory": usd, "usd_memory_skipped_estimate": estimate}
        await self.store.incr(self._key(tenant, "h", hour_of(time.time())), {k: v for k, v in deltas.items() if v},
                              self.ttl + HOUR)
        if outcome == "run" and usd:
            await self.store.incr(self._key(tenant, "memory"), {"runs": 1, "usd": usd})

    async def answered(self, tenant: str, cache: str, hits: int, usd: float, tokens: int) -> None:
        """Requests (or embedding items) answered from Keel's own cache (`cache`: responses or
        embeddings), and what they would have cost upstream."""
        deltas = {f"{cache}_hits": hits, "usd_answers": usd, "tokens_answers": tokens}
        await self.store.incr(self._key(tenant, "h", hour_of(time.time())), {k: v for k, v in deltas.items() if v},
                              self.ttl + HOUR)

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
        """The counters of the conversations in the range's daily top lists."""
        since = self._bounded(since, until)
        days, day = [], int(since // DAY * DAY)
        while day <= until:
            days.append(day_of(day))
            day += DAY
        names: set[str] = set()
        for raw in await self.store.get_many([self._key(tenant, "top", d) for d in days]):
            names.update(_top(raw))
        ordered = sorted(names)
        found = await self.store.counters([self._key(tenant, "conv", c) for c in ordered])
        return {c: totals for c, totals in zip(ordered, found, strict=True) if totals}

    async def turns(self, tenant: str, conversation: str) -> list[TurnFacts]:
        return [TurnFacts.from_bytes(raw) for raw in await self.store.get_list(self._key(tenant, "t", conversation))]

    async def memory_average(self, tenant: str) -> float | None:
        """The memory model's average cost per run, over every run recorded (None before the first)."""
        (found,) = await self.store.counters([self._key(tenant, "memory")])
        return found["usd"] / found["runs"] if found.get("runs") else None


def _top(raw: object) -> dict[str, float]:
    """A day's top list as stored; one Keel cannot read (corrupted, another version's) is empty, so
    that it costs no turn its record (the list is rebuilt from the day's next turns)."""
    try:
        top = orjson.loads(raw) if isinstance(raw, bytes) else {}
    except orjson.JSONDecodeError:
        return {}
    if not isinstance(top, dict):
        return {}
    return {str(c): float(usd) for c, usd in top.items() if isinstance(usd, int | float) and not isinstance(usd, bool)}


def summed(rows: Iterable[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for row in rows:
        for name, value in row.items():
            total[name] = total.get(name, 0.0) + value
    return total
