"""/v1/responses and /v1/messages end to end: the real `openai` and `anthropic` SDKs (and the
OpenAI Agents SDK) → Keel → the stand-in, real servers. Features off: the bytes pass; on: the
same savings as chat, Keel's own tool_search answered inside the turn, errors in each shape."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from conftest import KEY, ServerThread, keel_config, small_catalog, tenant
from recorder import Recorder

from proxy.standin.script import hidden_call

WANTED = "archive_ticket"
TEXT = "tidy the queue " + hidden_call(WANTED, '{"id": "7"}')
ON: dict[str, Any] = {"tools": {"enabled": True}, "context": {"stable": True},
                      "cache": {"prompt_cache_key": "auto", "breakpoints": "auto"}}


def responses_tools() -> list[dict[str, Any]]:
    return [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
             "parameters": t["function"]["parameters"]} for t in small_catalog()]


def messages_tools() -> list[dict[str, Any]]:
    return [{"name": t["function"]["name"], "description": t["function"]["description"],
             "input_schema": t["function"]["parameters"]} for t in small_catalog()]


def openai_client(keel: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=keel.url + "/v1", api_key=KEY, max_retries=0)


def anthropic_client(keel: ServerThread, **kw: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=keel.url, api_key=KEY, max_retries=0, **kw)


def upstream_bodies(standin: ServerThread) -> list[dict[str, Any]]:
    return list(standin.app.state.standin.requests)


@pytest.fixture
def keel_on(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> ServerThread:
    return start_keel(keel_config(tenant(standin.url + "/v1", **ON)))


# --- features off: the client's bytes and the upstream's ------------------------------------

@pytest.mark.parametrize(("path", "body", "reply"), [
    ("/v1/responses", b'{ "model":"m","input":"hi",  "x_unknown":{"b":1,"a":2}, "temperature":1.50 }',
     b'{"id":"resp_1","object":"response","output":[] , "z":1}'),
    ("/v1/messages", b'{"model":"c","max_tokens":5,"messages":[{"role":"user","content":"hi"}], "top_k":1.0}',
     b'{"id":"msg_1","type":"message","content":[],"z" : 1}'),
])
def test_features_off_is_byte_identical(start_keel: Callable[..., ServerThread], path: str, body: bytes,
                                        reply: bytes) -> None:
    recorder = Recorder(chunks=[reply])
    with ServerThread(recorder) as upstream:
        keel = start_keel(keel_config(tenant(upstream.url + "/v1")))
        response = httpx.post(keel.url + path, content=body, headers={"authorization": f"Bearer {KEY}",
                                                                      "anthropic-version": "2023-06-01"})
    assert response.content == reply and recorder.received[0].body == body
    assert recorder.received[0].headers["anthropic-version"] == "2023-06-01"


def test_anthropic_upstream_gets_x_api_key(start_keel: Callable[..., ServerThread]) -> None:
    """An anthropic-compatible tenant's key goes upstream as x-api-key (not a Bearer token); the
    client's anthropic-version and anthropic-beta go with it; the client's own key does not."""
    recorder = Recorder(chunks=[b'{"id":"msg_1","type":"message","content":[]}'])
    with ServerThread(recorder) as upstream:
        config = tenant(upstream.url + "/v1")
        config["upstream"]["kind"] = "anthropic-compatible"
        keel = start_keel(keel_config(config))
        anthropic_client(keel, default_headers={"anthropic-beta": "tools-2024"}).messages.create(
            model="c", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    seen = recorder.received[0]
    assert seen.path == "/v1/messages" and seen.headers["x-api-key"] == "sk-upstream-secret"
    assert "authorization" not in seen.headers and KEY not in str(seen.headers)
    assert seen.headers["anthropic-beta"] == "tools-2024" and "anthropic-version" in seen.headers


# --- features on: deferred tools, Keel's tool_search, one answer --------------------------

@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_responses_hidden_tool_found_by_keels_search(keel_on: ServerThread, standin: ServerThread,
                                                     stream: bool) -> None:
    """The model searches for a deferred tool; Keel answers and calls it again; the client gets
    the call of its own tool, never tool_search, and one response with the usage of both calls."""
    client = openai_client(keel_on)
    if stream:
        with client.responses.stream(model="m", input=TEXT, tools=responses_tools(), store=False) as events:
            kinds = [event.type for event in events]
            final = events.get_final_response()
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    else:
        final = client.responses.create(model="m", input=TEXT, tools=responses_tools(), store=False)
    assert [(item.type, getattr(item, "name", None)) for item in final.output] == [("function_call", WANTED)]
    first, second = upstream_bodies(standin)[-2:]
    assert [t["name"] for t in first["tools"]] == ["tool_search"], "the catalog was deferred"
    assert WANTED in [t["name"] for t in second["tools"]]
    assert any(i.get("type") == "function_call_output" for i in second["input"] if isinstance(i, dict))
    assert final.usage is not None and final.usage.input_tokens > 0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_messages_hidden_tool_found_by_keels_search(keel_on: ServerThread, standin: ServerThread,
                                                    stream: bool) -> None:
    client = anthropic_client(keel_on)
    request: dict[str, Any] = dict(model="claude", max_tokens=200, system="You run a help desk.", tools=messages_tools(),
                                   messages=[{"role": "user", "content": TEXT}])
    if stream:
        with client.messages.stream(**request) as events:
            kinds = [event.type for event in events]
            final = events.get_final_message()
        assert kinds.count("message_start") == 1 and kinds[-1] == "message_stop"
    else:
        final = client.messages.create(**request)
    assert [(b.type, getattr(b, "name", None)) for b in final.content] == [("tool_use", WANTED)]
    assert final.stop_reason == "tool_use"
    first, second = upstream_bodies(standin)[-2:]
    assert [t["name"] for t in first["tools"]] == ["tool_search"]
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][1]["content"][0]["type"] == "tool_use"
    assert second["messages"][2]["content"][0]["type"] == "tool_result"


def test_messages_frozen_system_and_breakpoints(keel_on: ServerThread, standin: ServerThread) -> None:
    """Within a conversation the system blocks go upstream as first sent (the client's breakpoint
    kept), a change arrives as a context update, and Keel adds breakpoints up to Anthropic's 4. No
    id is sent: the first answer (long, sampled) proves the second request continues it."""
    client = anthropic_client(keel_on)
    system = [{"type": "text", "text": "You run a help desk. " * 300, "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Clock: 10:00:01"}]
    history: list[dict[str, Any]] = [{"role": "user", "content": "hello there, my ticket is 7 [[ramble 40]]"}]
    first = client.messages.create(model="claude", max_tokens=50, system=system, messages=history)
    sent_first = upstream_bodies(standin)[-1]
    history += [{"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "and now?"}]
    changed = [system[0], {"type": "text", "text": "Clock: 10:05:09"}, {"type": "text", "text": "## Mood\nCheerful."}]
    client.messages.create(model="claude", max_tokens=50, system=changed, messages=history)
    sent = upstream_bodies(standin)[-1]
    assert orjson.dumps(sent["system"][:2]) == orjson.dumps(sent_first["system"][:2]) == orjson.dumps(
        sent_first["system"][:2])
    assert sent["system"][0]["cache_control"] == {"type": "ephemeral"}
    update = sent["messages"][-1]["content"]
    assert "<context_update>" in str(update) and "Cheerful" in str(update)
    marks = orjson.dumps(sent).count(b'"cache_control"')
    assert 2 <= marks <= 4, "the client's breakpoint kept, Keel's added up to Anthropic's limit"


def test_streamed_response_continues_from_its_last_round(keel_on: ServerThread, standin: ServerThread) -> None:
    """A streamed response keeps the id the client was told of; continuing from it with
    previous_response_id reaches the upstream as the last round's id (the whole exchange)."""
    client = openai_client(keel_on)
    with client.responses.stream(model="m", input=TEXT, tools=responses_tools()) as events:
        for _ in events:
            pass
        final = events.get_final_response()
    client.responses.create(model="m", previous_response_id=final.id, tools=responses_tools(),
                            input=[{"type": "function_call_output", "call_id": final.output[0].call_id,  # type: ignore[union-attr]
                                    "output": "archived"}])
    sent = upstream_bodies(standin)[-1]
    assert sent["previous_response_id"] != final.id and sent["previous_response_id"].startswith("resp_")


def test_responses_instructions_frozen(keel_on: ServerThread, standin: ServerThread) -> None:
    """`instructions` is the frozen front of a Responses conversation: a ticking clock keeps it."""
    client = openai_client(keel_on)
    items: list[Any] = [{"role": "user", "content": "hi, I need help"}]
    first = client.responses.create(model="m", instructions="Be brief. Now: 10:00:01", input=items, store=False,
                                    extra_headers={"x-keel-conversation": "c-1"})
    sent_first = upstream_bodies(standin)[-1]
    items += [{"role": "assistant", "content": first.output_text}, {"role": "user", "content": "more"}]
    client.responses.create(model="m", instructions="Be brief. Now: 10:07:33", input=items, store=False,
                            extra_headers={"x-keel-conversation": "c-1"})
    sent = upstream_bodies(standin)[-1]
    assert sent["instructions"] == sent_first["instructions"] and "10:00:01" in sent["instructions"]
    assert sent["prompt_cache_key"] == sent_first["prompt_cache_key"]
    assert orjson.dumps(sent["input"][:2]) == orjson.dumps([*sent_first["input"], sent["input"][1]])[:len(
        orjson.dumps(sent["input"][:2]))]


# --- errors in each shape -----------------------------------------------------------------

def test_keels_own_errors_in_anthropic_shape(keel_on: ServerThread) -> None:
    """A wrong key on /v1/messages is Anthropic's 401, which the anthropic SDK reads as such."""
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=keel_on.url, api_key="wrong", max_retries=0).messages.create(
            model="c", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    bad = httpx.post(keel_on.url + "/v1/messages", headers={"x-api-key": KEY}, content=b'{"messages": 3}')
    assert bad.status_code == 400 and bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == "invalid_request_error"


def test_x_api_key_is_a_keel_key_on_messages(keel_on: ServerThread) -> None:
    """Anthropic clients send their key as x-api-key: Keel accepts it there."""
    response = httpx.post(keel_on.url + "/v1/messages", headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
                          json={"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 200 and response.json()["type"] == "message"


# --- the OpenAI Agents SDK ------------------------------------------------------------------

def test_agents_sdk_default_model_runs_a_tool(keel_on: ServerThread, standin: ServerThread) -> None:
    """The Agents SDK's default model (Responses) through Keel: the agent calls its tool, gets the
    result, and answers; with a large toolset Keel deferred, the tool was found by Keel's search."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool

    calls: list[str] = []

    def make(name: str) -> Any:
        @function_tool(name_override=name, description_override=f"Handles {name.replace('_', ' ')} for the desk.")
        def handle(id: str) -> str:
            calls.append(name)
            return f"{name} done for {id}"

        return handle

    names = [t["function"]["name"] for t in small_catalog()]
    model = OpenAIResponsesModel("m", openai.AsyncOpenAI(base_url=keel_on.url + "/v1", api_key=KEY, max_retries=0))
    agent = Agent(name="desk", instructions="You run a help desk.", tools=[make(n) for n in names], model=model)
    result = asyncio.run(Runner.run(agent, TEXT))
    assert calls == [WANTED]
    assert f"{WANTED} done for 7" in result.final_output
    tools_first = [t["name"] for t in upstream_bodies(standin)[0]["tools"]]
    assert "tool_search" in tools_first and len(tools_first) < len(names)


def test_relayed_stream_with_a_long_last_event_is_not_cut(keel_on: ServerThread) -> None:
    """A Responses stream Keel relays as it comes (nothing deferred) ends with a long
    response.completed event: it is whole, and no error event is added after it."""
    client = openai_client(keel_on)
    with client.responses.stream(model="m", input="[[words 120]]", instructions="Be brief.") as events:
        kinds = [event.type for event in events]
        final = events.get_final_response()
    assert kinds[-1] == "response.completed" and "error" not in kinds
    assert final.output_text.count("word") == 120
