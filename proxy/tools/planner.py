"""The tool planner: defer the catalog, surface what the turn needs, add `tool_search`.

Always surfaced: tools named in the newest user message, `always` tools, tools used or
found earlier in the conversation, the tools `tool_choice` forces or allows, and tools whose
schema is cheaper than a search. The rest are ranked; a needs-tool gate keeps a thanks-you from
surfacing anything, unless the client requires a tool call (`tools/choice.py`). Every tool stays reachable: what is not surfaced is named in
`tool_search`'s description (invariant 3). A ranking that fails or times out leaves only the
always-surfaced tools, never a failed turn. Selection needs no store: when stored state cannot
be read (the store down or slow, this stage failed or overran), `afresh` ranks the turn per turn
and lexically from the request alone, so a store fault costs the block's stability, never a
request forty times larger than the one Keel would have sent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from proxy import jsontext
from proxy.config import TenantConfig
from proxy.conversations import Conversations, TurnKind
from proxy.hidden import found_tools, splice
from proxy.jsontext import JsonObject
from proxy.messages import called_in_order, called_tools, newest_user_text, tool_calls
from proxy.metrics import Metrics
from proxy.records import RecordPatch, TurnRecord
from proxy.stores import KeyValue, key
from proxy.tools.catalog import Catalog, CatalogCache, ToolEntry
from proxy.tools.choice import read_choice
from proxy.tools.deferral import client_deferral, client_searches
from proxy.tools.gate import FOLLOW_UP_FLOOR, follow_up
from proxy.tools.learned import SEQUENCE_SEEN, LearnedPhrases, scope_of
from proxy.tools.plan import ToolPlan
from proxy.tools.ranking import GuardedRanker, LexicalRanker, Ranker, Ranking, standing_out
from proxy.tools.search import SEARCH_TOOL, call_tool, search_tool
from proxy.tools.stability import PER_TURN, BlockPolicy, Choice, FrozenBlock, StoredBlock, TurnTools, policy_for
from proxy.tools.window import Window, with_context
from proxy.turn import Responder, Turn
from proxy.updates import prepend_updates

log = logging.getLogger("keel.tools")

# How the ranking becomes a shipped set. Tuned together with the rankers' scores and the
# needs-tool gate's weights (`tools/gate.py`), not per deployment: a tenant sets how many tools
# it wants (`select.shortlist`), these say how sure the ranking must be. `bench/tools.py`
# measures what they cut; they were config keys once (`config.py` MOVED explains that to a
# config that still sets one). A planner reads them through its `Tuning`; a test passes its own.
NEEDS_TOOL_THRESHOLD = 0.5  # P(the turn needs a tool) below this: only pinned and recalled tools ship
LOW_CONFIDENCE_BELOW = 0.25  # a ranking whose confidence (1 - score[shortlist]/score[0]) is below this, or
LOW_CONFIDENCE_EXTRA = 3  # unmeasurable, ships this many more tools than the shortlist
CUT_AT_DROP = 0.2  # ship only the tools before the largest relative score drop when it is at least this (0: off)
PREREQUISITE_LEADS = 2  # the leading picks whose unsaid previous step ships with them
PREREQUISITES = 2  # at most this many such steps per turn
LEXICAL = LexicalRanker()  # what `afresh` ranks with: in process, nothing to wait for


@dataclass(frozen=True)
class Tuning:
    """The constants above, as one planner reads them (`ToolPlanner(tuning=…)`)."""

    needs_tool_threshold: float = NEEDS_TOOL_THRESHOLD
    low_confidence_below: float = LOW_CONFIDENCE_BELOW
    low_confidence_extra: int = LOW_CONFIDENCE_EXTRA
    cut_at_drop: float = CUT_AT_DROP


def required_call(ranking: Ranking, candidates: Sequence[int], shortlist: int,
                  threshold: float = NEEDS_TOOL_THRESHOLD) -> Ranking:
    """A ranking for a turn whose client requires a tool call: the gate's "no tool" does not hold,
    and a ranking that found fewer than `shortlist` tools is filled in the client's own order (no
    evidence: the client's order is the best prior), so the model has client tools to call, not
    only Keel's tool_search."""
    order = list(ranking.order)
    floor = ranking.scores[-1] if ranking.scores else 1.0
    filled = [i for i in candidates if i not in set(order)][: max(0, shortlist - len(order))]
    return replace(ranking, order=(*order, *filled), scores=(*ranking.scores, *(floor for _ in filled)),
                   needs_tool=max(ranking.needs_tool, threshold))


def tools_update(entries: Sequence[ToolEntry]) -> str:
    schemas = [e.schema() for e in entries]
    return ("<tools_update>\nThese tools are not in your tool list; call them through call_tool with their name "
            "and arguments:\n" + jsontext.dumps(schemas).decode() + "\n</tools_update>")


def generic_calls(messages: list[JsonObject], records: Sequence[TurnRecord]) -> list[JsonObject]:
    """Real calls the client got back in the generic `call_tool` form the model produced."""
    dispatched: JsonObject = {}
    for record in records:
        dispatched.update(record.dispatched)
    if not dispatched:
        return messages
    out = []
    for message in messages:
        calls = tool_calls(message)
        if message.get("role") == "assistant" and any(c.get("id") in dispatched for c in calls):
            calls = [{**c, "function": dispatched[c["id"]]} if isinstance(c, dict) and c.get("id") in dispatched else c
                     for c in message["tool_calls"]]
            message = {**message, "tool_calls": calls}
        out.append(message)
    return out


class _NoStore:
    """Without a store, segment stability cannot freeze anything: every turn plans afresh."""

    async def get(self, key: str) -> bytes | None:
        return None

    async def set_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        return False

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        return None


class ToolPlanner:
    name = "tools"
    after: tuple[str, ...] = ()  # first: it splices hidden exchanges back by the client's own indexes

    def __init__(self, catalogs: CatalogCache, ranker_for: Callable[[TenantConfig], Ranker], metrics: Metrics,
                 responder_for: Callable[[ToolPlan, Ranker], Responder], store: KeyValue | None = None,
                 ttl: float = 30 * 24 * 3600, conversations: Conversations | None = None,
                 learned: LearnedPhrases | None = None, tuning: Tuning | None = None) -> None:
        self.conversations = conversations
        self.tuning = tuning or Tuning()
        self.learned = learned
        self.store: KeyValue | _NoStore = store if store is not None else _NoStore()
        self.ttl = ttl
        self.catalogs = catalogs
        self.ranker_for = ranker_for
        self.metrics = metrics
        self.responder_for = responder_for

    def applies(self, request: Turn) -> bool:
        return self.for_tenant(request.tenant)

    def for_tenant(self, tenant: TenantConfig) -> bool:
        return tenant.tools.enabled

    async def plan(self, request: Turn) -> Turn:
        return await self._plan(request, stored=True)

    async def afresh(self, request: Turn) -> Turn:
        """The turn planned without stored state (`pipeline.PlansAfresh`): no store call, per turn,
        ranked lexically (no backend to wait for); hidden exchanges the location already read are
        still spliced back."""
        return await self._plan(request, stored=False)

    async def _plan(self, request: Turn, stored: bool) -> Turn:
        cfg = request.tenant.tools
        if client_searches(request.body):  # the client finds its own deferred tools: its tools go as sent
            return request
        deferral = client_deferral(request.body)
        if deferral is not None:  # the client deferred tools itself
            if request.tenant.upstream.searches_natively(request.shape.native_search_host):
                return request  # the provider searches: the request goes as the client wrote it
            body = {**request.body, "tools": list(deferral.loaded)}
            if "foreign_tools" in body:  # the codec renders these (chat has none)
                body["foreign_tools"] = list(deferral.foreign)
            request = request.with_body(body)
        tools = request.body.get("tools")
        too_few = isinstance(tools, list) and len(tools) < cfg.defer.min_tools and deferral is None
        if not cfg.defer.enabled or not isinstance(tools, list) or too_few:
            return request
        if stored:
            request = await self._continue_stored(request)
        catalog = await self.catalogs.get_async(tools)
        if catalog is None or SEARCH_TOOL in catalog.by_name:
            return request  # not function tools, or the client has its own tool_search: leave them alone
        records = request.location.records if request.location else ()
        policy = policy_for(request) if stored else PER_TURN
        messages = splice(request.messages, records, catalog.key)
        query = newest_user_text(messages)
        pinned = self._pinned(request, catalog, query, messages, found_tools(records))
        if deferral is not None:  # what the client kept loaded stays loaded
            pinned |= {e.name for e in catalog.entries if e.name not in deferral.deferred}
        if policy.dispatch:
            messages = generic_calls(messages, records)
        return await policy.plan(self, TurnTools(request, catalog, messages, query, frozenset(pinned), stored))

    # The work the stability policies ask for (proxy.tools.stability.Planning).

    async def fresh(self, turn: TurnTools, policy: BlockPolicy, keep_empty: bool = False) -> Choice | None:
        request, catalog = turn.request, turn.catalog
        records = request.location.records if request.location else ()
        window = Window.of(turn.messages, found_tools(records))
        surfaced, deferred, outcome = await self._select(request, catalog, turn.query, set(turn.pinned), turn.stored,
                                                         window)
        self._count(request, catalog, surfaced, deferred)
        if not deferred and not keep_empty:
            return None
        search = request.tenant.tools.search
        block = [catalog.entries[catalog.by_name[n]].tool for n in surfaced]
        block.append(search_tool(tuple(deferred), search.listing))
        if policy.dispatch:
            block.append(call_tool())
        return Choice(surfaced, deferred, block, outcome)

    def unchanged(self, turn: TurnTools) -> Turn:
        request = turn.request
        return request if turn.messages == request.messages else request.with_body(
            {**request.body, "messages": turn.messages})

    async def freeze(self, turn: TurnTools, choice: Choice, policy: BlockPolicy) -> Turn:
        frozen = FrozenBlock(turn.catalog.key, choice.block, choice.surfaced, choice.deferred)
        stored = await self._freeze(turn.request, turn.catalog, frozen)
        if stored is not frozen:  # another replica froze this segment first: use its block
            return self.grow(turn, stored, policy)
        # the turn record marks this turn as the segment's start, so the next turn finds the block
        return self.planned(turn, choice, policy).with_record(RecordPatch(tool_block=()))

    async def rechoose(self, turn: TurnTools, choice: Choice, policy: BlockPolicy) -> Turn:
        frozen = FrozenBlock(turn.catalog.key, choice.block, choice.surfaced, choice.deferred)
        await self.store.set(self._frozen_key(turn.request), await self._stored(turn.request, turn.catalog, frozen),
                             self.ttl)
        planned = self.planned(turn, choice, policy)
        return planned.with_note(tool_block_rechosen=True).with_record(RecordPatch(tool_block=()))

    async def _continue_stored(self, request: Turn) -> Turn:
        """Responses: a `previous_response_id` a Keel-answered stream showed the client is the
        first of its rounds; the upstream stored the whole exchange under the last one."""
        shown = request.body.get("previous_response_id")
        if not request.shape.continues_by_id or not isinstance(shown, str) or self.conversations is None:
            return request
        stored = await self.conversations.stored_response(request.owner + "/" + request.tenant.id, shown)
        return request if stored is None else request.with_body({**request.body, "previous_response_id": stored})

    def planned(self, turn: TurnTools, choice: Choice, policy: BlockPolicy, announced: Sequence[str] = ()) -> Turn:
        """The turn with this block and its messages, and the responder that answers tool_search.
        `announced`: tools outside the block whose schemas the model has read in a tools update."""
        request, catalog = turn.request, turn.catalog
        records = request.location.records if request.location else ()
        shown = frozenset(found_tools(records)) | frozenset(announced)
        plan = ToolPlan(catalog, tuple(choice.surfaced), tuple(choice.deferred), len(catalog.entries),
                        choice.outcome, policy.dispatch, shown)
        body = {**request.body, "tools": choice.block, "messages": turn.messages}
        planned = request.with_body(body, responder=self.responder_for(plan, self.ranker(request.tenant)))
        return planned.with_headers(**{"x-keel-tools": f"{len(choice.surfaced)}/{len(catalog.entries)}"})

    async def _select(self, request: Turn, catalog: Catalog, query: str, pinned: set[str],
                      stored: bool = True, window: Window | None = None) -> tuple[list[str], list[str], str]:
        from proxy.tools.text import clauses

        select, tuning = request.tenant.tools.select, self.tuning
        candidates = [i for i, e in enumerate(catalog.entries) if e.name not in pinned]
        ranker = self.ranker(request.tenant) if stored else LEXICAL
        ranking, outcome = await self._rank(request, catalog, query, candidates, ranker)
        if ranking is not None and window is not None and window.context:  # the conversation is the query
            follows = follow_up(query, window.acted)
            lexical = ranking.fallback or isinstance(ranker, LexicalRanker)
            ranking = with_context(ranking, window, catalog, candidates, select.shortlist, follows, lexical)
            if follows:
                ranking = replace(ranking, needs_tool=max(ranking.needs_tool, FOLLOW_UP_FLOOR))
        recalled: tuple[int, ...] = ()
        if ranking is not None and self.learned is not None and select.learn and stored:
            recall = await self.learned.recall(scope_of(request.tenant.id, request.owner), catalog, query, candidates)
            recalled = recall.tools
            if recall.alike and ranking.needs_tool < tuning.needs_tool_threshold:
                ranking = replace(ranking, needs_tool=tuning.needs_tool_threshold)
        choice = read_choice(request.body.get("tool_choice"))
        if ranking is not None and choice.required and not choice.named:
            ranking = required_call(ranking, candidates, select.shortlist, tuning.needs_tool_threshold)
        selected: list[str] = []
        if ranking is not None:
            withheld = ranking.needs_tool < tuning.needs_tool_threshold
            self.metrics.tool_gate.labels(request.tenant.id, "withheld" if withheld else "shipped").inc()
        if ranking is not None and ranking.needs_tool >= tuning.needs_tool_threshold:
            width = select.shortlist
            if ranking.confidence is None or ranking.confidence < tuning.low_confidence_below:
                width += tuning.low_confidence_extra
            width = standing_out(ranking.scores, width, tuning.cut_at_drop)
            selected = [catalog.entries[i].name for i in ranking.order[:width]]
            selected += [catalog.entries[i].name for i in recalled if catalog.entries[i].name not in selected]
            steps = clauses(query)
            if len(steps) > 1:  # a multi-step ask: every step's best tools, not only the whole's
                selected += await self._steps(request, catalog, steps, candidates, selected, ranker)
            selected += await self._prerequisites(request, catalog, selected, pinned, stored)
        elif ranking is not None and not ranking.fallback:
            outcome = "no_tool_needed"
        surfaced = sorted(pinned | set(selected))
        deferred = sorted(e.name for e in catalog.entries if e.name not in pinned and e.name not in selected)
        return surfaced, deferred, outcome

    async def _prerequisites(self, request: Turn, catalog: Catalog, selected: Sequence[str], pinned: set[str],
                             stored: bool) -> list[str]:
        """The unsaid step before the leading picks: the tool models of this scope call right before
        one (learned from traffic, `LearnedPhrases.learn_sequence`, once seen SEQUENCE_SEEN times),
        else the tools of its server its own description names. At most PREREQUISITES; none the
        history already called (pinned)."""
        leads = list(selected[:PREREQUISITE_LEADS])
        taken = set(selected) | pinned
        added: list[str] = []
        learned: dict[str, dict[str, int]] = {}
        if self.learned is not None and request.tenant.tools.select.learn and stored:
            learned = await self.learned.predecessors(scope_of(request.tenant.id, request.owner))
        companions = catalog.companions()
        for lead in leads:
            seen = sorted(learned.get(lead, {}).items(), key=lambda kv: -kv[1])
            before = [name for name, count in seen if count >= SEQUENCE_SEEN]
            for name in [*before, *companions.get(lead, ())[:PREREQUISITES]]:
                if name in catalog.by_name and name not in taken and len(added) < PREREQUISITES:
                    added.append(name)
                    taken.add(name)
        return added

    async def _steps(self, request: Turn, catalog: Catalog, steps: Sequence[str], candidates: list[int],
                     selected: Sequence[str], ranker: Ranker) -> list[str]:
        """The best few tools of each step ranked on its own (at most 6 steps, 3 tools each), so
        a shortlist the whole ask clusters on one step still ships the others'."""
        added: list[str] = []
        for step in steps[:6]:
            ranking, _ = await self._rank(request, catalog, step, candidates, ranker)
            if ranking is None:
                continue
            width = standing_out(ranking.scores, 3, self.tuning.cut_at_drop)
            added += [n for n in (catalog.entries[i].name for i in ranking.order[:width])
                      if n not in selected and n not in added]
        return added

    def cheaper(self, turn: TurnTools, frozen: FrozenBlock, fresh: list[JsonObject]) -> bool:
        """Auto stability: is a freshly chosen block expected to cost less than the cached one?

        Keeping the frozen block, the tools and the history before this turn are read from the
        provider's cache at `cache.read_price`; a fresh block misses everything after it. Sizes
        are estimated from characters, never from token counts a background thread may or may
        not have filled in yet: every replica decides the same for the same turn."""
        request, catalog = turn.request, turn.catalog
        history = sum(len(jsontext.dumps(m)) for m in turn.messages) // 4

        def tokens(block: list[JsonObject]) -> int:
            names = [t["function"]["name"] for t in block]
            known = sum(e.chars for e in catalog.entries_for(n for n in names if n in catalog.by_name)) // 4
            extra = sum(len(jsontext.dumps(t)) // 4 for t in block if t["function"]["name"] not in catalog.by_name)
            return known + extra

        keep = request.tenant.cache.read_price * (tokens(frozen.block) + history)
        return tokens(fresh) + history < keep

    # Segment stability: the block chosen at the segment's start stays; tools needed later are
    # appended once, in the order they were first needed, never reordered or removed.

    def _frozen_key(self, request: Turn) -> str:
        assert request.location is not None
        return key(request.location.chain.seed, "toolblock", request.location.segment)

    async def frozen(self, turn: TurnTools) -> FrozenBlock | None:
        request = turn.request
        if request.location is None or (request.location.kind is TurnKind.NEW and not request.location.records):
            return None
        raw = await self.store.get(self._frozen_key(request))
        return await self._read_frozen(request, turn.catalog, raw) if raw else None

    async def _freeze(self, request: Turn, catalog: Catalog, frozen: FrozenBlock) -> FrozenBlock:
        stored = await self._stored(request, catalog, frozen)
        if await self.store.set_if_absent(self._frozen_key(request), stored, self.ttl):
            return frozen
        raw = await self.store.get(self._frozen_key(request))
        found = await self._read_frozen(request, catalog, raw) if raw else None
        if found is None:  # another catalog's block, or one whose content is gone: this one replaces it
            await self.store.set(self._frozen_key(request), stored, self.ttl)
        return found or frozen

    # A frozen block is stored small (`StoredBlock`): Keel's own tools (tool_search's listing is
    # most of the bytes) in `Blobs`, shared by every conversation that froze the same block.

    async def _stored(self, request: Turn, catalog: Catalog, frozen: FrozenBlock) -> bytes:
        surfaced, block = frozen.surfaced, frozen.block
        blobs = self.conversations.blobs if self.conversations is not None else None
        own = [t.get("function", {}).get("name") for t in block[: len(surfaced)]] == surfaced and all(
            block[i] is catalog.entries[catalog.by_name[n]].tool for i, n in enumerate(surfaced) if n in catalog.by_name)
        shown = set(surfaced)
        rest = sorted(n for n in catalog.by_name if n not in shown)
        if blobs is None or not own or list(frozen.deferred) != rest:
            return StoredBlock(frozen.catalog, tuple(surfaced), None, tuple(block), tuple(frozen.deferred)).to_stored()
        keel = block[len(surfaced):]
        ref = await blobs.put_list(request.content_scope, keel, jsontext.dumps)
        return StoredBlock(frozen.catalog, tuple(surfaced), ref).to_stored()

    async def _read_frozen(self, request: Turn, catalog: Catalog, raw: bytes) -> FrozenBlock | None:
        stored = StoredBlock.from_stored(raw)  # another format version: absent, the segment chooses afresh
        if stored is None or stored.catalog != catalog.key:
            return None
        if stored.keel is None:
            return FrozenBlock(stored.catalog, list(stored.block), list(stored.surfaced), list(stored.deferred))
        if self.conversations is None or any(n not in catalog.by_name for n in stored.surfaced):
            return None
        keel = await self.conversations.blobs.load(request.content_scope, stored.keel, jsontext.loads)
        if keel is None:  # its content is gone: the segment chooses a block afresh (one cache miss)
            return None
        surfaced = list(stored.surfaced)
        block = [*(catalog.entries[catalog.by_name[n]].tool for n in surfaced), *keel]
        shown = set(surfaced)
        return FrozenBlock(catalog.key, block, surfaced, sorted(n for n in catalog.by_name if n not in shown))

    def grow(self, turn: TurnTools, frozen: FrozenBlock, policy: BlockPolicy) -> Turn:
        request, catalog = turn.request, turn.catalog
        assert request.location is not None
        earlier = request.location.earlier_records
        appended: list[str] = next((list(r.tool_block) for r in reversed(earlier) if r.tool_block is not None), [])
        known = len(appended)
        base = set(frozen.surfaced) | set(appended)
        new = [n for n in self._ordered(set(turn.pinned), turn.messages, request) if n not in base]
        if policy.dispatch:  # the block never grows
            return self._announce(turn, frozen, appended, new, policy)
        appended += new
        block = [*frozen.block, *(catalog.entries[catalog.by_name[n]].tool for n in appended)]
        surfaced = [*frozen.surfaced, *appended]
        deferred = [n for n in frozen.deferred if n not in set(appended)]
        self._count(request, catalog, surfaced, deferred)
        planned = self.planned(turn, Choice(surfaced, deferred, block, "segment"), policy)
        planned = planned.with_note(tool_block_grew=True) if len(appended) > known else planned
        return planned.with_record(RecordPatch(tool_block=tuple(appended)))

    def _announce(self, turn: TurnTools, frozen: FrozenBlock, announced: list[str], new: list[str],
                  policy: BlockPolicy) -> Turn:
        """Dispatch: tools needed now but outside the frozen block are not added to it; their
        schemas go to the newest user message as a <tools_update> (the tail of the prompt), so
        the model can call them through call_tool without a search round trip."""
        request, catalog = turn.request, turn.catalog
        assert request.location is not None
        newest = request.location.chain.newest_user
        updates = {r.chain_hash: r.tools_update for r in request.location.records if r.tools_update}
        patch = RecordPatch()
        if request.location.kind is not TurnKind.REGENERATED and newest is not None:
            seen = set(found_tools(request.location.records))  # a search answer showed them: in the history already
            announce = [n for n in new if n not in seen]
            text = tools_update(catalog.entries_for(announce)) if announce else None
            if text:
                updates[newest.hash] = text
            patch = RecordPatch(tool_block=(*announced, *new), tools_update=text)
        rendered_messages, request = prepend_updates(request, turn.messages, updates)
        surfaced = list(frozen.surfaced)
        deferred = [n for n in frozen.deferred if n not in set(announced) | set(new)]
        self._count(request, catalog, surfaced, deferred)
        announced_turn = TurnTools(request, catalog, rendered_messages, turn.query, turn.pinned)
        planned = self.planned(announced_turn, Choice(surfaced, deferred, frozen.block, "segment"), policy,
                               [*announced, *new])
        return planned.with_record(patch)

    @staticmethod
    def _ordered(pinned: set[str], messages: Sequence[JsonObject], request: Turn) -> list[str]:
        """Pinned tools in the order they were first needed: history first, then the rest by name."""
        order = [n for n in called_in_order(messages) if n in pinned]
        records = request.location.records if request.location else ()
        order += [n for n in found_tools(records) if n in pinned and n not in order]
        return order + sorted(pinned - set(order))

    def _pinned(self, request: Turn, catalog: Catalog, query: str, messages: Sequence[JsonObject],
                found: Sequence[str]) -> set[str]:
        cfg = request.tenant.tools
        pinned = set(catalog.names_in(query, cfg.select.shortlist))
        pinned |= catalog.matching(cfg.defer.always)
        pinned |= (called_tools(messages) | set(found)) & catalog.by_name.keys()
        pinned |= read_choice(request.body.get("tool_choice")).named & catalog.by_name.keys()
        pinned |= catalog.smaller_than(cfg.defer.schema_chars)
        return pinned

    def ranker(self, tenant: TenantConfig) -> Ranker:
        """The tenant's ranker behind its deadline and lexical fallback (shared with the search answers)."""
        inner = self.ranker_for(tenant)
        if isinstance(inner, LexicalRanker):
            return inner

        def failed(exc: BaseException) -> None:
            log.warning("tool_ranking_failed", extra={"tenant": tenant.id, "error": repr(exc)})
            self.metrics.judgment_failures.labels(tenant.id, "tool_ranking").inc()

        return GuardedRanker(inner, tenant.tools.select.timeout_ms / 1000, failed)

    async def _rank(self, request: Turn, catalog: Catalog, query: str, candidates: list[int],
                    ranker: Ranker) -> tuple[Ranking | None, str]:
        select = request.tenant.tools.select
        if not select.enabled or not candidates:
            return None, "not_ranked"
        started = time.perf_counter()
        try:
            ranking = await ranker.rank(query, catalog, candidates, select.shortlist)
        finally:
            self.metrics.judgment_seconds.labels(request.tenant.id, "tool_ranking").observe(
                time.perf_counter() - started)
        cost = request.tenant.tools.judgment_cost(select.model, ranking.usage)
        if cost is not None:
            self.metrics.judgment_cost.labels(request.tenant.id, "tool_ranking").inc(cost)
        return ranking, "ranking_fallback" if ranking.fallback else "ranked"

    def _count(self, request: Turn, catalog: Catalog, surfaced: list[str], deferred: list[str]) -> None:
        tenant = request.tenant.id
        self.metrics.tools_offered.labels(tenant).inc(len(catalog.entries))
        self.metrics.tools_surfaced.labels(tenant).inc(len(surfaced))
        saved = self.catalogs.tool_tokens(catalog, catalog.entries_for(deferred))
        self.metrics.tool_tokens_saved.labels(tenant).inc(saved)
