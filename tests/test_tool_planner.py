"""The tool planner on its own: what is surfaced, what is deferred, and how failures degrade."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import keel_config, tenant, tool

from proxy.metrics import Metrics
from proxy.testing import FakeRanker
from proxy.tokens import TokenCounter
from proxy.tools.catalog import CatalogCache
from proxy.tools.planner import ToolPlan, ToolPlanner, Tuning
from proxy.tools.search import listing, search_tool
from proxy.turn import Turn

NAMES = ["get_me", "get_weather", "create_branch", "create_issue", "list_issues", "search_code", "send_email",
         "read_file", "write_file", "delete_file", "fetch", "convert_time", "maps_geocode", "slack_post_message"]
PARAMS = {f"p{i}": "string" for i in range(12)}  # every schema well over schema_chars


def catalog_tools() -> list[dict[str, Any]]:
    return [tool(n, f"Does {n.replace('_', ' ')}.", **PARAMS) for n in NAMES]


def request(text: str, *, history: list[dict[str, Any]] | None = None, tools_cfg: dict[str, Any] | None = None,
            **body: Any) -> Turn:
    cfg = {"enabled": True, **(tools_cfg or {})}
    config = keel_config(tenant("http://up/v1", tools=cfg))
    messages = [*(history or []), {"role": "user", "content": text}]
    payload = {"model": "m", "tools": catalog_tools(), "messages": messages, **body}
    return Turn(config.tenants[0], b"", payload, {}, "rid")


def planner(ranker: FakeRanker, tuning: Tuning | None = None) -> tuple[ToolPlanner, Metrics]:
    metrics = Metrics()
    return ToolPlanner(CatalogCache(TokenCounter()), lambda cfg: ranker, metrics, lambda plan, ranker: plan,
                       tuning=tuning), metrics


async def plan(text: str, ranker: FakeRanker | None = None, tuning: Tuning | None = None, **kw: Any) -> ToolPlan:
    p, _ = planner(ranker or FakeRanker(), tuning)
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
    """Below `LOW_CONFIDENCE_BELOW` (or unmeasurable) the shortlist grows by `LOW_CONFIDENCE_EXTRA`."""
    cfg = {"select": {"shortlist": 2}}
    tuning = Tuning(low_confidence_below=0.25, low_confidence_extra=3)
    result = await plan("x", FakeRanker(best=NAMES, confidence=confidence), tuning, tools_cfg=cfg)
    assert len(result.surfaced) == width


@pytest.mark.parametrize("scores, cut_at_drop, width", [
    ((10, 9.5, 6, 5.9, 5.8, 5.7), 0.2, 3),   # the best two stand out: they ship, with one more (MIN_SHIPPED)
    ((10, 9.5, 8, 7.9, 7.8, 7.7), 0.2, 5),   # no drop of 20%: the whole shortlist
    ((10, 9.5, 6, 5.9, 5.8, 5.7), 0.0, 5),   # off
    ((10, 4, 3.9, 3.8, 3.7, 3.6), 0.2, 3),   # a clear winner never ships alone: a standout can be wrong
])
async def test_standing_out_tools_ship_alone(scores: tuple[float, ...], cut_at_drop: float, width: int) -> None:
    """The shortlist is cut at its largest relative score drop when that drop reaches `CUT_AT_DROP`,
    never below MIN_SHIPPED tools."""
    cfg = {"select": {"shortlist": 5}}
    result = await plan("x", FakeRanker(best=NAMES, scores=scores), Tuning(cut_at_drop=cut_at_drop), tools_cfg=cfg)
    assert result.surfaced == tuple(sorted(NAMES[:width]))
    assert set(result.deferred) == set(NAMES) - set(result.surfaced)  # the rest stay one search away


async def test_named_tool_survives_no_tool_gate_and_failure() -> None:
    """A named tool is surfaced when the gate says no tool, and when the ranking fails (the
    failed backend's place is taken by the lexical ranking, not by nothing)."""
    gate_no = await plan("thanks! use send_email", FakeRanker(best=["fetch"], needs_tool=0.0))
    assert gate_no.surfaced == ("send_email",)
    failed = await plan("use send_email to send the weather in Paris", FakeRanker(best=["fetch"], error=RuntimeError(
        "down")), Tuning(needs_tool_threshold=0))
    assert "send_email" in failed.surfaced and "get_weather" in failed.surfaced and "fetch" not in failed.surfaced
    assert failed.outcome == "ranking_fallback"


async def test_ranking_timeout_degrades() -> None:
    """A ranking slower than timeout_ms falls back to the lexical ranking, and is counted."""
    p, metrics = planner(FakeRanker(best=["fetch"], delay=0.5))
    planned = await p.plan(request("get_weather please", tools_cfg={"select": {"timeout_ms": 50}}))
    assert planned.responder.surfaced == ("get_weather",)  # type: ignore[union-attr]
    assert planned.responder.outcome == "ranking_fallback"  # type: ignore[union-attr]
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


def test_listing_names_every_tool_compactly() -> None:
    """names: every name, by server prefix and first word; a bare head is listed on its own."""
    names = ["fetch", "fetch_url", "fetch_page", "create_branch", "gh__get_me", "gh__get_you", "gh__star"]
    assert listing(names) == "create_branch, fetch, fetch_{page,url}; gh__{get_{me,you}, star}"
    assert listing(names, "groups") == "create_branch, fetch, fetch_* (2); gh__{get_* (2), star}"


def test_auto_listing_folds_only_what_the_budget_needs() -> None:
    """auto: names in full when they fit; else the families saving most fold first, until it fits."""
    names = [f"backlinks_{w}" for w in ("anchors", "summary", "bulk_ranks", "competitors")] + [
        "get_me", "get_you", "read_file"]
    full = listing(names, "names")
    assert listing(names, "auto", len(full)) == full
    assert listing(names, "auto", len(full) - 1) == "backlinks_* (4), get_{me,you}, read_file"
    assert listing(names, "auto", 0) == listing(names, "groups")


def test_search_tool_explains_only_the_notation_it_uses() -> None:
    def description(names: tuple[str, ...], mode: str = "names") -> str:
        text: str = search_tool(names, mode)["function"]["description"]
        return text

    assert "not loaded yet: fetch, read_file." in description(("fetch", "read_file"))
    assert "(a_{b,c} = a_b, a_c): get_{me,you}." in description(("get_me", "get_you"))
    assert "(a_* (n) = n tools named a_…): get_* (2)." in description(("get_me", "get_you"), "groups")


async def test_search_loads_a_folded_family_by_its_pattern() -> None:
    """`names: ["get_*"]` loads that family (from the deferred tools only, at most max_results)."""
    from proxy.tools.ranking import LexicalRanker
    from proxy.tools.search import answer_search

    cache = CatalogCache(TokenCounter())
    catalog = cache.get(catalog_tools())
    assert catalog is not None
    deferred = [n for n in NAMES if n != "get_weather"]
    found = await answer_search('{"query": "", "names": ["get_*", "read_file", "nope"]}', catalog, deferred, 5,
                                LexicalRanker())
    assert found.found == ("get_me", "read_file")
    capped = await answer_search('{"query": "", "names": ["*_file"]}', catalog, NAMES, 2, LexicalRanker())
    assert capped.found == ("delete_file", "read_file")


async def test_search_answer_weighs_what_the_model_needs() -> None:
    """Under dispatch the tool asked for comes whole (once: a schema the model has seen comes as a
    brief), the other matches as briefs (name, description, required parameters); found tools are
    only those asked for. Loading them (segment), the answer is briefs only."""
    import orjson

    from proxy.tools.ranking import LexicalRanker
    from proxy.tools.search import answer_search

    catalog = CatalogCache(TokenCounter()).get(catalog_tools())
    assert catalog is not None
    ask = '{"query": "read a file", "names": ["read_file"]}'
    answer = await answer_search(ask, catalog, NAMES, 5, LexicalRanker(), dispatch=True)
    tools = orjson.loads(answer.content)["tools"]
    assert answer.found == ("read_file",) and len(answer.listed) > 1
    assert "parameters" in tools[0] and all("parameters" not in t and "required" in t for t in tools[1:])
    again = await answer_search(ask, catalog, NAMES, 5, LexicalRanker(), dispatch=True, shown={"read_file"})
    assert all("parameters" not in t for t in orjson.loads(again.content)["tools"]) and again.found == ("read_file",)
    by_words = await answer_search('{"query": "write a file"}', catalog, NAMES, 5, LexicalRanker(), dispatch=True)
    assert by_words.found == by_words.listed[:1]
    loaded = await answer_search(ask, catalog, NAMES, 5, LexicalRanker())
    assert loaded.found == ("read_file",) and all("parameters" not in t for t in orjson.loads(loaded.content)["tools"])


@pytest.mark.parametrize("bad", [{"type": "custom", "name": "x"}, {"type": "function", "function": {}}, "fetch"])
async def test_malformed_tools_pass_through(bad: Any) -> None:
    """A tools array Keel cannot read is left exactly as the client sent it (the upstream judges it)."""
    p, _ = planner(FakeRanker(best=NAMES))
    req = request("create a branch")
    tools = [*catalog_tools(), bad]
    planned = await p.plan(req.with_body({**req.body, "tools": tools}))
    assert planned.body["tools"] == tools and planned.responder is None
    again = await p.plan(req.with_body({**req.body, "tools": tools}))  # not cached as valid
    assert again.body["tools"] == tools


@pytest.mark.parametrize("text", ["What is the current METAR for JFK?", "show me the latest release notes",
                                  "is it raining in Oslo today?", "use a random number generator to pick 1-20",
                                  "display a chart of the volatility index", "find me some pictures of kittens"])
def test_questions_about_now_and_asks_for_tools_get_tools(text: str) -> None:
    """Classes the gate must not call the model's own work: the world as it is now, an ask to use
    a tool, an ask for images or charts. Each is a request to act, whatever the ranking scored."""
    from proxy.tools.gate import ACT_FLOOR, acts, needs_tool_probability

    assert acts(text)
    assert needs_tool_probability(0.0, text) >= ACT_FLOOR


@pytest.mark.parametrize("text", ["thanks, that fixed it!", "write a poem about the sea", "why is the sky blue?"])
def test_own_work_stays_lean(text: str) -> None:
    from proxy.tools.gate import needs_tool_probability

    assert needs_tool_probability(0.0, text) < 0.5


SIGN_OFFS = ["Thanks, that's all for today!", "That's it for today, bye!", "See you tomorrow!",
             "ok thanks, talk to you tomorrow", "Good night, thanks for the help today",
             "Thanks! Catch you later this week", "I'm done for today, thanks", "That's all I needed today, thanks!",
             "That will be all for now, thank you!", "Have a great weekend, see you Monday!"]


@pytest.mark.parametrize("text", SIGN_OFFS)
def test_sign_offs_ship_no_tools(text: str) -> None:
    """A sign-off is small talk, whatever time words it carries ("today", "tomorrow", "this week"
    are acts when asked about, not when said goodbye with): issue 21, finding 10."""
    from proxy.tools.gate import conversational, needs_tool_probability

    assert conversational(text)
    assert needs_tool_probability(5.0, text) == 0.0


@pytest.mark.parametrize("text", ["Thanks, that's all for today. Please send the summary to Bob tomorrow",
                                  "that's all for today's standup: what's on my calendar?",
                                  "I'm done for today, deploy the release branch", "see you tomorrow? book a room"])
def test_a_sign_off_with_an_ask_still_acts(text: str) -> None:
    """Taking a sign-off's words out leaves the rest to decide: an ask beside it gets tools."""
    from proxy.tools.gate import conversational, needs_tool_probability

    assert not conversational(text)
    assert needs_tool_probability(5.0, text) >= 0.5
