"""Savings stay bounded (issues 22 and 26): every key a turn writes has a bounded size, so a turn
costs the same at the end of a busy day as at its start, and the page's reads do not grow with
the day's traffic; the top conversations are still the costliest ones. Real SQLite and Redis."""

from __future__ import annotations

import time
from pathlib import Path

from conftest import redis_or_skip
from test_savings import GPT4O, facts

from proxy.config import SavingsConfig
from proxy.savings.ledger import TOP_KEPT, Ledger, day_of
from proxy.savings.report import summary
from proxy.stores import Store
from proxy.stores.sqlite import SqliteStore
from proxy.usage import Usage


async def _day_of_conversations(store: Store) -> None:
    ledger = Ledger(store, SavingsConfig())
    now = time.time()
    costs = {f"conv-{i}": 1_000 + (i * 7919) % 3_000 for i in range(3 * TOP_KEPT)}  # input tokens, shuffled
    for conversation, tokens in costs.items():
        await ledger.write(facts(at=now, tenant="t", conversation=conversation,
                                 usage=Usage(tokens, 0, 0, 10), first=Usage(tokens, 0, 0, 10)).settled(GPT4O))
    top = await store.get(ledger._key("t", "top", day_of(now)))
    assert top is not None and top.count(b'"conv-') == TOP_KEPT, "the day's top list holds a bounded number"
    (totals,) = await store.counters([ledger._key("t", "conv", "conv-1")])
    assert set(totals) == {"turns", "usd_keel", "usd_direct", "input_keel"}, "a conversation's own counters"
    report = await summary(ledger, "t", now - 3600, now + 1)
    truly = sorted(costs, key=lambda c: -costs[c])[:10]
    assert [c["conversation"] for c in report["top_conversations"]] == truly
    assert report["turns"] == len(costs)


async def test_sqlite_savings_keys_stay_bounded(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "s.db"))
    await _day_of_conversations(store)
    await store.close()


async def test_redis_savings_keys_stay_bounded() -> None:
    store = await redis_or_skip()
    await _day_of_conversations(store)
    await store.close()

