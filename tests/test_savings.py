"""Savings accounting: usage in each API shape, the direct estimate, dollars by cause, the ledger's figures."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
from conftest import keel_config, tenant

from proxy.accounting import CacheAccounting
from proxy.config import SavingsConfig
from proxy.metrics import Metrics
from proxy.prices import PriceTable
from proxy.savings.facts import TurnFacts
from proxy.savings.ledger import Ledger
from proxy.savings.report import parse_since, render_text, summary
from proxy.shapes.chat import CHAT
from proxy.shapes.messages import MESSAGES
from proxy.shapes.responses import RESPONSES
from proxy.stores.sqlite import SqliteStore
from proxy.turn import Turn
from proxy.usage import Usage

GPT4O = PriceTable().price("gpt-4o")  # 2.50 in, 1.25 cached, 10 out
SONNET = PriceTable().price("claude-sonnet-4-5")  # 3 in, 0.30 cached, 3.75 write, 15 out


def test_chat_usage() -> None:
    """Chat: prompt_tokens is all input, cached_tokens in prompt_tokens_details."""
    usage = {"prompt_tokens": 5000, "completion_tokens": 40, "prompt_tokens_details": {"cached_tokens": 4096}}
    assert CHAT.usage(usage) == Usage(5000, 4096, 0, 40)
    assert CHAT.usage(usage).uncached == 904  # type: ignore[union-attr]


def test_anthropic_compatible_chat_usage() -> None:
    """An Anthropic-compatible chat endpoint reports its cache reads and writes beside prompt_tokens."""
    usage = {"prompt_tokens": 5000, "completion_tokens": 40, "cache_read_input_tokens": 3000,
             "cache_creation_input_tokens": 1500}
    assert CHAT.usage(usage) == Usage(5000, 3000, 1500, 40)


def test_responses_usage() -> None:
    """Responses: input_tokens is all input, cached_tokens in input_tokens_details."""
    usage = {"input_tokens": 3000, "input_tokens_details": {"cached_tokens": 2048}, "output_tokens": 12,
             "total_tokens": 3012}
    assert RESPONSES.usage(usage) == Usage(3000, 2048, 0, 12)


def test_messages_usage() -> None:
    """Messages: input_tokens is only the uncached part; reads and writes are added to make all input."""
    usage = {"input_tokens": 20, "cache_read_input_tokens": 4000, "cache_creation_input_tokens": 900,
             "output_tokens": 7}
    read = MESSAGES.usage(usage)
    assert read == Usage(4920, 4000, 900, 7) and read.uncached == 20
    assert Usage.read(usage) == read  # told apart by its cache fields without the shape
    assert MESSAGES.usage({"input_tokens": 20, "output_tokens": 1}) == Usage(20, 0, 0, 1)
    assert Usage.read({"total_tokens": 3}) is None and Usage.read(None) is None


def test_prices_cost_every_kind_of_token() -> None:
    """A usage is priced uncached, cached, written and output tokens each at its own price."""
    assert SONNET.cost(Usage(1_000_000 + 2_000_000 + 400_000, 2_000_000, 400_000, 100_000)) == pytest.approx(
        3.0 + 0.6 + 1.5 + 1.5)


def facts(**changes: object) -> TurnFacts:
    base = dict(at=time.time(), tenant="t", conversation="c", request_id="r", shape="chat", model="gpt-4o",
                kind="continued", usage=Usage(10_000, 4_096, 0, 50), first=Usage(10_000, 4_096, 0, 50))
    base.update(changes)
    return TurnFacts(**base)  # type: ignore[arg-type]


def test_causes_add_up_to_the_difference() -> None:
    """tools + search + cache + judgments = direct - Keel, whatever the turn did."""
    turn = facts(usage=Usage(21_000, 9_000, 0, 90), first=Usage(10_000, 4_096, 0, 40), rounds=1,
                 deferred_tokens=60_000, direct_cached=65_000, judgment_usd=0.001).settled(GPT4O)
    assert sum(turn.causes.values()) == pytest.approx(turn.direct_usd - turn.keel_usd, abs=1e-8)
    assert turn.causes["search"] < 0 and turn.causes["judgments"] == -0.001
    # the direct request would have read the deferred schemas from its cache (they come first)
    assert turn.causes["tools"] == pytest.approx(60_000 * 1.25 / 1e6)
    # direct: one call, the answer's output only (the search call's 40 tokens are Keel's extra)
    assert turn.direct == Usage(70_000, 65_000, 0, 50)


def test_uncached_direct_pays_full_price_for_the_tools() -> None:
    """A first turn (nothing cached direct) saves the deferred tokens at the input price."""
    turn = facts(usage=Usage(3000, 0, 0, 10), first=Usage(3000, 0, 0, 10), deferred_tokens=50_000).settled(GPT4O)
    assert turn.causes["tools"] == pytest.approx(50_000 * 2.5 / 1e6)
    assert turn.causes["cache"] == pytest.approx(0.0, abs=1e-9) and turn.causes["search"] == 0


def test_a_one_round_turn_is_stored_without_its_defaults_or_a_second_usage() -> None:
    """A stored turn holds what differs from a default (its usage once when it took one round, no
    zero counts) and reads back equal."""
    turn = facts(usage=Usage(3000, 0, 0, 10), first=Usage(3000, 0, 0, 10), deferred_tokens=50_000).settled(GPT4O)
    stored = orjson.loads(turn.to_bytes())
    assert "first" not in stored and stored["usage"] == {"input": 3000, "output": 10}
    assert not {"surfaced", "found", "called", "scores", "notes", "context_update"} & stored.keys()
    assert TurnFacts.from_bytes(turn.to_bytes()) == turn
    assert len(turn.to_bytes()) < len(orjson.dumps(turn.as_dict())) * 0.8


def test_facts_round_trip_and_counters() -> None:
    """Stored facts read back equal; their counters are the hourly figures' share."""
    turn = facts(surfaced=("a", "b"), called=("a", "z"), found=("z",), rounds=1, tools_outcome="ranked",
                 usage=Usage(5000, 0, 0, 9), first=Usage(2000, 0, 0, 4),
                 notes={"tool_block_grew": True}, scores={"a": 3.5}).settled(GPT4O)
    assert TurnFacts.from_bytes(turn.to_bytes()) == turn
    counters = turn.counters()
    assert counters["calls"] == 2 and counters["calls_first_shot"] == 1 and counters["gate_ranked"] == 1
    assert counters["misses_planned"] == 1 and counters["turns_searched"] == 1


def test_direct_cache_estimate_follows_the_upstreams_rules() -> None:
    """OpenAI-style: the shared prefix in 128-token steps from 1024; Anthropic-style: nothing without a
    breakpoint of the client's own."""
    from proxy.savings.meter import Meter, TurnMeter

    config = keel_config(tenant("http://up/v1"), tenant("http://up/v1", id="claude", auth={"keys": ["sha256:" + "0" * 64]},
                                                           upstream={"base_url": "http://up/v1",
                                                                     "kind": "anthropic-compatible"}))
    openai, claude = config.tenants

    def meter(tenant_config: object, raw: bytes = b"{}") -> TurnMeter:
        turn = Turn(tenant_config, raw, {"messages": []}, {}, "r")  # type: ignore[arg-type]
        return TurnMeter(Meter(None, None), turn, turn, None)  # type: ignore[arg-type]

    assert meter(openai)._direct_cached(0.5, 10_000) == 4992
    assert meter(openai)._direct_cached(0.05, 10_000) == 0  # 500 tokens: under the minimum
    assert meter(claude)._direct_cached(0.5, 10_000) == 0
    assert meter(claude, b'{"cache_control": {}}')._direct_cached(0.5, 10_000) == 5000


async def test_streamed_usage_of_each_shape_is_read() -> None:
    """Responses' usage inside response.completed, Messages' across message_start and message_delta."""
    config = keel_config(tenant("http://up/v1"))
    seen: list[Usage] = []

    class Meter:
        def finish(self, usage: Usage, *args: object) -> None:
            seen.append(usage)

    for shape, events in (
        (RESPONSES, [{"type": "response.completed", "response": {"usage": {
            "input_tokens": 2000, "input_tokens_details": {"cached_tokens": 1024}, "output_tokens": 9}}}]),
        (MESSAGES, [{"type": "message_start", "message": {"usage": {
            "input_tokens": 5, "cache_read_input_tokens": 1800, "cache_creation_input_tokens": 0,
            "output_tokens": 1}}}, {"type": "message_delta", "usage": {"output_tokens": 30}}]),
    ):
        turn = Turn(config.tenants[0], b"{}", {"messages": []}, {}, "r", shape)
        accounting = CacheAccounting(Metrics(), turn, Meter())  # type: ignore[arg-type]
        for event in events:
            accounting.watch(b"data: " + orjson.dumps(event) + b"\n\n")
        accounting.finish()
    assert seen == [Usage(2000, 1024, 0, 9), Usage(1805, 1800, 0, 30)]


async def test_ledger_figures(tmp_path: Path) -> None:
    """Turns and memory-gate outcomes written by the ledger come back as the report's figures."""
    store = SqliteStore(str(tmp_path / "s.db"))
    ledger = Ledger(store, SavingsConfig())
    try:
        first = facts(conversation="c1", usage=Usage(3000, 0, 0, 10), first=Usage(3000, 0, 0, 10),
                      deferred_tokens=50_000, surfaced=("a",), called=("a",), tools_outcome="ranked").settled(GPT4O)
        second = facts(conversation="c1", usage=Usage(9000, 2048, 0, 20), first=Usage(4000, 1024, 0, 8), rounds=1,
                       deferred_tokens=50_000, direct_cached=49_920, surfaced=("a",), found=("b",), called=("b",),
                       tools_outcome="ranked").settled(GPT4O)
        other = facts(conversation="c2", usage=Usage(1000, 0, 0, 5), first=Usage(1000, 0, 0, 5),
                      tools_outcome="no_tool_needed").settled(GPT4O)
        for turn in (first, second, other):
            await ledger.write(turn)
        await ledger.memory("t", "run", usd=0.002)
        await ledger.memory("t", "skip", estimate=0.001)
        await ledger.memory("t", "skip", estimate=0.001)
        report = await summary(ledger, "t", parse_since("1h"))
        assert report["turns"] == 3
        assert report["input_tokens"] == {"direct": 3000 + 54_000 + 1000 + 50_000, "keel": 13_000,
                                          "saved": 95_000, "by_cause": {"tools": 100_000, "search": -5000}}
        assert report["first_shot_recall"] == {"calls": 2, "first_shot": 1, "recall": 0.5}
        assert report["tool_search"] == {"rounds": 1, "turns_with_rounds": 1}
        assert report["tool_gate"]["ranked"] == 2 and report["tool_gate"]["no_tool_needed"] == 1
        memory = report["memory_gate"]
        assert memory["run"] == 1 and memory["skip"] == 2 and memory["avoided_usd"] == pytest.approx(0.004)
        dollars = report["dollars"]
        assert sum(dollars["by_cause"].values()) == pytest.approx(dollars["saved"], abs=1e-5)
        assert dollars["saved"] == pytest.approx(sum(t.direct_usd - t.keel_usd for t in (first, second, other))
                                                 + 0.004, abs=1e-5)
        assert [c["conversation"] for c in report["top_conversations"]] == ["c1", "c2"]
        assert [t.request_id for t in await ledger.turns("t", "c1")] == ["r", "r"]
        assert "first-shot recall: 50.0%" in render_text(report)
    finally:
        await store.close()


async def test_turn_list_is_capped(tmp_path: Path) -> None:
    """A conversation keeps its first `conversation_turns` turns for the inspector (one over, at most)."""
    store = SqliteStore(str(tmp_path / "s.db"))
    ledger = Ledger(store, SavingsConfig(conversation_turns=3))
    try:
        for _ in range(6):
            await ledger.write(facts().settled(GPT4O))
        assert len(await ledger.turns("t", "c")) == 3
        assert (await summary(ledger, "t", parse_since("1d")))["turns"] == 6  # the counters keep counting
    finally:
        await store.close()


def test_since() -> None:
    now = 1_000_000.0
    assert parse_since("7d", now) == now - 7 * 86400 and parse_since("90m", now) == now - 5400
    assert parse_since("1970-01-02") == 86400
    with pytest.raises(ValueError, match="like 7d"):
        parse_since("last week")
