"""What a caller's traffic teaches the ranker: the words of turns whose tool Keel did not ship.

When the model calls a tool Keel had deferred (found by Keel's `tool_search`), the turn's
words are remembered for that tool, per scope and per tool name, bounded (a few phrases per
tool, the newest kept). A scope is what every other stored state is kept by: the tenant, the
caller's credential and its end user (`Turn.owner`), so one caller's words never decide what
ships for another, and no caller can push tools into another's requests. A later request of
the scope worded like such a phrase *recalls* the tool: it ships beside the ranker's picks,
never instead of one (learning only adds; an extra tool costs a few hundred tokens, a displaced
one a failed task). A request sharing most of its words (at least
two) with a phrase also counts as a request to act, whatever the needs-tool gate made of it.
Phrases live in the store (shared by replicas, kept across restarts) and are read once per
scope and catalog per minute, never per request. What a caller can make Keel keep is bounded:
names no provider accepts (over `MAX_NAME` characters) are not learned, a tool's phrases
expire `ttl` after it was last learned, and past `TOOLS_PER_SCOPE` tools the least recently
learned go (both at the next reading of the phrases); the per-process index cache keeps
`INDEXES_KEPT` (scope, catalog) pairs.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from proxy.clock import SYSTEM_CLOCK, Clock
from proxy.stores import Hashes, StoreError, key
from proxy.tools.catalog import Catalog
from proxy.tools.lexical import LexicalIndex, term_frequencies
from proxy.tools.text import terms, turn_terms

PHRASES_PER_TOOL = 8  # the newest phrases kept per tool
TOOLS_PER_SCOPE = 2000  # learned tools kept per scope (the least recently learned go first)
RECALLED = 3  # at most this many tools recalled per request
SHARED_TERMS = 2  # a phrase recalls its tool when it shares at least this many terms with the request
REFRESH_SECONDS = 60.0
MAX_NAME = 256  # longer tool names are not learned (providers accept 64 to 128 characters)
INDEXES_KEPT = 1024  # (scope, catalog) indexes cached per process
BEFORE_PER_TOOL = 4  # learned predecessors kept per tool (the most often seen)
SEQUENCE_SEEN = 2  # a predecessor ships beside its tool once traffic has shown the pair this many times
log = logging.getLogger("keel.tools")


def _entry(raw: bytes) -> tuple[float, list[str]] | None:
    """A stored entry: when it was last learned and its phrases (None: another shape, absent)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("at"), (int, float)):
        return None
    return float(data["at"]), [p for p in data.get("phrases") or [] if isinstance(p, str)]


def scope_of(tenant: str, owner: str) -> str:
    """Whose lessons these are: the tenant and `Turn.owner` (a digest of credential and end user)."""
    return f"{tenant}:{owner}"


@dataclass(frozen=True, slots=True)
class Recall:
    tools: tuple[int, ...]  # catalog indexes, strongest match first
    alike: bool  # the request shares most of its words with a learned phrase: it asks to act


class LearnedPhrases:
    """Phrases per tool, and which tool models call before which (`learn_sequence`): the step a
    multi-step ask leaves unsaid (stage before commit, open the page before reading its console)."""

    def __init__(self, store: Hashes, ttl: float = 90 * 24 * 3600, clock: Clock = SYSTEM_CLOCK,
                 tools_per_scope: int = TOOLS_PER_SCOPE) -> None:
        self.store = store
        self.ttl = ttl
        self.clock = clock  # when a phrase was learned, how old a cached index is
        self.tools_per_scope = tools_per_scope
        self._sequences: OrderedDict[str, tuple[float, dict[str, dict[str, int]]]] = OrderedDict()
        self._indexes: OrderedDict[tuple[str, str],
                                   tuple[float, list[str], LexicalIndex | None, list[list[set[str]]]]] = OrderedDict()
        self._pruning: set[asyncio.Task[None]] = set()

    @staticmethod
    def _key(scope: str) -> str:
        return key(f"learned:{scope}", "phrases")

    async def learn(self, scope: str, tool: str, phrase: str) -> None:
        """Remember `phrase` (the turn's words) for `tool` in this scope (`scope_of`)."""
        phrase = " ".join(phrase.split())[:500]
        if not phrase or len(tool) > MAX_NAME:
            return
        raw = await self.store.hget(self._key(scope), tool)
        entry = _entry(raw) if raw else None
        phrases = [*(p for p in (entry[1] if entry else ()) if p != phrase), phrase][-PHRASES_PER_TOOL:]
        await self.store.hset(self._key(scope), tool, orjson.dumps({"at": self.clock.time(), "phrases": phrases}), self.ttl)
        for cached in [k for k in self._indexes if k[0] == scope]:
            del self._indexes[cached]  # seen on the next ranking in this process; other replicas within a minute

    @staticmethod
    def _sequence_key(scope: str) -> str:
        return key(f"learned:{scope}", "sequences")

    async def learn_sequence(self, scope: str, before: str, after: str) -> None:
        """The model called `after` right after `before` within one user turn: count the pair. Pairs
        already counted SEQUENCE_SEEN times in this process's view are not written again."""
        if before == after or len(before) > MAX_NAME or len(after) > MAX_NAME:
            return
        known = self._sequences.get(scope)
        if known is not None and known[1].get(after, {}).get(before, 0) >= SEQUENCE_SEEN:
            return
        raw = await self.store.hget(self._sequence_key(scope), after)
        data = orjson.loads(raw) if raw else {}
        counts = {k: int(v) for k, v in (data.get("before") or {}).items() if isinstance(v, int)} if isinstance(
            data, dict) else {}
        counts[before] = counts.get(before, 0) + 1
        kept = dict(sorted(counts.items(), key=lambda kv: -kv[1])[:BEFORE_PER_TOOL])
        await self.store.hset(self._sequence_key(scope), after, orjson.dumps({"at": self.clock.time(), "before": kept}))
        self._sequences.pop(scope, None)

    async def predecessors(self, scope: str) -> dict[str, dict[str, int]]:
        """Per tool, the tools models called right before it in this scope, with how often (read
        once a minute per scope; expired entries are skipped)."""
        cached = self._sequences.get(scope)
        if cached is not None and self.clock.monotonic() - cached[0] < REFRESH_SECONDS:
            return cached[1]
        try:
            raw = await self.store.hgetall(self._sequence_key(scope))
        except StoreError:
            return {}
        now, found = self.clock.time(), {}
        for name, value in raw.items():
            data = orjson.loads(value)
            if isinstance(data, dict) and now - float(data.get("at", now)) < self.ttl:
                found[name] = {k: int(v) for k, v in (data.get("before") or {}).items() if isinstance(v, int)}
        self._sequences[scope] = (self.clock.monotonic(), found)
        self._sequences.move_to_end(scope)
        while len(self._sequences) > INDEXES_KEPT:
            self._sequences.popitem(last=False)
        return found

    async def recall(self, scope: str, catalog: Catalog, query: str, candidates: Sequence[int]) -> Recall:
        """The tools whose learned phrases this request is worded like, to ship beside the ranker's."""
        index = await self._index(scope, catalog)
        if index is None:
            return Recall((), False)
        names, lexical, words = index
        asked = set(turn_terms(query))
        allowed = set(candidates)
        matched: list[tuple[float, int]] = []
        for doc, score in lexical.scores(query).items():
            position = catalog.by_name.get(names[doc])
            if position is None or position not in allowed:
                continue
            if any(len(asked & phrase) >= SHARED_TERMS for phrase in words[doc]):
                matched.append((score, position))
        matched.sort(key=lambda pair: (-pair[0], pair[1]))
        alike = any(len(asked & phrase) >= SHARED_TERMS and len(asked & phrase) >= len(asked) / 2
                    for phrases in words for phrase in phrases)
        return Recall(tuple(position for _, position in matched[:RECALLED]), alike)

    async def _index(self, scope: str, catalog: Catalog) -> tuple[list[str], LexicalIndex, list[list[set[str]]]] | None:
        cached = self._indexes.get((scope, catalog.key))
        if cached is not None and self.clock.monotonic() - cached[0] < REFRESH_SECONDS:
            return (cached[1], cached[2], cached[3]) if cached[2] is not None else None
        try:
            raw = await self.store.hgetall(self._key(scope))
        except StoreError:
            return None
        entries = {name: _entry(value) for name, value in raw.items()}
        now = self.clock.time()
        live = {name: e for name, e in entries.items() if e is not None and now - e[0] < self.ttl}
        kept = set(sorted(live, key=lambda name: -live[name][0])[:self.tools_per_scope])  # the newest learned
        self._prune(scope, [name for name in entries if name not in kept])
        names = sorted(name for name in kept if name in catalog.by_name)
        phrases = {name: live[name][1] for name in names}
        docs = [term_frequencies("", " ".join(phrases[name]), "") for name in names]
        words = [[set(terms(p)) for p in phrases[name]] for name in names]  # per tool, like the index's docs
        lexical = LexicalIndex(docs) if docs else None
        self._indexes[(scope, catalog.key)] = (self.clock.monotonic(), names, lexical, words)
        self._indexes.move_to_end((scope, catalog.key))
        while len(self._indexes) > INDEXES_KEPT:
            self._indexes.popitem(last=False)
        return (names, lexical, words) if lexical is not None else None

    def _prune(self, scope: str, names: list[str]) -> None:
        """Remove expired and least recently learned tools from the store, off the request path."""
        if not names:
            return

        async def prune() -> None:
            try:
                for name in names:
                    await self.store.hdel(self._key(scope), name)
            except Exception as exc:  # bookkeeping: the next reading tries again
                log.warning("learned_phrases_not_pruned", extra={"tenant": scope.rsplit(":", 1)[0],
                                                                 "error": repr(exc)})

        task = asyncio.get_running_loop().create_task(prune())
        self._pruning.add(task)
        task.add_done_callback(self._pruning.discard)
