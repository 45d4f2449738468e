"""Turn records and segment anchors on top of the Store: where a request sits in its conversation.

The planners use three calls: `locate` (the longest known prefix of the chain, with the turn
records stored along it), `write_turn` (the newest user message's record) and the anchor
pair. Losing any of this costs cache, never correctness: an unknown history opens a new
segment.

A read stays bounded however long the conversation: each record names (`needs`) the earlier
records of its segment the next turn renders from (those with a context update, a tools update,
hidden exchanges or dispatched calls, the newest context state and tool block, and the one just
before), so `locate` reads the last `TAIL` user messages' records, then the ones the newest found
names; not every user message's record of the history.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from enum import StrEnum
from typing import Any, TypeVar

from proxy import jsontext
from proxy.blobs import Blobs
from proxy.chain import Chain, Meanings, namespace
from proxy.jsontext import Json, JsonObject
from proxy.proofs import Fragment, Proofs
from proxy.stores import Store, key

D = TypeVar("D")
TAIL = 2  # user messages read first: the newest (a regeneration) and the one before (a new turn)
WINDOW = 32  # further back, read when neither has a record (a write lost, a turn left unplanned)


def _known_fields(cls: type[D], data: JsonObject) -> D:
    """A dataclass from stored fields, ignoring ones this version does not know (state written by a
    newer or older Keel is read, never a failed turn)."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names})


def _without_defaults(record: object) -> bytes:
    """A record as stored: the fields whose value is not their default (a new conversation's record
    is mostly nulls and empty lists; `_known_fields` puts them back)."""
    out = asdict(record)  # type: ignore[call-overload]
    for f in fields(record):  # type: ignore[arg-type]
        default = f.default if f.default is not MISSING else (
            f.default_factory() if f.default_factory is not MISSING else MISSING)
        if default is not MISSING and out[f.name] == default and type(out[f.name]) is type(default):
            del out[f.name]
    return jsontext.dumps(out)


@dataclass(frozen=True)
class TurnRecord:
    """What Keel rendered for one user message, so later requests render the same bytes."""

    chain_hash: str
    segment: str
    conversation: str
    position: int
    context_update: str | None = None
    context_state: JsonObject = field(default_factory=dict)
    tool_block: list[Json] | None = None
    hidden_exchanges: list[Json] = field(default_factory=list)
    dispatched: JsonObject = field(default_factory=dict)  # call id → the generic call the model made
    tools_update: str | None = None  # schemas of tools named later in a dispatch segment, on this message
    created_at: float = 0.0
    context: str = ""  # the exact system prompt's digest of the request that wrote it (`chain.context_digest`)
    needs: list[str] | None = None  # earlier records of the segment later turns render from (None: written before)

    @property
    def renders(self) -> bool:
        """Does a later turn re-render something of this record's (beyond its state)?"""
        return bool(self.context_update or self.tools_update or self.hidden_exchanges or self.dispatched)

    def to_bytes(self) -> bytes:
        return _without_defaults(self)

    @classmethod
    def from_bytes(cls, raw: bytes) -> TurnRecord:
        return _known_fields(cls, jsontext.loads(raw))


@dataclass(frozen=True)
class SegmentAnchor:
    """The frozen front of a segment: the client's leading system/developer messages as they
    were sent at its start (key order, unknown fields, content parts and their cache_control
    kept), Keel's own context then (date, memory), and the context state the model knows from
    them (the frozen tool block is the tool planner's, under its own key)."""

    segment: str
    conversation: str
    front: list[JsonObject] = field(default_factory=list)
    date: str | None = None
    memory: dict[str, str] = field(default_factory=dict)
    context_state: JsonObject = field(default_factory=dict)
    created_at: float = 0.0
    system: str | None = None  # written by Keel before `front`: the whole frozen system text
    front_ref: str | None = None  # stored: `front` is in `Blobs` under this ref (and empty here)

    def to_bytes(self) -> bytes:
        return _without_defaults(self)

    @classmethod
    def from_bytes(cls, raw: bytes) -> SegmentAnchor:
        return _known_fields(cls, jsontext.loads(raw))


class TurnKind(StrEnum):
    NEW = "new"  # the history is unknown: a new chat or a compaction; opens a segment
    CONTINUED = "continued"  # a known prefix, a new user message after it
    REGENERATED = "regenerated"  # the newest user message already has a record
    NONE = "none"  # no user message at all: nothing to locate


@dataclass(frozen=True)
class Location:
    chain: Chain  # its seed: the conversation's namespace
    kind: TurnKind
    segment: str
    conversation: str
    records: tuple[TurnRecord, ...]  # along the chain, oldest first, current segment only
    caller: str = ""  # the caller's seed: who the answer to this turn is relayed to (`proxy.proofs`)
    context: str = ""  # the exact digest of this request's system prompt
    proven: bool = False  # placed by a proof of continuity (not by its own system prompt)

    @property
    def earlier_records(self) -> tuple[TurnRecord, ...]:
        """The records before the newest user message's own (what the model had heard)."""
        newest = self.chain.newest_user
        return tuple(r for r in self.records if newest is None or r.chain_hash != newest.hash)

    @property
    def writable(self) -> bool:
        """May what the answer to this turn leaves behind (hidden exchanges, dispatched calls) be
        added to its records? Not on a regeneration the requester has not proved is theirs: two
        callers who open alike share a first turn's record, and one must not add to the other's."""
        return self.kind is not TurnKind.REGENERATED or self.proven

    @property
    def newest_record(self) -> TurnRecord | None:
        """The stored record of the newest user message (set on a regeneration)."""
        newest = self.chain.newest_user
        if newest and self.records and self.records[-1].chain_hash == newest.hash:
            return self.records[-1]
        return None


def needs(earlier: tuple[TurnRecord, ...]) -> list[str]:
    """What a record written after `earlier` (its segment's records, oldest first) names for the
    turns after it: every record they re-render, the newest context state and tool block (the
    planners read only the newest of each), and the record just before (which may still gain
    hidden exchanges after this turn has read it)."""
    kept = {r.chain_hash for r in earlier if r.renders}
    picks: tuple[Callable[[TurnRecord], bool], ...] = (
        lambda r: bool(r.context_state), lambda r: r.tool_block is not None, lambda r: True)
    for pick in picks:
        last = next((r for r in reversed(earlier) if pick(r)), None)
        if last is not None:
            kept.add(last.chain_hash)
    return [r.chain_hash for r in earlier if r.chain_hash in kept]


class Conversations:
    def __init__(self, store: Store, ttl_seconds: float, after_answer: Store | None = None,
                 blob_ttl: float | None = None) -> None:
        self.store = store
        self.ttl = ttl_seconds
        self.blobs = Blobs(store, ttl_seconds, blob_ttl=blob_ttl)  # content many conversations share, stored once
        # Written after the answer, with the background's longer budget (losing one costs the next
        # turn's cache): the proofs, aliases, hidden exchanges and dispatched calls.
        self.after_answer = after_answer or store
        self.proofs = Proofs(self.after_answer, ttl_seconds)

    def _turn_key(self, chain: Chain, chain_hash: str) -> str:
        return key(chain.seed, "turn", chain_hash)

    def _anchor_key(self, chain: Chain, segment: str) -> str:
        return key(chain.seed, "anchor", segment)

    async def locate(self, meanings: Meanings, caller: str, context: str, answers: list[list[Fragment]],
                     client_conversation: str | None = None, tenant: str = "") -> Location:
        """Where a request sits. Its own namespace (the caller and its exact system prompt) is read
        together with the proofs its history holds; a proof moves it into the namespace of the
        conversation it proves. Without one, only records written under this exact system prompt
        are reused: anything else stored along the chain was said in a conversation this request
        has not shown it belongs to."""
        own = namespace(caller, context)
        chain = meanings.chain(own)
        users = chain.user_links
        if not users:
            return self.unknown(chain, client_conversation, caller, context)
        proof_keys = self.proofs.keys(tenant, answers)
        reads = [self.store.get_many([self._turn_key(chain, link.hash) for link in users[-TAIL:]])]
        if proof_keys:
            reads.append(self.store.get_many(proof_keys))
        raw, *proof_values = await asyncio.gather(*reads)
        proven = Proofs.proven(caller, answers, proof_values[0]) if proof_values else None
        if proven is not None and proven != own:
            chain = meanings.chain(proven)
            users = chain.user_links
            raw = await self.store.get_many([self._turn_key(chain, link.hash) for link in users[-TAIL:]])
        found = await self._records(chain, [TurnRecord.from_bytes(r) for r in raw if r is not None])
        if not found or (proven is None and any(r.context != context for r in found)):
            return self.unknown(chain, client_conversation, caller, context, proven is not None)
        latest = found[-1]
        records = tuple(r for r in found if r.segment == latest.segment)
        kind = TurnKind.REGENERATED if latest.chain_hash == users[-1].hash else TurnKind.CONTINUED
        return Location(chain, kind, latest.segment, latest.conversation, records, caller, context, proven is not None)

    async def _records(self, chain: Chain, tail: list[TurnRecord]) -> list[TurnRecord]:
        """The records along the chain a turn needs, oldest first: the newest one found (in the
        tail, else further back within `WINDOW`) and the earlier ones it names."""
        users = chain.user_links
        found = tail
        if not found and len(users) > TAIL:
            window = users[-TAIL - WINDOW : -TAIL]
            raw = await self.store.get_many([self._turn_key(chain, link.hash) for link in window])
            found = [TurnRecord.from_bytes(r) for r in raw if r is not None]
        if not found:
            return []
        newest = max(found, key=lambda r: r.position)
        on_chain = {link.hash for link in users if link.index < newest.position}
        have = {r.chain_hash for r in found}
        if newest.needs is None:  # written by a Keel before `needs`: every earlier record, once
            wanted = [link.hash for link in users if link.hash in on_chain and link.hash not in have]
        else:
            wanted = [h for h in newest.needs if h in on_chain and h not in have]
        if wanted:
            raw = await self.store.get_many([self._turn_key(chain, h) for h in wanted])
            found = [*found, *(TurnRecord.from_bytes(r) for r in raw if r is not None)]
        return sorted(found, key=lambda r: r.position)

    def unknown(self, chain: Chain, client_conversation: str | None = None, caller: str = "", context: str = "",
                proven: bool = False) -> Location:
        """The location of a turn whose history cannot be read: a new segment."""
        users = chain.user_links
        if not users:
            return Location(chain, TurnKind.NONE, "", client_conversation or "", (), caller, context)
        return Location(chain, TurnKind.NEW, users[-1].hash, client_conversation or users[-1].hash, (), caller,
                        context, proven)

    def new_record(self, location: Location, **fields: Any) -> TurnRecord:  # Any: TurnRecord's fields, typed there
        newest = location.chain.newest_user
        assert newest is not None, "a turn record belongs to a user message"
        return TurnRecord(
            chain_hash=newest.hash,
            segment=location.segment,
            conversation=location.conversation,
            position=newest.index,
            created_at=time.time(),
            context=location.context,
            needs=needs(location.earlier_records),
            **fields,
        )

    async def write_turn(self, chain: Chain, record: TurnRecord) -> None:
        await self.store.set(self._turn_key(chain, record.chain_hash), record.to_bytes(), self.ttl)

    async def update_turn(self, location: Location, change: Callable[[TurnRecord], TurnRecord | None]) -> None:
        """Read the newest user message's record (created if missing), change it, write it back."""
        newest = location.chain.newest_user
        if newest is None:
            return
        raw = await self.after_answer.get(self._turn_key(location.chain, newest.hash))
        updated = change(TurnRecord.from_bytes(raw) if raw else self.new_record(location))
        if updated is not None:
            await self.after_answer.set(self._turn_key(location.chain, updated.chain_hash), updated.to_bytes(), self.ttl)

    async def add_hidden_exchange(self, location: Location, exchange: JsonObject) -> None:
        """Append an exchange to the newest user message's record (once per answer)."""

        def change(record: TurnRecord) -> TurnRecord | None:
            if any(x.get("answer") == exchange.get("answer") for x in record.hidden_exchanges):
                return None
            return replace(record, hidden_exchanges=[*record.hidden_exchanges, exchange])

        await self.update_turn(location, change)

    async def add_dispatched(self, location: Location, calls: JsonObject) -> None:
        """Remember the generic calls behind real calls the client got (dispatch stability)."""
        await self.update_turn(location, lambda record: replace(record, dispatched={**record.dispatched, **calls}))

    @staticmethod
    def _alias_key(scope: str, response_id: str) -> str:
        return key(f"response:{scope}", response_id)

    async def alias_response(self, scope: str, shown: str, stored: str) -> None:
        """Remember that the response a client was shown (`shown`) continues as `stored` upstream."""
        await self.after_answer.set(self._alias_key(scope, shown), stored.encode(), self.ttl)

    async def stored_response(self, scope: str, shown: str) -> str | None:
        raw = await self.store.get(self._alias_key(scope, shown))
        return raw.decode() if raw else None

    async def write_anchor(self, chain: Chain, anchor: SegmentAnchor, overwrite: bool = False) -> bool:
        """Store a segment's anchor once; the first writer wins so replicas agree (`overwrite`: over
        an anchor whose content is gone)."""
        if overwrite:
            await self.store.set(self._anchor_key(chain, anchor.segment), anchor.to_bytes(), self.ttl)
            return True
        return await self.store.set_if_absent(self._anchor_key(chain, anchor.segment), anchor.to_bytes(), self.ttl)

    async def read_anchor(self, chain: Chain, segment: str) -> SegmentAnchor | None:
        raw = await self.store.get(self._anchor_key(chain, segment))
        return SegmentAnchor.from_bytes(raw) if raw else None
