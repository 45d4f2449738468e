"""Savings bookkeeping per turn as the day's conversations grow: flat, or not.

    python bench/ledger.py [--conversations 100000] [--store sqlite|redis ...]

Writes one turn for each of N new conversations on one day through the real `Ledger` (what
every planned turn writes after its answer), and prints this process's CPU time per turn
(SQLite runs in this process; for Redis it is the client's side) for the first and the last
2,000 conversations, and their ratio. A key that grew with the day's conversations shows as a
ratio well above 1 (on SQLite, 6,000 conversations: 2.1 -> 11.2 ms, 5.3x, before the ledger kept
per-conversation counters; 0.41 -> 0.42 ms after).
Redis: db 9 of 127.0.0.1:6379 (`KEEL_BENCH_REDIS_URL`), flushed first.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

from overhead import table

from proxy.config import SavingsConfig
from proxy.prices import PriceTable
from proxy.savings.facts import TurnFacts
from proxy.savings.ledger import Ledger
from proxy.stores import Store
from proxy.usage import Usage

WINDOW = 2_000
PRICE = PriceTable().price("gpt-4o")


def turn(at: float, n: int) -> TurnFacts:
    tokens = 1_000 + (n * 7919) % 5_000
    return TurnFacts(at=at, tenant="bench", conversation=f"conversation-{n}", request_id=f"r{n}", shape="chat",
                     model="gpt-4o", kind="new", usage=Usage(tokens, 0, 0, 40), first=Usage(tokens, 0, 0, 40)
                     ).settled(PRICE)


async def measure(store: Store, conversations: int) -> tuple[float, float]:
    ledger = Ledger(store, SavingsConfig())
    at = time.time()
    windows: list[float] = []
    started = 0.0
    for n in range(conversations):
        if n in (0, conversations - WINDOW):
            started = time.process_time()
        await ledger.write(turn(at, n))
        if n in (WINDOW - 1, conversations - 1):
            windows.append((time.process_time() - started) * 1000 / WINDOW)
    await store.close()
    return windows[0], windows[-1]


async def open_store(kind: str, directory: str) -> Store:
    if kind == "redis":
        from proxy.stores.redis import RedisStore

        store = RedisStore(os.environ.get("KEEL_BENCH_REDIS_URL", "redis://127.0.0.1:6379/9"))
        await store._redis.flushdb()
        return store
    from proxy.stores.sqlite import SqliteStore

    return SqliteStore(os.path.join(directory, "ledger.db"))


async def main(conversations: int, stores: list[str]) -> None:
    rows = []
    for kind in stores:
        with tempfile.TemporaryDirectory() as directory:
            first, last = await measure(await open_store(kind, directory), conversations)
        rows.append([kind, f"{conversations:,}", f"{first:.3f}", f"{last:.3f}", f"{last / first:.2f}"])
    table(["store", "conversations", "CPU ms/turn, first 2,000", "CPU ms/turn, last 2,000", "last / first"], rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=20_000)
    parser.add_argument("--store", action="append", choices=("sqlite", "redis"))
    args = parser.parse_args()
    asyncio.run(main(max(args.conversations, 2 * WINDOW), args.store or ["sqlite", "redis"]))
