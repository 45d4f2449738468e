"""The conversation is the query: the newest user message read with the turns before it.

"Now do the same for staging", "close it", "what is it logging?" carry their tool in the turns
before. A `Window` holds the newest user message (what the ranker ranks, whatever its backend)
and, weighted by recency, what came before it: the names and arguments of recent tool calls,
the tools earlier searches found, the previous user message and the assistant's last words. The
context adds lexical evidence (BM25 over one weighted query, one pass over the index) to the
ranker's own order, on the ranker's scale; it never removes a tool the newest message ranks.

A newest message that leans on the turns before (a pronoun or "the first one" for an object, an
elliptic "and close it", a short imperative) after a turn that acted (a tool call, a request to
act) is a follow-up: its context weighs more, and the needs-tool gate reads it as a request to
act (`gate.follow_up`). Tool results are not read: they hold the world's data, not the user's
intent, and they can be large.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import pairwise

from proxy.jsontext import JsonObject
from proxy.messages import message_text, tool_calls
from proxy.tools.catalog import Catalog
from proxy.tools.ranking import Ranking, confidence, lexical_scores
from proxy.tools.text import query_terms, split_identifier

# Weights of the context's parts against the newest message's 1.0, tuned on bench/data/dev
# (window.jsonl, coverage) with bench/quality.py --tune; each older exchange counts DECAY as much.
CALL_WEIGHT = 0.5  # names and arguments of the tool calls since the previous user message
FOUND_WEIGHT = 0.3  # tools Keel's searches found along the conversation
USER_WEIGHT = 0.35  # the previous user message
REPLY_WEIGHT = 0.2  # the assistant's text since the previous user message
DECAY = 0.5
EXCHANGES = 3  # user messages read back (the newest included)
FOLLOW_UP_BOOST = 3.0  # a follow-up's context weighs this many times more
ARGUMENT_CHARS = 300  # of each call's arguments read


@dataclass(frozen=True)
class Window:
    newest: str  # the newest user message: what the ranker ranks
    context: tuple[tuple[str, float], ...] = ()  # (text, weight) of the turns before it, newest first
    acted: bool = False  # the turns before called a tool (or a search found one): a follow-up can lean on them

    @classmethod
    def of(cls, messages: Sequence[JsonObject], found: Sequence[str] = ()) -> Window:
        """The window of a chat-shaped conversation (`found`: tools Keel's searches found)."""
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if not users:
            return cls("")
        parts: list[tuple[str, float]] = []
        acted = bool(found)
        bounds = [*users[-EXCHANGES:], len(messages)]
        # the exchange under way (calls made since the newest user message), then the ones before, newest first
        for k, (start, end) in enumerate(reversed(list(pairwise(bounds)))):
            weight = DECAY ** max(0, k - 1)
            if k > 0:
                parts.append((message_text(messages[start]), USER_WEIGHT * weight))
            replies: list[str] = []
            for message in messages[start + 1 : end]:
                if message.get("role") != "assistant":
                    continue
                for call in tool_calls(message):
                    fn = call.get("function")
                    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                        acted = True
                        arguments = fn.get("arguments")
                        said = " ".join(split_identifier(fn["name"]))  # the server prefix too: its tools
                        if isinstance(arguments, str):
                            said += " " + arguments[:ARGUMENT_CHARS]
                        parts.append((said, CALL_WEIGHT * weight))
                replies.append(message_text(message))
            if any(replies):
                parts.append((" ".join(replies)[-1000:], REPLY_WEIGHT * weight))
        if found:
            parts.append((" ".join(" ".join(split_identifier(n)) for n in found[-5:]), FOUND_WEIGHT))
        return cls(message_text(messages[users[-1]]), tuple((t, w) for t, w in parts if t.strip()), acted)

    def terms(self) -> dict[str, float]:
        """The context's terms, each at the weight of the heaviest part holding it, less the newest
        message's own (the ranker has scored those)."""
        return dict(_weighted(self.context, self.newest))


@lru_cache(maxsize=256)
def _weighted(context: tuple[tuple[str, float], ...], newest: str) -> tuple[tuple[str, float], ...]:
    own = set(query_terms(newest))
    weights: dict[str, float] = defaultdict(float)
    for text, weight in context:
        for term in set(query_terms(text)):
            if term not in own and weight > weights[term]:
                weights[term] = weight
    return tuple(weights.items())


def context_scores(window: Window, catalog: Catalog) -> dict[int, float]:
    """BM25 of the context's weighted terms, per tool (one pass over the index's postings)."""
    weights = window.terms()
    if not weights:
        return {}
    return catalog.index.weighted_scores(weights)


def with_context(ranking: Ranking, window: Window, catalog: Catalog, candidates: Sequence[int], shortlist: int,
                 follow_up: bool, lexical: bool) -> Ranking:
    """The ranker's ranking of the newest message with the context's evidence added, on the
    ranker's own scale (BM25 units for the lexical ranker; else scaled so the context's best
    counts as much against the ranker's top as it does against the newest message's BM25 top)."""
    extra = context_scores(window, catalog)
    if not extra:
        return ranking
    allowed = set(candidates)
    extra = {i: s for i, s in extra.items() if i in allowed and s > 0}
    if not extra:
        return ranking
    weight = FOLLOW_UP_BOOST if follow_up else 1.0
    if lexical:
        scale = weight
    else:
        own_top = max(lexical_scores(window.newest, catalog).values(), default=0.0)
        reference = max(own_top, max(extra.values()))
        scale = weight * (ranking.top_score / reference if reference > 0 and ranking.top_score > 0 else 1.0)
    combined = dict(zip(ranking.order, ranking.scores, strict=True))
    for i, s in extra.items():
        combined[i] = combined.get(i, 0.0) + s * scale
    ordered = sorted(combined.items(), key=lambda pair: (-pair[1], pair[0]))
    scores = tuple(s for _, s in ordered)
    return replace(ranking, order=tuple(i for i, _ in ordered), scores=scores, confidence=confidence(scores, shortlist))
