"""The context planner: freeze the front of the prompt per segment, put change at the tail.

At a segment's first turn the system prompt (the client's, plus Keel's date) is frozen as
the segment anchor. Every later request of the segment sends the anchor's bytes as its
system message. Each new user message gets the net difference between what the model
knows along the chain and what the context says now, stored on its turn record and
rendered as a `<context_update>` block at the start of its content; earlier user messages
are re-rendered with their stored blocks, byte for byte. A regeneration renders what its
turn stored and writes nothing.

What is stored is small: the anchor refers to the client's front and the states refer to the
system prompt's sections by hash (`Blobs`), so a new conversation under a system prompt Keel has
seen costs about a kilobyte (an anchor and a turn record of a few hashes each).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from proxy import jsontext
from proxy.codecs import KEEL
from proxy.config import TenantConfig
from proxy.context.dates import speaks_of_time, states_date
from proxy.context.update import Sampler, State, diff
from proxy.conversations import Conversations, Location, TurnKind
from proxy.jsontext import JsonObject
from proxy.memory.book import MemoryBook
from proxy.memory.planner import memory_user
from proxy.messages import message_text, newest_user_text
from proxy.records import RecordPatch, SegmentAnchor
from proxy.turn import Turn
from proxy.updates import prepend_updates

log = logging.getLogger("keel.context")
CONTEXT_ROLES = ("system", "developer")


def _zone(request: Turn) -> ZoneInfo:
    for name in (request.headers.get("x-keel-timezone"), request.tenant.context.timezone):
        if name:
            try:
                return ZoneInfo(name)
            except (ZoneInfoNotFoundError, ValueError):
                continue
    return ZoneInfo("UTC")


def keel_context(date: str | None, memory: Mapping[str, str] | None) -> str:
    """Keel's own context in the frozen front: the date, the user's memory."""
    parts = [f"Current date: {date}"] if date else []
    if memory:
        parts.append("<memory>\n" + "\n".join(f"- {k}: {v}" for k, v in sorted(memory.items())) + "\n</memory>")
    return "<keel_context>\n" + "\n".join(parts) + "\n</keel_context>" if parts else ""


def leading_context(messages: list[JsonObject]) -> int:
    """How many messages open the conversation as context (system/developer): the frozen front.
    Later system messages stay where the client put them."""
    for i, message in enumerate(messages):
        if message.get("role") not in CONTEXT_ROLES:
            return i
    return len(messages)


def render_front(anchor: SegmentAnchor, with_memory: bool = True, marker: str | None = None) -> list[JsonObject]:
    """The anchor's front as sent upstream: the client's messages as they were at the segment's
    start, Keel's context appended to the last of them (a new text part after the client's own
    parts, so a breakpoint the client set still ends its own prefix)."""
    extra = keel_context(anchor.date, anchor.memory if with_memory else None)
    front = list(anchor.front)
    if not extra:
        return front
    if not front:  # the client sent none: Keel's own system message (marked for codecs that place it)
        return [{"role": "system", "content": extra, **({KEEL: marker} if marker else {})}]
    last = front[-1]
    content = last.get("content")
    if isinstance(content, list):
        front[-1] = {**last, "content": [*content, {"type": "text", "text": extra}]}
    else:
        text = content if isinstance(content, str) else ""
        front[-1] = {**last, "content": f"{text}\n\n{extra}" if text else extra}
    return front


class ContextPlanner:
    name = "context"
    after: tuple[str, ...] = ("tools", "memory")  # memory is one of its sources

    def __init__(self, conversations: Conversations, clock: Callable[[], float] = time.time,
                 memory: MemoryBook | None = None) -> None:
        self.conversations = conversations
        self.clock = clock
        self.memory = memory
        self.sampler = Sampler(conversations.blobs)

    def applies(self, request: Turn) -> bool:
        return self.for_tenant(request.tenant)

    def for_tenant(self, tenant: TenantConfig) -> bool:
        return tenant.context.stable

    async def plan(self, request: Turn) -> Turn:
        location = request.location
        if location is None or location.kind is TurnKind.NONE:
            return request
        if request.body.get("previous_response_id"):  # the upstream holds the history: nothing to freeze here
            return request
        cfg = request.tenant.context
        now = datetime.fromtimestamp(self.clock(), _zone(request))
        today = now.strftime("%Y-%m-%d (%A)") if cfg.date else None
        messages = request.body["messages"]
        wants_date = (speaks_of_time(newest_user_text(messages))  # and the client has not said it already
                      and not states_date(map(message_text, messages), now.strftime("%Y-%m-%d")))
        date = today if wants_date else None
        leading = leading_context(messages)
        client_system = "\n\n".join(message_text(m) for m in messages[:leading])
        user = memory_user(request) if self.memory is not None else None
        memory = (await self.memory.shown(request.tenant.id, user, request.tenant.memory.token_limit * 4)
                  if self.memory is not None and user else None)
        scope = request.content_scope
        current = self.sampler.sample(client_system, date, memory)
        anchor, anchor_state, lost = await self._anchor(location, messages[:leading], date, current,
                                                        now.timestamp(), scope)
        known = await self._known(location, anchor_state, scope)
        if today and not wants_date and known.date:  # the model knows a date: keep it current
            current = replace(current, date=today)
        if user is None and request.tenant.memory.enabled:  # memory switched off for this request
            current = replace(current, memory=known.memory)

        updates = {r.chain_hash: r.context_update for r in location.records if r.context_update}
        newest = location.chain.newest_user
        patch = RecordPatch()
        edited = location.kind is TurnKind.REGENERATED and await self._edited(location, current, scope)
        if newest is not None and (location.kind is not TurnKind.REGENERATED or edited):
            # a regeneration renders what its turn stored, unless the client edited its context since
            sent_at = now.strftime("%Y-%m-%d %H:%M %Z") if cfg.message_timestamps else None
            update = diff(known, current, sent_at)
            updates.pop(newest.hash, None)
            if update:
                updates[newest.hash] = update
            patch = RecordPatch(context_update=update, context_state=await self.sampler.stored(scope, current))
        front = render_front(anchor, with_memory=user is not None or not request.tenant.memory.enabled,
                             marker="front" if request.shape.places_own_text else None)
        rendered, request = prepend_updates(request, messages[leading:], updates)
        planned = request.with_body({**request.body, "messages": [*front, *rendered]}).with_record(patch)
        if edited:
            planned = planned.with_note(context_edited=True)
        return planned.with_note(anchor_lost=lost) if lost else planned

    async def _edited(self, location: Location, current: State, scope: str) -> bool:
        """Did the client change its context since the regenerated turn was first planned? (Then
        the regeneration must deliver the change: the model answers under what the client sends.)"""
        record = location.newest_record
        if record is None or record.context_state is None:
            return False
        after = await self.sampler.known(scope, record.context_state)
        return after is not None and diff(after, current) is not None

    async def _known(self, location: Location, anchor_state: State, scope: str) -> State:
        """What the model knows before the newest user message: the last stored state along the
        chain (one whose content is gone is passed over), else the anchor's."""
        for record in reversed(location.earlier_records):
            if record.context_state is not None:
                known = await self.sampler.known(scope, record.context_state)
                if known is not None:
                    return known
        return anchor_state

    async def _anchor(self, location: Location, front: list[JsonObject], date: str | None, state: State,
                      created: float, scope: str) -> tuple[SegmentAnchor, State, bool]:
        """The segment's anchor with its state as `diff` reads it, and whether it had been lost
        (re-anchoring costs the cache once). Its front and state are stored by reference."""
        lost = False
        if location.records or location.kind is not TurnKind.NEW:
            found = await self._read_anchor(location, scope)
            if found is not None:
                return (*found, False)
            lost = True
            log.info("anchor_lost", extra={"segment": location.segment})
        blob = jsontext.dumps(front)
        front_ref = await self.conversations.blobs.put(scope, blob, front)
        stored = SegmentAnchor(location.segment, location.conversation, (), date, dict(state.memory),
                               await self.sampler.stored(scope, state), created, front_ref=front_ref)
        anchor = replace(stored, front=tuple(front))
        if not await self.conversations.write_anchor(location.chain, stored):  # another replica's came first
            found = await self._read_anchor(location, scope)
            if found is not None:
                return (*found, lost)
            await self.conversations.write_anchor(location.chain, stored, overwrite=True)  # its content is gone
        return anchor, state, lost

    async def _read_anchor(self, location: Location, scope: str) -> tuple[SegmentAnchor, State] | None:
        """The stored anchor with its front and state read back; None when it, or content it
        refers to, is gone."""
        anchor = await self.conversations.read_anchor(location.chain, location.segment)
        if anchor is None:
            return None
        if anchor.front_ref is not None:
            front = await self.conversations.blobs.load(scope, anchor.front_ref, jsontext.loads)
            if front is None:
                return None
            anchor = replace(anchor, front=tuple(front))
        state = await self.sampler.known(scope, anchor.context_state) if anchor.context_state is not None else None
        return None if state is None else (anchor, state)
