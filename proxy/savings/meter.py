"""Per turn: what Keel sent, what the client sent, what the upstream used → one `TurnFacts`.

Nothing here runs before the upstream answers: the meter keeps the two turns (the client's,
as parsed, and Keel's, as planned) and, once the usage is known, works out the rest in a
background task (token counts on a worker thread, one store read for the client's previous
request, the ledger's writes), so a turn's latency never pays for its own accounting.

The ranker's scores and a model-backed ranker's usage reach the meter through `TRACE`, a
context variable the app sets per turn and `TracedRanker` writes to: the tool planner needs
no change to report them.

A conversation's turns settle in the order they started (`Meter.turn` chains each to the one
before it), so one turn's estimate never reads the client's previous request before that
request's own turn has stored it, and the page lists turns in order, however the background
work is timed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson

from proxy.jsontext import Json, JsonObject
from proxy.savings.facts import TurnFacts
from proxy.savings.ledger import Ledger
from proxy.stores import Set, key
from proxy.tokens import TokenCounter
from proxy.tools.catalog import Catalog
from proxy.tools.ranking import LexicalRanker, Ranker, Ranking
from proxy.turn import Turn
from proxy.usage import Usage

log = logging.getLogger("keel.savings")
PREFIX_TTL = 24 * 3600  # the client's previous request, for the direct cache estimate
CACHE_GAP = 3600  # seconds after which no provider still holds a prefix
OPENAI_MIN, OPENAI_STEP = 1024, 128  # OpenAI caches prefixes of at least 1024 tokens, in steps of 128
ORDER_WAIT = 30.0  # seconds a turn's settling waits at most for the turn before it
ORDER_KEEP = 10_000  # conversations whose last turn's settling this process remembers


@dataclass
class Trace:
    """What the rankers said during one turn's planning (scores by tool name, a model's usage)."""

    planning: bool = True
    scores: dict[str, float] = field(default_factory=dict)
    usage: list[Json] = field(default_factory=list)

    def add(self, catalog: Catalog, ranking: Ranking) -> None:
        if ranking.usage:
            self.usage.append(ranking.usage)
        if self.planning:
            for index, score in zip(ranking.order, ranking.scores, strict=False):
                name = catalog.entries[index].name
                self.scores[name] = max(score, self.scores.get(name, score))


TRACE: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("keel_trace", default=None)


def _note(catalog: Catalog, ranking: Ranking) -> Ranking:
    trace = TRACE.get()
    if trace is not None:
        trace.add(catalog, ranking)
    return ranking


class TracedLexicalRanker(LexicalRanker):
    """BM25, reporting its scores to the turn's trace (still a LexicalRanker: no deadline needed)."""

    def rank_now(self, query: str, catalog: Catalog, candidates: Sequence[int], shortlist: int) -> Ranking:
        return _note(catalog, super().rank_now(query, catalog, candidates, shortlist))


class TracedRanker:
    """Any ranker, reporting its scores and usage to the turn's trace."""

    def __init__(self, inner: Ranker) -> None:
        self.inner = inner

    async def rank(self, query: str, catalog: Catalog, candidates: Sequence[int], shortlist: int) -> Ranking:
        return _note(catalog, await self.inner.rank(query, catalog, candidates, shortlist))


def traced(ranker: Ranker) -> Ranker:
    return TracedLexicalRanker() if type(ranker) is LexicalRanker else TracedRanker(ranker)


class TokenCache:
    """Token counts of texts by digest (bounded), counted on a worker thread.

    A value given as itself (`counted`) is known by identity once dumped: a tools array a client
    resends is the same list each time (`jsontext.Resent`), so its 200 KB are dumped and hashed once
    per array, not once per turn (held: ids stay its; at most `SAME` of them)."""

    SAME = 32

    def __init__(self, counter: TokenCounter, size: int = 50_000) -> None:
        self.counter = counter
        self.size = size
        self._known: OrderedDict[bytes, int] = OrderedDict()
        self._same: OrderedDict[int, tuple[Json, bytes, bytes]] = OrderedDict()  # id -> (value, text, digest)

    async def counts(self, texts: Sequence[bytes]) -> list[tuple[bytes, int]]:
        return await self._count([(t, _digest(t)) for t in texts])

    async def counted(self, values: Sequence[Json]) -> list[tuple[bytes, int]]:
        """`counts` of each value's JSON text (orjson's), a list value's text and digest made once."""
        return await self._count([self._text(v) for v in values])

    def _text(self, value: Json) -> tuple[bytes, bytes]:
        if not isinstance(value, list):
            text = orjson.dumps(value)
            return text, _digest(text)
        found = self._same.get(id(value))
        if found is not None and found[0] is value:
            self._same.move_to_end(id(value))
            return found[1], found[2]
        text = orjson.dumps(value)
        digest = _digest(text)
        self._same[id(value)] = (value, text, digest)
        while len(self._same) > self.SAME:
            self._same.popitem(last=False)
        return text, digest

    async def _count(self, texts: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, int]]:
        missing = {d: t for t, d in texts if d not in self._known}
        if missing:
            counted = await asyncio.to_thread(lambda: {d: self.counter.count(t.decode(errors="replace"))
                                                       for d, t in missing.items()})
            self._known.update(counted)
            while len(self._known) > self.size:
                self._known.popitem(last=False)
        return [(d, self._known.get(d, 0)) for _, d in texts]


def _digest(text: bytes) -> bytes:
    return hashlib.blake2b(text, digest_size=8).digest()


def _marks(body: JsonObject) -> int:
    """cache_control breakpoints on the tools and message content parts of a view body."""
    tools = sum(1 for t in body.get("tools") or [] if isinstance(t, dict) and "cache_control" in t)
    parts = sum(1 for m in body.get("messages") or [] if isinstance(m, dict) and isinstance(m.get("content"), list)
                for p in m["content"] if isinstance(p, dict) and "cache_control" in p)
    return tools + parts


def _names(calls: Sequence[Json]) -> tuple[str, ...]:
    names = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.append(function["name"])
    return tuple(names)


class Meter:
    """Shared by a process: makes one `TurnMeter` per planned turn."""

    def __init__(self, ledger: Ledger, tokens: TokenCounter) -> None:
        self.ledger = ledger
        self.tokens = TokenCache(tokens)
        self._last: OrderedDict[str, asyncio.Future[None]] = OrderedDict()  # conversation -> its newest turn's settling

    def turn(self, parsed: Turn, planned: Turn, trace: Trace | None) -> TurnMeter:
        location = planned.location
        conversation = f"{location.chain.seed}/{location.conversation}" if location is not None else ""
        before = self._last.pop(conversation, None)
        settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last[conversation] = settled
        if len(self._last) > ORDER_KEEP:
            self._last.popitem(last=False)
        return TurnMeter(self, parsed, planned, trace, before, settled)


class TurnMeter:
    def __init__(self, meter: Meter, parsed: Turn, planned: Turn, trace: Trace | None,
                 before: asyncio.Future[None] | None = None, settled: asyncio.Future[None] | None = None) -> None:
        self.meter, self.parsed, self.planned, self.trace = meter, parsed, planned, trace
        self.started = time.time()
        self.before, self.settled = before, settled
        self.finished = False
        self._remember: tuple[Set, ...] = ()  # this request, for the next turn's estimate: written with the ledger's

    def finish(self, usage: Usage, first: Usage | None, rounds: int, calls: Sequence[Json],
               found: Sequence[str]) -> None:
        """The turn's answer is complete: work out and store its figures in the background."""
        self.finished = True
        self.meter.ledger.spawn(self._settle(usage, first or usage, rounds, _names(calls), tuple(found)))

    def ended(self) -> None:
        """The exchange is over: a turn with no usage to settle (an error, a lost client, a reply
        without usage) lets the next turn of its conversation settle at once."""
        if not self.finished and self.settled is not None and not self.settled.done():
            self.settled.set_result(None)

    async def _settle(self, usage: Usage, first: Usage, rounds: int, called: tuple[str, ...],
                      found: tuple[str, ...]) -> None:
        try:
            if self.before is not None and not self.before.done():  # the turn before settles first
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self.before), ORDER_WAIT)
            facts = await self.facts(usage, first, rounds, called, found)
            await self.meter.ledger.write(facts, self._remember)
        finally:
            if self.settled is not None and not self.settled.done():
                self.settled.set_result(None)
        if not log.isEnabledFor(logging.INFO):  # the line's fields are built only for a level that shows it
            return
        log.info("turn_savings", extra={
            "tenant": facts.tenant, "request_id": facts.request_id, "conversation": facts.conversation,
            "input_direct": facts.direct.input, "input_keel": usage.input, "cached_direct": facts.direct_cached,
            "cached_keel": usage.cached, "usd_direct": round(facts.direct_usd, 6), "usd_keel": round(facts.keel_usd, 6),
            "tool_search_rounds": rounds, "tools_surfaced": len(facts.surfaced) + len(found), "tools_called": called})

    async def facts(self, usage: Usage, first: Usage, rounds: int, called: tuple[str, ...],
                    found: tuple[str, ...]) -> TurnFacts:
        parsed, planned = self.parsed, self.planned
        location = planned.location
        assert location is not None
        plan = getattr(planned.responder, "plan", None)
        client_tools = parsed.body.get("tools")
        keel_tools = planned.body.get("tools")
        deferred = 0
        if isinstance(client_tools, list) and keel_tools is not client_tools:
            (_, theirs), (_, ours) = await self.meter.tokens.counted([client_tools, keel_tools or []])
            deferred = max(0, theirs - ours)
        fraction = await self._shared_fraction(location.chain.seed, location.conversation)
        direct_input = first.input + deferred
        direct_cached = self._direct_cached(fraction, direct_input)
        judgments = self.trace.usage if self.trace else []
        select_model = planned.tenant.tools.select.model
        judgment_usd = sum(planned.tenant.tools.judgment_cost(select_model, u) or 0.0 for u in judgments)
        scores = dict(self.trace.scores) if self.trace else {}
        surfaced = tuple(plan.surfaced) if plan is not None else ()
        key_added = planned.body.get("prompt_cache_key") if "prompt_cache_key" not in parsed.body else None
        model = str(parsed.body.get("model") or "")
        last = parsed.messages[-1] if parsed.messages else {}
        kind = "tool_results" if isinstance(last, dict) and last.get("role") == "tool" else location.kind.value
        facts = TurnFacts(
            at=self.started, tenant=planned.tenant.id, conversation=location.conversation,
            request_id=planned.request_id, shape=planned.shape.name, model=model, kind=kind,
            usage=usage, first=first, segment=location.segment, stream=planned.stream, rounds=rounds,
            offered=plan.offered if plan is not None else len(client_tools or []) if isinstance(client_tools, list)
            else 0, surfaced=surfaced, found=found, called=called,
            tools_outcome=plan.outcome if plan is not None else None,
            scores={n: round(s, 4) for n, s in scores.items() if n in surfaced},
            deferred_tokens=deferred, shared_fraction=round(fraction, 4), direct_cached=direct_cached,
            breakpoints=max(0, _marks(planned.body) - _marks(parsed.body)),
            prompt_cache_key=key_added if isinstance(key_added, str) else None,
            context_update=planned.record.update_text,
            notes={k: v for k, v in planned.notes.items() if v}, judgment_usd=judgment_usd)
        return facts.settled(planned.tenant.prices.price(model))

    def _direct_cached(self, fraction: float, direct_input: int) -> int:
        """What the client's own request would have read from the cache: the share it repeats of its
        previous request, by the upstream's rules (breakpoints only for Anthropic-style upstreams)."""
        if fraction <= 0:
            return 0
        if self.parsed.caches_at_breakpoints and b'"cache_control"' not in self.parsed.raw:
            return 0  # caches only at breakpoints, and the client set none
        shared = int(fraction * direct_input)
        if self.parsed.caches_at_breakpoints:
            return shared
        return 0 if shared < OPENAI_MIN else shared - shared % OPENAI_STEP

    def _elements(self) -> list[Json]:
        """The client's request in the order a provider reads it: the tools, then each message."""
        tools = self.parsed.body.get("tools")
        head: list[Json] = [tools] if isinstance(tools, list) and tools else []
        return head + list(self.parsed.messages)

    async def _shared_fraction(self, seed: str, conversation: str) -> float:
        """How much of the client's request (by tokens) its previous request in the conversation began with."""
        counted = await self.meter.tokens.counted(self._elements())
        store = self.meter.ledger.store
        where = key(seed, "savings-prefix", conversation)
        raw = await store.get(where)
        self._remember = (Set(where, orjson.dumps({"at": self.started, "elements": [[d.hex(), n] for d, n in counted]}),
                              PREFIX_TTL),)
        total = sum(n for _, n in counted)
        if raw is None or total == 0:
            return 0.0
        previous = orjson.loads(raw)
        if self.started - float(previous.get("at", 0)) > CACHE_GAP:
            return 0.0
        shared = 0
        for (digest, tokens), (before, _) in zip(counted, previous.get("elements") or [], strict=False):
            if digest.hex() != before:
                break
            shared += tokens
        return shared / total
