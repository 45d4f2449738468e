"""proxy/tools/stability.py on its own: which policy a turn gets, and each policy's decision table
(what it asks of the tool planner given a frozen block or none, a fresh choice or none, cheaper
or not), read off a recording fake of the `Planning` protocol."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from proxy.chain import Chain
from proxy.config import parse_config
from proxy.conversations import Location, TurnKind
from proxy.shapes import Shape
from proxy.shapes.chat import CHAT
from proxy.shapes.messages import MESSAGES
from proxy.shapes.responses import RESPONSES
from proxy.tools.catalog import Catalog
from proxy.tools.stability import (
    Auto,
    BlockPolicy,
    Choice,
    Dispatch,
    FrozenBlock,
    PerTurn,
    Segment,
    StoredBlock,
    TurnTools,
    policy_for,
)
from proxy.turn import Turn

LOCATED = Location(Chain("seed", ()), TurnKind.NEW, "seg", "conv", ())


def turn(stability: str = "segment", shape: Shape = CHAT, located: bool = True) -> Turn:
    config = parse_config({"store": {"url": "sqlite:///:memory:"}, "tenants": [
        {"id": "acme", "auth": {"passthrough": True}, "upstream": {"base_url": "http://up/v1"},
         "tools": {"enabled": True, "stability": stability}}]}, "test")
    return Turn(config.tenants[0], b"{}", {"messages": []}, {}, "rid", shape,
                location=LOCATED if located else None)


@pytest.mark.parametrize(("stability", "shape", "located", "policy", "dispatch"), [
    ("per_turn", CHAT, True, PerTurn, False),
    ("segment", CHAT, True, Segment, False),
    ("dispatch", CHAT, True, Dispatch, True),
    ("auto", CHAT, True, Auto, True),
    ("segment", CHAT, False, PerTurn, False),  # not placed in a conversation: nothing to keep stable
    ("auto", CHAT, False, PerTurn, False),
    ("dispatch", RESPONSES, True, Segment, False),  # call_tool dispatch is Chat Completions' only
    ("auto", MESSAGES, True, Segment, False),
    ("per_turn", MESSAGES, True, PerTurn, False),
])
def test_which_policy_a_turn_gets(stability: str, shape: Shape, located: bool, policy: type, dispatch: bool) -> None:
    chosen = policy_for(turn(stability, shape, located))
    assert type(chosen) is policy and chosen.dispatch is dispatch


FROZEN = FrozenBlock("cat", [{"name": "a"}], ["a"], ["b"])
FRESH = Choice(["b"], ["a"], [{"name": "b"}], "ranked")


@dataclass
class Recorder:
    """A `Planning` whose answers the test sets; `calls` lists what the policy asked for, in order."""

    frozen_block: FrozenBlock | None = None
    fresh_choice: Choice | None = None
    is_cheaper: bool = False
    calls: list[str] = field(default_factory=list)
    keep_empty: list[bool] = field(default_factory=list)

    async def fresh(self, turn: TurnTools, policy: BlockPolicy, keep_empty: bool = False) -> Choice | None:
        self.calls.append("fresh")
        self.keep_empty.append(keep_empty)
        return self.fresh_choice

    async def frozen(self, turn: TurnTools) -> FrozenBlock | None:
        self.calls.append("frozen")
        return self.frozen_block

    async def freeze(self, turn: TurnTools, choice: Choice, policy: BlockPolicy) -> Turn:
        assert choice is self.fresh_choice
        return self._did("freeze", turn)

    async def rechoose(self, turn: TurnTools, choice: Choice, policy: BlockPolicy) -> Turn:
        assert choice is self.fresh_choice
        return self._did("rechoose", turn)

    def grow(self, turn: TurnTools, frozen: FrozenBlock, policy: BlockPolicy) -> Turn:
        assert frozen is self.frozen_block
        return self._did("grow", turn)

    def cheaper(self, turn: TurnTools, frozen: FrozenBlock, fresh: list[dict[str, object]]) -> bool:
        self.calls.append("cheaper")
        return self.is_cheaper

    def planned(self, turn: TurnTools, choice: Choice, policy: BlockPolicy) -> Turn:
        return self._did("planned", turn)

    def unchanged(self, turn: TurnTools) -> Turn:
        return self._did("unchanged", turn)

    def _did(self, what: str, turn: TurnTools) -> Turn:
        self.calls.append(what)
        return replace(turn.request, request_id=what)


def tools_turn() -> TurnTools:
    return TurnTools(turn(), Catalog.__new__(Catalog), [], "query")


# policy, frozen block?, fresh choice?, cheaper?, -> what the planner is asked, in order
TABLE = [
    (PerTurn(), None, None, False, ["fresh", "unchanged"]),
    (PerTurn(), None, FRESH, False, ["fresh", "planned"]),
    (PerTurn(), FROZEN, FRESH, True, ["fresh", "planned"]),  # never reads a frozen block
    (Segment(), None, None, False, ["frozen", "fresh", "unchanged"]),
    (Segment(), None, FRESH, False, ["frozen", "fresh", "freeze"]),
    (Segment(), FROZEN, FRESH, True, ["frozen", "grow"]),  # a frozen block stays, whatever a fresh one costs
    (Dispatch(), None, FRESH, False, ["frozen", "fresh", "freeze"]),
    (Dispatch(), FROZEN, FRESH, True, ["frozen", "grow"]),
    (Auto(), None, None, False, ["frozen", "frozen", "fresh", "unchanged"]),
    (Auto(), None, FRESH, False, ["frozen", "frozen", "fresh", "freeze"]),
    (Auto(), FROZEN, None, False, ["frozen", "fresh", "grow"]),
    (Auto(), FROZEN, FRESH, False, ["frozen", "fresh", "cheaper", "grow"]),
    (Auto(), FROZEN, FRESH, True, ["frozen", "fresh", "cheaper", "rechoose"]),
]


@pytest.mark.parametrize(("policy", "frozen", "fresh", "cheaper", "asked"), TABLE,
                         ids=[f"{type(p).__name__}-{i}" for i, (p, *_) in enumerate(TABLE)])
async def test_each_policys_decision_table(policy: BlockPolicy, frozen: FrozenBlock | None, fresh: Choice | None,
                                           cheaper: bool, asked: list[str]) -> None:
    planning = Recorder(frozen, fresh, cheaper)
    result = await policy.plan(planning, tools_turn())
    assert planning.calls == asked and result.request_id == asked[-1]


async def test_per_turn_notes_that_the_block_was_chosen_this_turn() -> None:
    result = await PerTurn().plan(Recorder(fresh_choice=FRESH), tools_turn())
    assert result.notes == {"tool_block_chosen_per_turn": True}


async def test_auto_asks_for_a_fresh_choice_even_when_nothing_would_be_deferred() -> None:
    """Auto compares against the frozen block, so it needs a fresh block even an empty one."""
    planning = Recorder(FROZEN, FRESH, False)
    await Auto().plan(planning, tools_turn())
    assert planning.keep_empty == [True]
    segment = Recorder(None, FRESH)
    await Segment().plan(segment, tools_turn())
    assert segment.keep_empty == [False]


def test_a_stored_block_reads_back_and_another_version_is_absent() -> None:
    small = StoredBlock("cat", ("a",), keel="blob-ref")
    whole = StoredBlock("cat", ("a",), None, ({"name": "a"},), ("b",))
    assert StoredBlock.from_stored(small.to_stored()) == small and StoredBlock.from_stored(whole.to_stored()) == whole
    assert StoredBlock.from_stored(small.to_stored().replace(b'"v":1', b'"v":0')) is None
