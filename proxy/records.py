"""Conversation state as it is stored: typed everywhere, bytes only at the store boundary.

A turn record, a segment anchor, a hidden exchange and a context state are frozen dataclasses
the code reads by attribute; `to_stored` / `from_stored` are the only places they meet JSON.
Each stored value carries the format version (`"v": FORMAT`). A value of another version (an
older Keel's, or one written before versions were) reads as absent: the turn goes on as a new
conversation (a cache miss, never a failed turn), so no reader of an old shape is kept. Change
what is stored → raise `FORMAT`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from proxy import jsontext
from proxy.jsontext import JsonObject
from proxy.messages import Message

FORMAT = 1  # the version of every value this module stores
VERSION = "v"


def dump(data: JsonObject) -> bytes:
    """A stored value's bytes, with the format version."""
    return jsontext.dumps({VERSION: FORMAT, **data})


def load(raw: bytes) -> JsonObject | None:
    """A stored value's fields; None for bytes of another format version (or none): absent."""
    try:
        data = jsontext.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    version = data.get(VERSION)
    return data if type(version) is int and version == FORMAT else None  # JSON true == 1 in Python: not a version


def _lean(required: JsonObject, optional: JsonObject, defaults: JsonObject) -> JsonObject:
    """The fields to store: the required ones, and only those optional ones that say something (a
    new conversation's record is mostly nulls and empty lists; `from_stored` puts them back). An
    optional field is left out only at the value its reader puts back (`defaults`, else None): an
    empty string where None is the default is kept, or it would read back as None."""
    return {**required, **{k: v for k, v in optional.items() if v is not None and v != defaults.get(k)}}


def _strings(value: object) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class StoredState:
    """The context state a model knows, as stored: its system prompt's sections (masked) and the
    user's memory by reference (`proxy.blobs`), and the local date (`context.update.Sampler`)."""

    system: str  # the ref of the sections' blob
    date: str | None = None
    memory: str | None = None  # the ref of the memory's blob (None: no memory)

    def to_stored(self) -> JsonObject:
        return {"system": self.system, "date": self.date, "memory": self.memory}

    @classmethod
    def from_stored(cls, data: object) -> StoredState | None:
        if not isinstance(data, dict) or not isinstance(data.get("system"), str):
            return None
        return cls(data["system"], _text(data.get("date")), _text(data.get("memory")))


@dataclass(frozen=True)
class HiddenExchange:
    """What Keel said to the model on the client's behalf after one user message (`proxy.hidden`)."""

    before: Sequence[Message]  # assistant calls + tool results Keel handled, before the visible answer
    visible: Message | None  # the provider's own version of the visible answer, if Keel trimmed it
    after: Sequence[Message]  # tool results for calls in `visible` that Keel answered
    found: Sequence[str] = ()  # tools the searches surfaced
    answer: str = ""  # fingerprint of the visible answer as the client received it
    catalog: str = ""  # the key of the tool catalog the searches answered from

    def to_stored(self) -> JsonObject:
        return {"before": list(self.before), "visible": self.visible, "after": list(self.after),
                "found": list(self.found), "answer": self.answer, "catalog": self.catalog}

    @classmethod
    def from_stored(cls, data: JsonObject) -> HiddenExchange:
        visible = data.get("visible")
        return cls([m for m in data.get("before") or () if isinstance(m, dict)],
                   visible if isinstance(visible, dict) else None,
                   [m for m in data.get("after") or () if isinstance(m, dict)],
                   _strings(data.get("found")), str(data.get("answer") or ""), str(data.get("catalog") or ""))


# What `from_stored` puts back for an optional field left out (one not named here: None).
_RECORD_DEFAULTS: JsonObject = {"hidden_exchanges": [], "dispatched": {}, "created_at": 0.0, "context": "", "needs": []}
_ANCHOR_DEFAULTS: JsonObject = {"front": [], "memory": {}, "created_at": 0.0}


@dataclass(frozen=True)
class TurnRecord:
    """What Keel rendered for one user message, so later requests render the same bytes."""

    chain_hash: str
    segment: str
    conversation: str
    position: int
    context_update: str | None = None
    context_state: StoredState | None = None
    tool_block: tuple[str, ...] | None = None  # tools appended to (or announced beside) the frozen block
    hidden_exchanges: tuple[HiddenExchange, ...] = ()
    dispatched: Mapping[str, JsonObject] = field(default_factory=dict)  # call id → the generic call made
    tools_update: str | None = None  # schemas of tools named later in a dispatch segment, on this message
    created_at: float = 0.0
    context: str = ""  # the exact system prompt's digest of the request that wrote it (`chain.context_digest`)
    needs: tuple[str, ...] = ()  # earlier records of the segment later turns render from

    @property
    def renders(self) -> bool:
        """Does a later turn re-render something of this record's (beyond its state)?"""
        return bool(self.context_update or self.tools_update or self.hidden_exchanges or self.dispatched)

    def to_stored(self) -> bytes:
        return dump(_lean({
            "chain_hash": self.chain_hash, "segment": self.segment, "conversation": self.conversation,
            "position": self.position, "tool_block": list(self.tool_block) if self.tool_block is not None else None,
        }, {
            "context_update": self.context_update,
            "context_state": self.context_state.to_stored() if self.context_state is not None else None,
            "hidden_exchanges": [x.to_stored() for x in self.hidden_exchanges],
            "dispatched": dict(self.dispatched), "tools_update": self.tools_update,
            "created_at": self.created_at, "context": self.context, "needs": list(self.needs),
        }, _RECORD_DEFAULTS))

    @classmethod
    def from_stored(cls, raw: bytes) -> TurnRecord | None:
        """The record, or None when `raw` is of another format (or not a record): absent."""
        data = load(raw)
        if data is None:
            return None
        try:
            block = data.get("tool_block")
            dispatched = data.get("dispatched") or {}
            return cls(
                str(data["chain_hash"]), str(data["segment"]), str(data["conversation"]), int(data["position"]),
                _text(data.get("context_update")), StoredState.from_stored(data.get("context_state")),
                _strings(block) if isinstance(block, list) else None,
                tuple(HiddenExchange.from_stored(x) for x in data.get("hidden_exchanges") or ()
                      if isinstance(x, dict)),
                {k: v for k, v in dispatched.items() if isinstance(v, dict)} if isinstance(dispatched, dict) else {},
                _text(data.get("tools_update")), float(data.get("created_at") or 0.0),
                str(data.get("context") or ""), _strings(data.get("needs")),
            )
        except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: int() of a huge float
            return None


@dataclass(frozen=True)
class SegmentAnchor:
    """The frozen front of a segment: the client's leading system/developer messages as they
    were sent at its start (key order, unknown fields, content parts and their cache_control
    kept), Keel's own context then (date, memory), and the context state the model knows from
    them (the frozen tool block is the tool planner's, under its own key)."""

    segment: str
    conversation: str
    front: tuple[JsonObject, ...] = ()
    date: str | None = None
    memory: Mapping[str, str] = field(default_factory=dict)
    context_state: StoredState | None = None
    created_at: float = 0.0
    front_ref: str | None = None  # stored: `front` is in `Blobs` under this ref (and empty here)

    def to_stored(self) -> bytes:
        return dump(_lean({"segment": self.segment, "conversation": self.conversation}, {
            "front": list(self.front), "date": self.date, "memory": dict(self.memory),
            "context_state": self.context_state.to_stored() if self.context_state is not None else None,
            "created_at": self.created_at, "front_ref": self.front_ref,
        }, _ANCHOR_DEFAULTS))

    @classmethod
    def from_stored(cls, raw: bytes) -> SegmentAnchor | None:
        """The anchor, or None when `raw` is of another format (or not an anchor): absent."""
        data = load(raw)
        if data is None:
            return None
        try:
            memory = data.get("memory") or {}
            return cls(
                str(data["segment"]), str(data["conversation"]),
                tuple(m for m in data.get("front") or () if isinstance(m, dict)), _text(data.get("date")),
                {str(k): str(v) for k, v in memory.items()} if isinstance(memory, dict) else {},
                StoredState.from_stored(data.get("context_state")), float(data.get("created_at") or 0.0),
                _text(data.get("front_ref")),
            )
        except (KeyError, TypeError, ValueError, OverflowError):  # OverflowError: int() of a huge float
            return None


class Unset(Enum):
    """A patch field no planner set: the record keeps its own value."""

    UNSET = "unset"


UNSET = Unset.UNSET


@dataclass(frozen=True)
class RecordPatch:
    """What the planners decided for the newest user message's turn record (the pipeline writes it
    once): each field a planner set replaces the record's; `UNSET` ones keep it."""

    context_update: str | Unset | None = UNSET
    context_state: StoredState | Unset | None = UNSET
    tool_block: tuple[str, ...] | Unset | None = UNSET
    tools_update: str | Unset | None = UNSET

    def __bool__(self) -> bool:
        return any(v is not UNSET for v in (self.context_update, self.context_state, self.tool_block,
                                            self.tools_update))

    @property
    def update_text(self) -> str | None:
        """The `<context_update>` this patch sets, if it sets one."""
        return self.context_update if isinstance(self.context_update, str) else None

    def then(self, later: RecordPatch) -> RecordPatch:
        """This patch with what `later` sets on top."""
        return RecordPatch(
            self.context_update if later.context_update is UNSET else later.context_update,
            self.context_state if later.context_state is UNSET else later.context_state,
            self.tool_block if later.tool_block is UNSET else later.tool_block,
            self.tools_update if later.tools_update is UNSET else later.tools_update,
        )

    def applied(self, record: TurnRecord) -> TurnRecord:
        return replace(
            record,
            context_update=record.context_update if self.context_update is UNSET else self.context_update,
            context_state=record.context_state if self.context_state is UNSET else self.context_state,
            tool_block=record.tool_block if self.tool_block is UNSET else self.tool_block,
            tools_update=record.tools_update if self.tools_update is UNSET else self.tools_update,
        )


NO_PATCH = RecordPatch()
