"""Test doubles for Keel's seams (plain classes, no patching)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.stores import StoreError
from proxy.tools.catalog import Catalog
from proxy.tools.ranking import Ranking


@dataclass
class FakeRanker:
    """Ranks the named tools first, in the given order, with fixed needs-tool and confidence."""

    best: Sequence[str] = ()
    needs_tool: float = 1.0
    confidence: float | None = 1.0
    delay: float = 0.0
    error: Exception | None = None
    scores: Sequence[float] = ()  # default: 10, 9, 8, …
    calls: int = 0

    async def rank(self, query: str, catalog: Catalog, candidates: Sequence[int], shortlist: int) -> Ranking:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.error:
            raise self.error
        allowed = set(candidates)
        order = tuple(catalog.by_name[n] for n in self.best if n in catalog.by_name and catalog.by_name[n] in allowed)
        scores = tuple(self.scores[: len(order)]) if self.scores else tuple(10.0 - i for i in range(len(order)))
        return Ranking(order, scores, self.needs_tool, self.confidence)


class FaultyStore:
    """A Store whose every call raises `StoreError` (mode "raise") or never returns ("hang")."""

    def __init__(self, inner: Any, mode: str) -> None:
        self.inner, self.mode = inner, mode
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        if name in ("close",):
            return getattr(self.inner, name)
        if name == "job_queue":  # its queue fails the same way
            return lambda: FaultyStore(None, self.mode)

        async def fault(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.mode == "hang":
                await asyncio.sleep(3600)
            if name == "ping":
                return False
            raise StoreError(f"{name}: injected fault")

        return fault
