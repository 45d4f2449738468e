"""A client's own tool deferral (`defer_loading: true` tools and the provider's search tool),
through the real SDKs: an upstream that cannot search gets Keel's tool_search in place of the
provider's, the client's loaded tools loaded and no `defer_loading`; one that can gets the
request as the client wrote it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import openai
import orjson
import pytest
from conftest import KEY, ServerThread, keel_config, small_catalog, tenant
from recorder import Recorder

from proxy.standin.script import hidden_call

WANTED = "archive_ticket"
LOADED = {"create_ticket", "close_ticket", "escalate_ticket"}  # what the client keeps loaded
TEXT = "tidy the queue " + hidden_call(WANTED, '{"id": "7"}')


def messages_tools() -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = [{"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"}]
    for t in small_catalog():
        name = t["function"]["name"]
        tool = {"name": name, "description": t["function"]["description"], "input_schema": t["function"]["parameters"]}
        tools.append(tool if name in LOADED else {**tool, "defer_loading": True})
    return tools


def responses_tools() -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = [{"type": "tool_search"}]
    for t in small_catalog()[:9]:  # fewer than defer.min_tools: deferred because the client asked
        name = t["function"]["name"]
        tool = {"type": "function", "name": name, "description": t["function"]["description"],
                "parameters": t["function"]["parameters"]}
        tools.append(tool if name in LOADED else {**tool, "defer_loading": True})
    return tools


def anthropic_tenant(url: str, **upstream: Any) -> dict[str, Any]:
    config = tenant(url, tools={"enabled": True})
    config["upstream"].update(kind="anthropic-compatible", **upstream)
    return config


def names(tools: list[dict[str, Any]]) -> set[str]:
    return {t.get("name") or t["function"]["name"] for t in tools}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_messages_deferral_answered_by_keel(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                            stream: bool) -> None:
    keel = start_keel(keel_config(anthropic_tenant(standin.url + "/v1")))
    client = anthropic.Anthropic(base_url=keel.url, api_key=KEY, max_retries=0)
    request: dict[str, Any] = dict(model="claude", max_tokens=200, tools=messages_tools(),
                                   messages=[{"role": "user", "content": TEXT}])
    if stream:
        with client.messages.stream(**request) as events:
            final = events.get_final_message()
    else:
        final = client.messages.create(**request)
    assert [(b.type, getattr(b, "name", None)) for b in final.content] == [("tool_use", WANTED)]
    first, second = list(standin.app.state.standin.requests)[-2:]
    assert names(first["tools"]) >= LOADED and "tool_search" in names(first["tools"])
    assert len(first["tools"]) < 12, "the deferred tools stayed deferred"
    assert not any("defer_loading" in t or str(t.get("type", "")).startswith("tool_search_tool")
                   for body in (first, second) for t in body["tools"])
    assert WANTED in names(second["tools"])


def test_responses_deferral_answered_by_keel(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """Nine tools (under defer.min_tools) and the hosted tool_search: Keel defers what the client
    deferred, because the client asked, and answers the search."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1", tools={"enabled": True})))
    client = openai.OpenAI(base_url=keel.url + "/v1", api_key=KEY, max_retries=0)
    final = client.responses.create(model="m", input=TEXT, tools=responses_tools(), store=False)  # type: ignore[arg-type]
    assert [(item.type, getattr(item, "name", None)) for item in final.output] == [("function_call", WANTED)]
    first = list(standin.app.state.standin.requests)[-2]
    assert names(first["tools"]) >= LOADED and "tool_search" in names(first["tools"])
    assert not any("defer_loading" in t or t.get("type") == "tool_search" for t in first["tools"])
    assert len(first["tools"]) < 9


def test_native_search_gets_the_request_as_written(start_keel: Callable[..., ServerThread]) -> None:
    """upstream.native_tool_search: the provider searches, so its search tool and the client's
    defer_loading tools go up exactly as the client sent them."""
    recorder = Recorder(chunks=[b'{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[],'
                                b'"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}'])
    with ServerThread(recorder) as upstream:
        keel = start_keel(keel_config(anthropic_tenant(upstream.url + "/v1", native_tool_search=True)))
        client = anthropic.Anthropic(base_url=keel.url, api_key=KEY, max_retries=0)
        client.messages.create(model="claude", max_tokens=50, tools=messages_tools(),  # type: ignore[arg-type]
                               messages=[{"role": "user", "content": "tidy the queue"}])
    assert orjson.loads(recorder.received[0].body)["tools"] == messages_tools()


def test_native_search_default_follows_the_provider() -> None:
    from proxy.config import UpstreamConfig
    from proxy.shapes.chat import CHAT
    from proxy.shapes.messages import MESSAGES
    from proxy.shapes.responses import RESPONSES

    def native(url: str, host: str | None) -> bool:
        return UpstreamConfig(base_url=url).searches_natively(host)

    assert native("https://api.anthropic.com/v1", MESSAGES.native_search_host)
    assert native("https://api.openai.com/v1", RESPONSES.native_search_host)
    assert not native("https://api.openai.com/v1", CHAT.native_search_host)
    assert not native("https://api.anthropic.com/v1", RESPONSES.native_search_host)
    assert not native("http://127.0.0.1:9/v1", MESSAGES.native_search_host)
    assert UpstreamConfig(base_url="http://127.0.0.1:9/v1", native_tool_search=True).searches_natively(None)
