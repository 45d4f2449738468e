"""Selection needs no store (issue 20, finding 6): a slow or dead store, or a tools stage that
overruns, costs the tool block's stability, never a request many times larger than the one Keel
would have sent. Driven with the openai SDK through Keel in front of the stand-in."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import openai
import orjson
from conftest import KEY, ServerThread, keel_config, large_catalog, tenant

from proxy.standin.script import hidden_call
from proxy.stores.sqlite import SqliteStore
from proxy.testing import FakeRanker, FaultyStore
from proxy.tools.catalog import Catalog
from proxy.tools.ranking import LexicalRanker, Ranking

ASK = "open an issue about the failing build and post a message to the team"
FAST_STORE = {"url": "sqlite:///:memory:", "budget_ms": 50}


class StallingRanker:
    """Ranks lexically and, the first time it is asked, makes the store hang: a store that turns
    slow in the middle of a turn, after the conversation was read."""

    def __init__(self, store: FaultyStore) -> None:
        self.store = store

    async def rank(self, query: str, catalog: Catalog, candidates: Sequence[int], shortlist: int) -> Ranking:
        self.store.mode = "hang"
        return LexicalRanker().rank_now(query, catalog, candidates, shortlist)


def sdk(keel: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=keel.url + "/v1", api_key=KEY, max_retries=0, timeout=20)


def shipped(standin: ServerThread, index: int = -1) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = standin.app.state.standin.requests[index]["tools"]
    return tools


def assert_lean(tools: list[dict[str, Any]], catalog: list[dict[str, Any]]) -> None:
    """A few tools and tool_search, a small fraction of the catalog's bytes."""
    names = [t["function"]["name"] for t in tools]
    assert names[-1] == "tool_search" and len(names) <= 12, names
    assert len(orjson.dumps(tools)) < len(orjson.dumps(catalog)) / 5


def test_a_store_call_over_its_budget_mid_turn_ships_a_fresh_ranking(
        standin: ServerThread, start_keel: Callable[..., ServerThread], tmp_path: Path) -> None:
    """Segment stability: the conversation is read, then the store hangs while the block is
    frozen; the store call fails at its 50 ms budget and the turn ships a per-turn lexical
    choice, not the client's whole catalog."""
    store = FaultyStore(SqliteStore(str(tmp_path / "k.db")), mode="ok")
    config = keel_config(tenant(standin.url + "/v1", tools={"enabled": True, "stability": "segment"}),
                         store=FAST_STORE)
    keel = start_keel(config, store=store, ranker=StallingRanker(store))
    catalog = large_catalog()
    reply = sdk(keel).chat.completions.create(model="m", tools=catalog,  # type: ignore[arg-type]
                                              messages=[{"role": "user", "content": ASK}])
    assert reply.choices[0].message.content
    assert store.mode == "hang" and store.calls >= 1  # the fault happened inside the tools stage
    assert_lean(shipped(standin), catalog)
    store.mode = "ok"


def test_a_dead_store_still_ships_few_tools_and_answers_tool_search(
        standin: ServerThread, start_keel: Callable[..., ServerThread], tmp_path: Path) -> None:
    """A store that hangs from the start: the conversation cannot be read (then the breaker opens
    and nothing is asked of the store); every turn still ships a few tools, and a tool_search
    round trip still reaches the client as its own tool's call."""
    store = FaultyStore(SqliteStore(str(tmp_path / "k.db")), mode="hang")
    keel = start_keel(keel_config(tenant(standin.url + "/v1", tools={"enabled": True}), store=FAST_STORE),
                      store=store)
    catalog = large_catalog()
    wanted = catalog[-1]["function"]["name"]
    client = sdk(keel)
    for turn in range(4):  # the first calls overrun their budget, then the breaker is open
        text = ASK if turn < 3 else "do it " + hidden_call(wanted, "{}")
        reply = client.chat.completions.create(model="m", tools=catalog,  # type: ignore[arg-type]
                                               messages=[{"role": "user", "content": text}])
        assert_lean(shipped(standin, -2 if turn == 3 else -1), catalog)
    calls = reply.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == [wanted]
    assert not keel.app.state.keel.store.healthy
    store.mode = "ok"


class Stubborn(FakeRanker):
    """A backend that does not stop when its deadline cancels it (a call it cannot abandon)."""

    async def rank(self, query: str, catalog: Catalog, candidates: Sequence[int], shortlist: int) -> Ranking:
        self.calls += 1
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            await asyncio.sleep(self.delay)  # cancelled at select.timeout_ms: finishes anyway, then gives up
            raise
        raise AssertionError("never reached")


def test_a_tools_stage_over_its_deadline_ships_a_lexical_choice(
        standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """A ranking backend that overruns even its own timeout (its timeout is shorter than the stage's,
    as config requires, but it does not stop when cancelled): the stage is cut off, and the turn
    ships the lexical choice instead of the client's catalog."""
    slow = Stubborn(best=["never_ranked"], delay=3.0)
    config = keel_config(tenant(standin.url + "/v1", tools={"enabled": True, "select": {"timeout_ms": 100}}))
    keel = start_keel(config, ranker=slow, stage_deadline=0.3)
    catalog = large_catalog()
    sdk(keel).chat.completions.create(model="m", tools=catalog,  # type: ignore[arg-type]
                                      messages=[{"role": "user", "content": ASK}])
    assert slow.calls == 1  # the afresh plan did not wait for the backend again
    assert_lean(shipped(standin), catalog)
