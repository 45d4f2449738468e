"""Ranking the deferred catalog against the turn, and the needs-tool judgment.

`Ranker` is the seam: the embedded `LexicalRanker` (BM25) needs no network and no model.
A ranking carries the raw top score, because a raw score separates "needs a tool" from
"needs none" far better than a normalised one, and the needs-tool probability combines it
with the conversational shape of the message (thanks, greetings, acknowledgements).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from proxy.tools.catalog import Catalog

_CONVERSATIONAL = re.compile(
    r"^\s*(?:(?:ok(?:ay)?|k|cool|great|nice|perfect|awesome|thanks?(?: you)?|thank you(?: so much| very much)?|thx|ty|"
    r"cheers|got it|sounds good|sure|yes|yep|yeah|no|nope|hi|hello|hey|good (?:morning|evening|night|afternoon)|"
    r"bye|goodbye|see you|lol|haha|wow|that(?:'s| is| was) (?:\w+ )?(?:great|helpful|perfect|awesome|useful|nice|it)|"
    r"(?:that|this) (?:was|is) (?:really |very |super )?(?:helpful|useful|great|good)|"
    r"you(?:'re| are) (?:the best|great|awesome)|never ?mind|all good|no worries|np)"
    r"[\s,.!?:;)(-]*)+$",
    re.IGNORECASE,
)

# Logistic calibration of the raw BM25 top score into P(needs a tool); fitted on MetaTool's
# awareness set (see bench/tools.py, which reports the gate's accuracy).
NEEDS_TOOL_MIDPOINT = 6.0
NEEDS_TOOL_SCALE = 1.5


@dataclass(frozen=True)
class Ranking:
    order: tuple[int, ...]  # catalog indexes, best first (only tools with a positive score)
    scores: tuple[float, ...]
    needs_tool: float  # P(the turn needs any tool), in [0, 1]
    confidence: float | None  # how clearly the shortlist stands out; None when unmeasurable

    @property
    def top_score(self) -> float:
        return self.scores[0] if self.scores else 0.0


class Ranker(Protocol):
    async def rank(self, query: str, catalog: Catalog, candidates: Sequence[int], shortlist: int) -> Ranking: ...


def conversational(text: str) -> bool:
    """Thanks, greetings, acknowledgements: turns that need no tool whatever they share in words."""
    return bool(_CONVERSATIONAL.match(text)) or not text.strip()


def needs_tool_probability(top_score: float, text: str) -> float:
    if conversational(text):
        return 0.0
    return 1 / (1 + math.exp(-(top_score - NEEDS_TOOL_MIDPOINT) / NEEDS_TOOL_SCALE))


def confidence(scores: Sequence[float], shortlist: int) -> float | None:
    """1 - (first score just outside the shortlist / top score); None with nothing to compare."""
    if not scores or scores[0] <= 0:
        return None
    if len(scores) <= shortlist:
        return 1.0
    return 1 - scores[shortlist] / scores[0]


class LexicalRanker:
    async def rank(self, query: str, catalog: Catalog, candidates: Sequence[int], shortlist: int) -> Ranking:
        return self.rank_now(query, catalog, candidates, shortlist)

    def rank_now(self, query: str, catalog: Catalog, candidates: Sequence[int], shortlist: int) -> Ranking:
        allowed = set(candidates)
        scored = sorted(
            ((score, i) for i, score in catalog.index.scores(query).items() if i in allowed and score > 0),
            key=lambda pair: (-pair[0], pair[1]),
        )
        scores = tuple(s for s, _ in scored)
        top = scores[0] if scores else 0.0
        return Ranking(tuple(i for _, i in scored), scores, needs_tool_probability(top, query),
                       confidence(scores, shortlist))
