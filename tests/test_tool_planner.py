"""The tool planner on its own: what is surfaced, what is deferred, and how failures degrade."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import keel_config, tenant, tool
from fakes import FakeRanker

from proxy.ingress import ChatRequest
from proxy.metrics import Metrics
from proxy.tokens import TokenCounter
from proxy.tools.catalog import CatalogCache
from proxy.tools.planner import ToolPlan, ToolPlanner

NAMES = ["get_me", "get_weather", "create_branch", "create_issue", "list_issues", "search_code", "send_email",
         "read_file", "write_file", "delete_file", "fetch", "convert_time", "maps_geocode", "slack_post_message"]
PARAMS = {f"p{i}": "string" for i in range(12)}  # every schema well over schema_chars


def catalog_tools() -> list[dict[str, Any]]:
    return [tool(n, f"Does {n.replace('_', ' ')}.", **PARAMS) for n in NAMES]


def request(text: str, *, history: list[dict[str, Any]] | None = None, tools_cfg: dict[str, Any] | None = None,
            **body: Any) -> ChatRequest:
    cfg = {"enabled": True, **(tools_cfg or {})}
    config = keel_config(tenant("http://up/v1", tools=cfg))
    messages = [*(history or []), {"role": "user", "content": text}]
    payload = {"model": "m", "tools": catalog_tools(), "messages": messages, **body}
    return ChatRequest(config.tenants[0], b"", payload, {}, "rid")


def planner(ranker: FakeRanker) -> tuple[ToolPlanner, Metrics]:
    metrics = Metrics()
    return ToolPlanner(CatalogCache(TokenCounter()), lambda cfg: ranker, metrics, lambda plan, ranker: plan), metrics


async def plan(text: str, ranker: FakeRanker | None = None, **kw: Any) -> ToolPlan:
    p, _ = planner(ranker or FakeRanker())
    planned = await p.plan(request(text, **kw))
    assert isinstance(planned.responder, ToolPlan)
    return planned.responder


async def test_shortlist_from_ranking() -> None:
    """The ranking's top `shortlist` tools are surfaced; the rest are deferred."""
    result = await plan("do things", FakeRanker(best=NAMES[::-1]), tools_cfg={"select": {"shortlist": 3}})
    assert result.surfaced == tuple(sorted(NAMES[::-1][:3]))
    assert set(result.deferred) == set(NAMES) - set(result.surfaced)


async def test_named_whole_words_only() -> None:
    """A name inside a longer word never matches; a later whole-word occurrence still does."""
    ranker = FakeRanker(needs_tool=0.0)
    result = await plan("forget_me_not and get_meal, then xget_me; finally get_me", ranker)
    assert result.surfaced == ("get_me",)


async def test_named_stops_at_cap() -> None:
    """Naming matches stop at the shortlist, so a message naming many tools cannot surface all."""
    text = " ".join(NAMES)
    result = await plan(text, FakeRanker(needs_tool=0.0), tools_cfg={"select": {"shortlist": 4}})
    assert result.surfaced == tuple(sorted(NAMES[:4]))


@pytest.mark.parametrize("needs, expect_ranked", [(0.49, False), (0.5, True), (0.9, True)])
async def test_needs_tool_gate(needs: float, expect_ranked: bool) -> None:
    """Below the needs-tool threshold only named tools surface; at or above it the shortlist does."""
    result = await plan("hmm", FakeRanker(best=["fetch", "read_file"], needs_tool=needs))
    assert (result.surfaced == ("fetch", "read_file")) is expect_ranked
    assert (result.surfaced == ()) is not expect_ranked


@pytest.mark.parametrize("confidence, width", [(0.24, 5), (0.25, 2), (None, 5)])
async def test_low_confidence_widens(confidence: float | None, width: int) -> None:
    """Below `low_confidence_below` (or unmeasurable) the shortlist grows by `low_confidence_extra`."""
    cfg = {"select": {"shortlist": 2, "low_confidence_below": 0.25, "low_confidence_extra": 3}}
    result = await plan("x", FakeRanker(best=NAMES, confidence=confidence), tools_cfg=cfg)
    assert len(result.surfaced) == width


async def test_named_tool_survives_no_tool_gate_and_failure() -> None:
    """A named tool is surfaced when the gate says no tool, and when the ranking fails."""
    gate_no = await plan("thanks! use send_email", FakeRanker(best=["fetch"], needs_tool=0.0))
    assert gate_no.surfaced == ("send_email",)
    failed = await plan("use send_email", FakeRanker(best=["fetch"], error=RuntimeError("backend down")))
    assert failed.surfaced == ("send_email",) and failed.outcome == "ranking_failed"


async def test_ranking_timeout_degrades() -> None:
    """A ranking slower than timeout_ms leaves only the always-surfaced tools, and is counted."""
    p, metrics = planner(FakeRanker(best=["fetch"], delay=0.5))
    planned = await p.plan(request("get_weather please", tools_cfg={"select": {"timeout_ms": 50}}))
    assert planned.responder.surfaced == ("get_weather",)  # type: ignore[union-attr]
    failures = metrics.registry.get_sample_value("keel_judgment_failures_total",
                                                 {"tenant": "acme", "judgment": "tool_ranking"})
    assert failures == 1.0


async def test_always_globs_tool_choice_and_history() -> None:
    """`always` globs, `tool_choice` and tools called earlier in the history are surfaced."""
    history = [{"role": "user", "content": "a"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "maps_geocode", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    result = await plan("b", FakeRanker(needs_tool=0.0), history=history,
                        tools_cfg={"defer": {"always": ["slack_*"]}},
                        tool_choice={"type": "function", "function": {"name": "write_file"}})
    assert result.surfaced == ("maps_geocode", "slack_post_message", "write_file")


async def test_below_min_tools_untouched() -> None:
    p, _ = planner(FakeRanker())
    original = request("x", tools_cfg={"defer": {"min_tools": 50}})
    assert await p.plan(original) is original


async def test_small_schemas_stay_loaded() -> None:
    """A tool whose schema is shorter than schema_chars is cheaper loaded than searched for."""
    p, _ = planner(FakeRanker(needs_tool=0.0))
    req = request("x")
    tools = [*req.body["tools"], tool("tiny")]
    planned = await p.plan(req.with_body({**req.body, "tools": tools}))
    assert planned.responder.surfaced == ("tiny",)  # type: ignore[union-attr]
