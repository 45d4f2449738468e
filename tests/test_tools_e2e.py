"""Tool deferral end to end: the openai SDK → Keel (tools on) → the stand-in, real servers."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import openai
import orjson
import pytest
from conftest import KEY, ServerThread, keel_config, real_catalog, tenant, tuned

from proxy.standin.script import hidden_call

AUTH = {"authorization": f"Bearer {KEY}"}


def catalog(name: str = "agent_8servers.json") -> list[dict[str, Any]]:
    return real_catalog(name)  # these tests name the real catalogs' tools


def tools_tenant(upstream: str, **tools: Any) -> dict[str, Any]:
    """Tools on, chosen fresh each turn (these tests are about what one turn ships; the default
    stability, auto, is measured in test_invariant_prefix_stable and bench/cache.py)."""
    return tenant(upstream, tools={"enabled": True, "stability": "per_turn", **tools})


@pytest.fixture
def keel_tools(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> ServerThread:
    return start_keel(keel_config(tools_tenant(standin.url + "/v1")))


def sdk(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def last_upstream_body(standin: ServerThread) -> dict[str, Any]:
    body: dict[str, Any] = standin.app.state.standin.requests[-1]
    return body


def listed(description: str) -> str:
    """The name listing inside a tool_search description."""
    return description.split("not loaded yet", 1)[1].split(": ", 1)[1].rsplit(". Call", 1)[0]


def expand(description: str) -> set[str]:
    """Every name in a tool_search description, braces expanded (a_{b,c} → a_b, a_c)."""
    listing = listed(description)
    out: set[str] = set()
    for part in listing.split("; "):
        server, sep, inner = part.partition("__{")
        words = inner[:-1] if sep else part
        prefix = server + "__" if sep else ""
        for item in re.findall(r"[^,{}\s]+_\{[^}]*\}|[^,{}\s]+", words):
            if "_{" in item:
                head, rests = item[:-1].split("_{")
                out.update(f"{prefix}{head}_{r}" for r in rests.split(","))
            else:
                out.add(prefix + item)
    return out


def names(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body.get("tools", [])]


def test_targeted_prompt_ships_few_tools(keel_tools: ServerThread, standin: ServerThread) -> None:
    """A 208-tool request reaches the upstream as a handful of tools plus tool_search."""
    tools = catalog()
    r = httpx.post(keel_tools.url + "/v1/chat/completions", headers=AUTH, timeout=30, json={
        "model": "m", "tools": tools,
        "messages": [{"role": "user", "content": "Create a new branch called feature-x in my github repo"}]})
    assert r.status_code == 200
    sent = last_upstream_body(standin)
    shipped = names(sent)
    assert shipped[-1] == "tool_search" and len(shipped) <= 12
    assert "create_branch" in shipped
    surfaced, offered = r.headers["x-keel-tools"].split("/")
    assert int(offered) == len(tools) and int(surfaced) == len(shipped) - 1
    named = expand(sent["tools"][-1]["function"]["description"])
    all_names = {t["function"]["name"] for t in tools}
    assert all_names - set(shipped) == named  # invariant 3: every deferred tool is named in tool_search


@pytest.mark.parametrize("cut_at_drop, most", [(0.2, 8), (0.0, 11)])
def test_standing_out_tools_ship_alone(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                       cut_at_drop: float, most: int) -> None:
    """A two-step prompt ships each step's tool; the cut at a score drop keeps the rest to the
    few that stand out (at least MIN_SHIPPED of the whole ask, a few per step), cut off, the
    shortlist and each step's three."""
    keel = start_keel(keel_config(tools_tenant(standin.url + "/v1")), planners=tuned(cut_at_drop=cut_at_drop))
    sdk(keel).chat.completions.create(model="m", tools=catalog(), messages=[{  # type: ignore[arg-type]
        "role": "user", "content": "Create a new branch called feature-login in the acme/web repo and open a pull "
                                   "request for it"}])
    shipped = set(names(last_upstream_body(standin))) - {"tool_search"}
    assert {"create_branch", "create_pull_request"} <= shipped and 3 <= len(shipped) <= most


def test_auto_listing_stays_within_budget(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """search.listing auto: a 208-tool catalog's listing fits LISTING_CHARS (700); each deferred tool is
    named or counted in a folded family, and tool_search by exact name still loads a folded one."""
    keel = start_keel(keel_config(tools_tenant(standin.url + "/v1", search={"listing": "auto"})))
    tools = catalog()
    r = sdk(keel).chat.completions.with_raw_response.create(model="m", tools=tools, messages=[  # type: ignore[arg-type]
        {"role": "user", "content": "thanks, that was really helpful"}])
    assert r.http_response.status_code == 200
    sent = last_upstream_body(standin)
    description = sent["tools"][-1]["function"]["description"]
    listing = listed(description)
    assert len(listing) <= 700
    deferred = {t["function"]["name"] for t in tools} - set(names(sent))
    folded = dict(re.findall(r"(\w+)_\* \((\d+)\)", listing))
    named = {n for n in expand(description) if not n.endswith("*") and not n.startswith("(")}
    for name in deferred:
        head = name.split("_", 1)[0]
        assert name in named or head in folded, name
    assert sum(int(c) for c in folded.values()) + len(named & deferred) == len(deferred)


def test_conversational_prompt_ships_almost_nothing(keel_tools: ServerThread, standin: ServerThread) -> None:
    """A thank-you surfaces no ranked tools, only the cheap ones and tool_search."""
    sdk(keel_tools).chat.completions.create(model="m", tools=catalog(),  # type: ignore[arg-type]
                                            messages=[{"role": "user", "content": "thanks, that was really helpful"}])
    sent = last_upstream_body(standin)
    big = [t for t in sent["tools"] if t["function"]["name"] != "tool_search"]
    assert all(len(orjson.dumps(t)) < 300 for t in big)
    assert len(orjson.dumps(sent["tools"])) < 0.05 * len(orjson.dumps(catalog()))


def test_named_tool_is_surfaced(keel_tools: ServerThread, standin: ServerThread) -> None:
    """A tool named in the message is surfaced even when ranking would not pick it."""
    sdk(keel_tools).chat.completions.create(model="m", tools=catalog(),  # type: ignore[arg-type]
                                            messages=[{"role": "user", "content": "thanks! now run merge_pull_request"}])
    assert "merge_pull_request" in names(last_upstream_body(standin))


def test_tool_search_round_trip_non_stream(keel_tools: ServerThread, standin: ServerThread) -> None:
    """The model searches; Keel answers; the client gets the real tool call and never sees tool_search."""
    client = sdk(keel_tools)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "please do it " + hidden_call("convert_time", '{"a":1}')}]
    reply = client.chat.completions.create(model="m", tools=catalog(), messages=messages)  # type: ignore[arg-type]
    calls = reply.choices[0].message.tool_calls
    assert calls and [c.function.name for c in calls] == ["convert_time"]
    assert reply.choices[0].finish_reason == "tool_calls"
    upstream_calls = list(standin.app.state.standin.requests)[-2:]
    assert names(upstream_calls[1]).count("convert_time") == 1  # surfaced for the continued call
    assert reply.usage is not None
    # next turn: the hidden exchange is spliced back byte-identically
    messages += [reply.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": calls[0].id, "content": "12:00 UTC"}]
    final = client.chat.completions.create(model="m", tools=catalog(), messages=messages)  # type: ignore[arg-type]
    assert final.choices[0].message.content == "The convert_time tool returned: 12:00 UTC"
    continued, latest = upstream_calls[1]["messages"], last_upstream_body(standin)["messages"]
    assert orjson.dumps(latest[: len(continued)], option=orjson.OPT_SORT_KEYS) == orjson.dumps(
        continued, option=orjson.OPT_SORT_KEYS)
    assert "convert_time" in names(last_upstream_body(standin))  # discovered: stays surfaced


def test_tool_search_round_trip_stream(keel_tools: ServerThread, standin: ServerThread) -> None:
    """Streaming: tool_search deltas are withheld; one id, contiguous indexes, one finish, summed usage."""
    stream = sdk(keel_tools).chat.completions.create(
        model="m", tools=catalog(), stream=True, stream_options={"include_usage": True},  # type: ignore[arg-type]
        messages=[{"role": "user", "content": "go " + hidden_call("convert_time", '{"a":1}')}])
    chunks = list(stream)
    ids = {c.id for c in chunks}
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert len(ids) == 1 and finishes == ["tool_calls"]
    assert {d.index for d in deltas} == {0}
    assert [d.function.name for d in deltas if d.function and d.function.name] == ["convert_time"]
    assert json.loads("".join(d.function.arguments or "" for d in deltas if d.function)) == {"a": 1}
    usage = chunks[-1].usage
    upstream = list(standin.app.state.standin.requests)[-2:]
    assert usage is not None and usage.prompt_tokens > 0
    assert len(upstream) == 2 and names(upstream[0])[-1] == "tool_search"


def test_mixed_own_call_and_search(keel_tools: ServerThread, standin: ServerThread) -> None:
    """A response calling the client's tool and tool_search: the client gets its own call only."""
    tools = catalog()
    reply = sdk(keel_tools).chat.completions.create(model="m", tools=tools, messages=[  # type: ignore[arg-type]
        {"role": "user", "content": 'read it [[call read_file {"path":"a"}]] ' + hidden_call("convert_time")}])
    calls = reply.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["read_file"]


def test_300_tool_client_under_openai_limit(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """A client holding 300 tools never sends more than 128 upstream."""
    tools = catalog("all_tools.json")[:300]
    keel = start_keel(keel_config(tools_tenant(standin.url + "/v1")))
    sdk(keel).chat.completions.create(model="m", tools=tools,  # type: ignore[arg-type]
                                      messages=[{"role": "user", "content": "list my open pull requests on github"}])
    assert len(last_upstream_body(standin)["tools"]) <= 128


def test_tool_choice_names_deferred_tool(keel_tools: ServerThread, standin: ServerThread) -> None:
    sdk(keel_tools).chat.completions.create(
        model="m", tools=catalog(), tool_choice={"type": "function", "function": {"name": "get_me"}},  # type: ignore[arg-type]
        messages=[{"role": "user", "content": "hello"}])
    assert "get_me" in names(last_upstream_body(standin))


def test_small_catalog_left_alone(keel_tools: ServerThread, standin: ServerThread) -> None:
    """Below min_tools the request goes upstream byte for byte."""
    body = orjson.dumps({"model": "m", "tools": catalog()[:3], "messages": [{"role": "user", "content": "hi"}]})
    httpx.post(keel_tools.url + "/v1/chat/completions", content=body, headers=AUTH)
    assert orjson.dumps(last_upstream_body(standin)) == body


@pytest.mark.parametrize("stream", [False, True])
def test_dispatch_rewrites_generic_calls(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                         stream: bool) -> None:
    """Dispatch stability: the model calls call_tool; the client gets a real call of its own tool,
    and on the next request Keel hands the model back the generic call it made."""
    keel = start_keel(keel_config(tools_tenant(standin.url + "/v1", stability="dispatch")))
    client = sdk(keel)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go " + hidden_call("convert_time", '{"a":1}')}]
    if stream:
        chunks = list(client.chat.completions.create(model="m", tools=catalog(), messages=messages,  # type: ignore[arg-type]
                                                     stream=True))
        deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
        assert [(d.index, d.function.name) for d in deltas if d.function and d.function.name] == [(0, "convert_time")]
        call_id = next(d.id for d in deltas if d.id)
        arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
        assistant = {"role": "assistant", "tool_calls": [{"id": call_id, "type": "function", "function": {
            "name": "convert_time", "arguments": arguments}}]}
    else:
        reply = client.chat.completions.create(model="m", tools=catalog(), messages=messages)  # type: ignore[arg-type]
        call = reply.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert call.function.name == "convert_time" and json.loads(call.function.arguments) == {"a": 1}
        assistant = reply.choices[0].message.model_dump(exclude_none=True)
        arguments = call.function.arguments
    assert json.loads(arguments) == {"a": 1}
    upstream_tools = names(last_upstream_body(standin))
    assert "convert_time" not in upstream_tools and "call_tool" in upstream_tools
    messages += [assistant, {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": "noon"}]
    final = client.chat.completions.create(model="m", tools=catalog(), messages=messages)  # type: ignore[arg-type]
    assert final.choices[0].message.content is not None
    history = last_upstream_body(standin)["messages"]
    generic = [c for m in history for c in m.get("tool_calls") or [] if c["function"]["name"] == "call_tool"]
    assert generic and json.loads(generic[0]["function"]["arguments"])["name"] == "convert_time"
    assert names(last_upstream_body(standin)) == upstream_tools  # the tool block did not change


@pytest.mark.parametrize("read_price, rechosen", [(0.1, False), (1.0, True)])
def test_auto_stability_weighs_the_cache(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                         read_price: float, rechosen: bool) -> None:
    """Auto keeps the cached tool block when cache reads are cheap, and re-chooses a smaller
    block for the new turn when reading the cache costs as much as sending afresh."""
    cfg = tools_tenant(standin.url + "/v1", stability="auto")
    cfg["cache"] = {"read_price": read_price}
    keel = start_keel(keel_config(cfg))
    client = sdk(keel)
    first_q = "create a branch, open a pull request, list issues and search code in my github repo"
    messages: list[dict[str, Any]] = [{"role": "user", "content": first_q}]
    reply = client.chat.completions.create(model="m", tools=catalog(), messages=messages)  # type: ignore[arg-type]
    first = names(last_upstream_body(standin))
    messages += [reply.choices[0].message.model_dump(exclude_none=True),
                 {"role": "user", "content": "what time is it in Tokyo right now?"}]
    client.chat.completions.create(model="m", tools=catalog(), messages=messages)  # type: ignore[arg-type]
    second = names(last_upstream_body(standin))
    assert (second != first) is rechosen
    assert "call_tool" in first and "call_tool" in second


def test_dispatch_announces_named_tools_at_the_tail(standin: ServerThread,
                                                    start_keel: Callable[..., ServerThread]) -> None:
    """Dispatch: a tool named later is announced in a <tools_update> on the newest message (no search
    round trip, no change to the tool block), and re-rendered byte for byte on later turns."""
    keel = start_keel(keel_config(tools_tenant(standin.url + "/v1", stability="dispatch")))
    client = sdk(keel)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hello there"}]
    reply = client.chat.completions.create(model="m", tools=catalog(), messages=messages)  # type: ignore[arg-type]
    block = names(last_upstream_body(standin))
    assert "convert_time" not in block
    messages += [reply.choices[0].message.model_dump(exclude_none=True),
                 {"role": "user", "content": 'use convert_time please [[call convert_time {"a":1}]]'}]
    before = len(standin.app.state.standin.requests)
    reply = client.chat.completions.create(model="m", tools=catalog(), messages=messages)  # type: ignore[arg-type]
    assert len(standin.app.state.standin.requests) == before + 1  # no tool_search round trip
    call = reply.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "convert_time"
    announced = last_upstream_body(standin)
    assert names(announced) == block and "<tools_update>" in announced["messages"][-1]["content"]
    messages += [reply.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "noon"}]
    client.chat.completions.create(model="m", tools=catalog(), messages=messages)  # type: ignore[arg-type]
    later = last_upstream_body(standin)["messages"]
    assert orjson.dumps(later[: len(announced["messages"])], option=orjson.OPT_SORT_KEYS) == orjson.dumps(
        announced["messages"], option=orjson.OPT_SORT_KEYS)


def test_mixed_own_call_and_search_streaming(keel_tools: ServerThread, standin: ServerThread) -> None:
    """Streaming, a response calling the client's tool and tool_search: the client's call streams
    at index 0, the search never shows, and the turn ends with finish_reason tool_calls."""
    stream = sdk(keel_tools).chat.completions.create(model="m", tools=catalog(), stream=True, messages=[  # type: ignore[arg-type]
        {"role": "user", "content": 'read it [[call read_file {"path":"a"}]] ' + hidden_call("convert_time")}])
    chunks = list(stream)
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [(d.index, d.function.name) for d in deltas if d.function and d.function.name] == [(0, "read_file")]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"] and len({c.id for c in chunks}) == 1


def test_the_demos_sign_off_ships_no_ranked_tools(keel_tools: ServerThread, standin: ServerThread) -> None:
    """The demo's last message, "Thanks, that's all for today!", shipped 11 of 208 tools (the gate read
    "today" as a question about now): a sign-off ships nothing ranked (issue 21, finding 10)."""
    reply = sdk(keel_tools).chat.completions.with_raw_response.create(
        model="m", tools=catalog(), messages=[{"role": "user", "content": "Thanks, that's all for today!"}])  # type: ignore[arg-type]
    sent = last_upstream_body(standin)
    assert all(len(orjson.dumps(t)) < 300 for t in sent["tools"] if t["function"]["name"] != "tool_search")
    assert reply.headers["x-keel-tools"] == f"{len(sent['tools']) - 1}/{len(catalog())}"
