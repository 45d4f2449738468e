"""Ranking the deferred catalog against the turn, and the needs-tool judgment.

`Ranker` is the seam: the embedded `LexicalRanker` (BM25) needs no network and no model.
A ranking carries the raw top score, because a raw score separates "needs a tool" from
"needs none" far better than a normalised one; `gate` turns it, with the shape of the
message, into the needs-tool probability.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from proxy.tools.catalog import Catalog
from proxy.tools.gate import needs_tool_probability
from proxy.tools.lexical import Namespaces

# A tool of a server or product the turn names ("in Linear…", "the Jira ticket") scores this
# many times its own score (fitted on Keel's development sets, bench/quality.py --tune).
NAMED_BOOST = 2.0
# Fewest ranked tools shipped when the gate says a tool is needed: a lone standout can be wrong,
# and a miss costs a round trip where a tool costs a few hundred tokens.
MIN_SHIPPED = 3


@dataclass(frozen=True)
class Ranking:
    order: tuple[int, ...]  # catalog indexes, best first (only tools with a positive score)
    scores: tuple[float, ...]
    needs_tool: float  # P(the turn needs any tool), in [0, 1]
    confidence: float | None  # how clearly the shortlist stands out; None when unmeasurable
    usage: dict[str, int] | None = None  # tokens a model-backed ranking used (priced, never billed to the client)
    fallback: bool = False  # the backend failed or overran its deadline: this is the lexical ranking

    @property
    def top_score(self) -> float:
        return self.scores[0] if self.scores else 0.0


class Ranker(Protocol):
    async def rank(self, query: str, catalog: Catalog, candidates: Sequence[int], shortlist: int) -> Ranking: ...


def confidence(scores: Sequence[float], shortlist: int) -> float | None:
    """1 - (first score just outside the shortlist / top score); None with nothing to compare."""
    if not scores or scores[0] <= 0:
        return None
    if len(scores) <= shortlist:
        return 1.0
    return 1 - scores[shortlist] / scores[0]


def standing_out(scores: Sequence[float], width: int, min_drop: float) -> int:
    """How many of the first `width` tools to ship: those before the largest relative score drop
    among them, when that drop is at least `min_drop`; else all `width`. A turn whose best
    tools clearly stand out ships only those; the rest stay one search away."""
    width = min(width, len(scores))
    if min_drop <= 0 or width <= MIN_SHIPPED:
        return width
    drops = [(1 - scores[i] / scores[i - 1] if scores[i - 1] > 0 else 0.0, i)
             for i in range(1, min(width + 1, len(scores)))]
    drop, at = max(drops, key=lambda d: (d[0], -d[1]))
    return max(at, MIN_SHIPPED) if drop >= min_drop else width


_NAMESPACES: OrderedDict[str, Namespaces] = OrderedDict()
_NAMESPACES_LOCK = threading.Lock()


def namespaces(catalog: Catalog) -> Namespaces:
    """The catalog's server/product groups, derived once per catalog (bounded, newest kept)."""
    with _NAMESPACES_LOCK:
        found = _NAMESPACES.get(catalog.key)
        if found is not None:
            _NAMESPACES.move_to_end(catalog.key)
            return found
    entries = catalog.entries
    found = Namespaces([e.name for e in entries], [e.description for e in entries], [e.server for e in entries])
    with _NAMESPACES_LOCK:
        _NAMESPACES[catalog.key] = found
        while len(_NAMESPACES) > 64:
            _NAMESPACES.popitem(last=False)
    return found


def lexical_scores(query: str, catalog: Catalog) -> dict[int, float]:
    """BM25 per tool, the tools of a server or product the query names boosted."""
    scores = catalog.index.scores(query)
    named = namespaces(catalog).named(query)
    if named:
        scores = {i: s * NAMED_BOOST if i in named else s for i, s in scores.items()}
    return scores


class LexicalRanker:
    async def rank(self, query: str, catalog: Catalog, candidates: Sequence[int], shortlist: int) -> Ranking:
        return self.rank_now(query, catalog, candidates, shortlist)

    def rank_now(self, query: str, catalog: Catalog, candidates: Sequence[int], shortlist: int) -> Ranking:
        allowed = set(candidates)
        scored = sorted(
            ((score, i) for i, score in lexical_scores(query, catalog).items() if i in allowed and score > 0),
            key=lambda pair: (-pair[0], pair[1]),
        )
        scores = tuple(s for s, _ in scored)
        top = scores[0] if scores else 0.0
        return Ranking(tuple(i for _, i in scored), scores, needs_tool_probability(top, query),
                       confidence(scores, shortlist))


class GuardedRanker:
    """A ranking backend behind its deadline, falling back to BM25 when it fails or is late.

    The one place a backend's failure is handled: the planner's preselection and Keel's own
    `tool_search` answers both rank through it, so a dead embeddings or LLM endpoint costs
    ranking quality, never a turn."""

    def __init__(self, inner: Ranker, timeout: float, on_failure: Callable[[BaseException], None]) -> None:
        self.inner, self.timeout, self.on_failure = inner, timeout, on_failure
        self.lexical = LexicalRanker()

    async def rank(self, query: str, catalog: Catalog, candidates: Sequence[int], shortlist: int) -> Ranking:
        try:
            return await asyncio.wait_for(self.inner.rank(query, catalog, candidates, shortlist), self.timeout)
        except Exception as exc:
            self.on_failure(exc)
            return replace(self.lexical.rank_now(query, catalog, candidates, shortlist), fallback=True)
