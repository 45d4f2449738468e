"""How a tool block lives across a segment: one policy per `tools.stability`, chosen once per turn.

Tools sit at the very front of the prompt, so any change to the block is a full cache miss;
per-turn preselection and a frozen prefix pull against each other. Each policy resolves it
one way (DESIGN, "Tool block stability"):

    PerTurn   the block is chosen fresh each turn (the largest cut, no cache across turns)
    Segment   the block chosen at the segment's start stays; a tool needed later is appended
              once (one planned miss), never reordered or removed
    Dispatch  the block never changes; a tool needed later is announced at the tail of the
              prompt and called through `call_tool`, which Keel rewrites (Chat Completions)
    Auto      like Dispatch, but re-chooses the block when a fresh one is expected to cost
              less than reading the cached one (`cache.read_price`); deterministic estimates

This is the one module that reads `tools.stability`; the tool planner does the work each
policy asks for (`Planning`: fresh, frozen, freeze, grow, rechoose, cheaper).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from proxy import records
from proxy.jsontext import JsonObject
from proxy.tools.catalog import Catalog
from proxy.turn import Turn


@dataclass(frozen=True)
class FrozenBlock:
    """A segment's tool block as frozen at its start (stored under the segment's key)."""

    catalog: str  # the catalog key it was chosen from (another catalog: not this block)
    block: list[JsonObject]  # the tools as rendered, tool_search (and call_tool) included
    surfaced: list[str]
    deferred: list[str]


@dataclass(frozen=True)
class StoredBlock:
    """A frozen block as stored. Small (`keel` set): the surfaced tools by name (the catalog, which
    must be the same for the block to be used, holds them as the client sent them), the deferred
    ones as the rest of the catalog, Keel's own tools by their `Blobs` ref. Whole (`keel` None,
    when the block is not so made): `block` and `deferred` themselves."""

    catalog: str
    surfaced: tuple[str, ...]
    keel: str | None = None
    block: tuple[JsonObject, ...] = ()
    deferred: tuple[str, ...] = ()

    def to_stored(self) -> bytes:
        rest: JsonObject = ({"keel": self.keel} if self.keel is not None
                            else {"block": list(self.block), "deferred": list(self.deferred)})
        return records.dump({"catalog": self.catalog, "surfaced": list(self.surfaced), **rest})

    @classmethod
    def from_stored(cls, raw: bytes) -> StoredBlock | None:
        """The stored block, or None when `raw` is of another format version: absent."""
        data = records.load(raw)
        if data is None:
            return None
        try:
            keel = data.get("keel")
            return cls(str(data["catalog"]), tuple(str(n) for n in data["surfaced"]),
                       keel if isinstance(keel, str) else None,
                       tuple(t for t in data.get("block") or () if isinstance(t, dict)),
                       tuple(str(n) for n in data.get("deferred") or ()))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class TurnTools:
    """What every policy plans from: the turn, its catalog and history, the tools it must ship."""

    request: Turn
    catalog: Catalog
    messages: list[JsonObject]  # the client's, with hidden exchanges spliced back
    query: str  # the newest user message's text
    pinned: frozenset[str] = field(default_factory=frozenset)
    stored: bool = True  # False: planned without stored state (`ToolPlanner.afresh`): no store call


@dataclass(frozen=True)
class Choice:
    """This turn's own choice: what ships, what is deferred, the block as rendered, and why."""

    surfaced: list[str]
    deferred: list[str]
    block: list[JsonObject]
    outcome: str  # ranked | ranking_fallback | no_tool_needed | not_ranked


class Planning(Protocol):
    """The work a policy asks of the tool planner."""

    async def fresh(self, turn: TurnTools, policy: BlockPolicy, keep_empty: bool = False) -> Choice | None:
        """Rank and choose this turn's block (None: nothing to defer, leave the tools as sent)."""
        ...

    async def frozen(self, turn: TurnTools) -> FrozenBlock | None: ...

    async def freeze(self, turn: TurnTools, choice: Choice, policy: BlockPolicy) -> Turn:
        """Store the choice as the segment's block (or take the one another replica stored first)."""
        ...

    async def rechoose(self, turn: TurnTools, choice: Choice, policy: BlockPolicy) -> Turn: ...

    def grow(self, turn: TurnTools, frozen: FrozenBlock, policy: BlockPolicy) -> Turn:
        """The frozen block, with tools needed since appended (or announced, when dispatching)."""
        ...

    def cheaper(self, turn: TurnTools, frozen: FrozenBlock, fresh: list[JsonObject]) -> bool: ...

    def planned(self, turn: TurnTools, choice: Choice, policy: BlockPolicy) -> Turn: ...

    def unchanged(self, turn: TurnTools) -> Turn: ...


class BlockPolicy(Protocol):
    dispatch: bool  # are later tools reached through call_tool (the block never grows)?

    async def plan(self, planner: Planning, turn: TurnTools) -> Turn: ...


class PerTurn:
    dispatch = False

    async def plan(self, planner: Planning, turn: TurnTools) -> Turn:
        fresh = await planner.fresh(turn, self)
        if fresh is None:
            return planner.unchanged(turn)
        return planner.planned(turn, fresh, self).with_note(tool_block_chosen_per_turn=True)


class Segment:
    dispatch = False

    async def plan(self, planner: Planning, turn: TurnTools) -> Turn:
        frozen = await planner.frozen(turn)
        if frozen is not None:
            return planner.grow(turn, frozen, self)
        fresh = await planner.fresh(turn, self)
        if fresh is None:
            return planner.unchanged(turn)
        return await planner.freeze(turn, fresh, self)


class Dispatch(Segment):
    dispatch = True


class Auto(Dispatch):
    async def plan(self, planner: Planning, turn: TurnTools) -> Turn:
        frozen = await planner.frozen(turn)
        if frozen is None:
            return await super().plan(planner, turn)
        fresh = await planner.fresh(turn, self, keep_empty=True)
        if fresh is None or not planner.cheaper(turn, frozen, fresh.block):
            return planner.grow(turn, frozen, self)
        return await planner.rechoose(turn, fresh, self)


PER_TURN = PerTurn()
_POLICIES: dict[str, BlockPolicy] = {"per_turn": PER_TURN, "segment": Segment(), "dispatch": Dispatch(),
                                     "auto": Auto()}


def policy_for(request: Turn) -> BlockPolicy:
    """The tenant's policy for this turn: a turn Keel cannot place in a conversation is planned
    per turn, and `call_tool` dispatch is Chat Completions' (other shapes keep a segment's block)."""
    if request.location is None:
        return _POLICIES["per_turn"]
    policy = _POLICIES[request.tenant.tools.stability]
    if policy.dispatch and not request.shape.dispatches:
        return _POLICIES["segment"]
    return policy
