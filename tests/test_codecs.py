"""Codecs: a client body in each API shape to the planners' view and back. Unchanged means the
client's bytes; a change touches only what it changes."""

from __future__ import annotations

from typing import Any

import pytest

from proxy import jsontext
from proxy.codecs.messages import MessagesCodec
from proxy.codecs.responses import ResponsesCodec
from proxy.updates import with_update


def claude_code_body() -> dict[str, Any]:
    """Shaped like what Claude Code sends: system blocks with breakpoints, thinking, tool_use and
    tool_result, a system entry mid-conversation, a server tool beside custom tools."""
    return jsontext.loads(b'''{"model":"claude-x","max_tokens":32000,"stream":true,
      "system":[{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}},
                {"type":"text","text":"Env: linux. Today 2026-11-30.","cache_control":{"type":"ephemeral"}}],
      "messages":[
        {"role":"user","content":[{"type":"text","text":"fix the bug in a.py"}]},
        {"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"sig=="},
          {"type":"text","text":"Reading it."},
          {"type":"tool_use","id":"toolu_1","name":"Read","input":{"file_path":"a.py","limit":1.50}}]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"print(1)"},
          {"type":"text","text":"also check b.py","cache_control":{"type":"ephemeral"}}]},
        {"role":"system","content":"<reminder>todo list is empty</reminder>"}],
      "tools":[{"type":"web_search_20250305","name":"web_search","max_uses":5},
               {"name":"Read","description":"Read a file","input_schema":{"type":"object","properties":{
                 "file_path":{"type":"string"},"limit":{"type":"number"}}},"x_unknown":1},
               {"name":"Edit","description":"Edit a file","input_schema":{"type":"object"}}],
      "metadata":{"user_id":"u-1"}}''')


def codex_body() -> dict[str, Any]:
    """Shaped like what Codex sends: developer messages in input, reasoning, a custom tool."""
    return jsontext.loads(b'''{"model":"gpt-x","instructions":"You are Codex.","store":false,"stream":true,
      "prompt_cache_key":"thread-1","tool_choice":"auto",
      "input":[{"type":"message","role":"developer","content":[{"type":"input_text","text":"sandbox: on"}]},
        {"type":"message","role":"user","content":[{"type":"input_text","text":"list files"}]},
        {"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"enc=="},
        {"type":"function_call","call_id":"call_1","name":"shell","arguments":"{\\"cmd\\":\\"ls\\"}"},
        {"type":"function_call_output","call_id":"call_1","output":"a.py"},
        {"type":"custom_tool_call","call_id":"call_2","name":"apply_patch","input":"*** Begin Patch"},
        {"type":"custom_tool_call_output","call_id":"call_2","output":"done"},
        {"role":"user","content":"thanks, now run tests"}],
      "tools":[{"type":"function","name":"shell","description":"Run a command","strict":false,
                "parameters":{"type":"object","properties":{"cmd":{"type":"string"}}}},
               {"type":"custom","name":"apply_patch","description":"Apply a patch"},
               {"type":"web_search"}]}''')


def test_unchanged_views_render_the_clients_body() -> None:
    for codec, body in ((MessagesCodec(), claude_code_body()), (ResponsesCodec(), codex_body())):
        view = codec.view(body)
        assert jsontext.dumps(codec.render(view.body, view)) == jsontext.dumps(body)
        fresh = {**view.body, "messages": list(view.body["messages"]), "tools": list(view.body.get("tools") or [])}
        assert jsontext.dumps(codec.render(fresh, view)) == jsontext.dumps(body), type(codec).__name__


def test_messages_view_reads_the_conversation() -> None:
    view = MessagesCodec().view(claude_code_body())
    roles = [m["role"] for m in view.body["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user", "system"]
    assert view.body["messages"][2]["tool_calls"][0]["function"] == {"name": "Read",
                                                                      "arguments": '{"file_path":"a.py","limit":1.50}'}
    assert [t["function"]["name"] for t in view.body["tools"]] == ["Read", "Edit"]
    assert view.body["metadata"] == {"user_id": "u-1"}


def test_messages_render_changes_only_what_changed() -> None:
    codec = MessagesCodec()
    wire = claude_code_body()
    view = codec.view(wire)
    messages = list(view.body["messages"])
    messages[4] = with_update(messages[4], "<context_update>new date</context_update>")
    tool_search = {"type": "function", "function": {"name": "tool_search", "description": "find tools",
                                                    "parameters": {"type": "object"}}}
    body = {**view.body, "messages": messages, "tools": [view.body["tools"][0], tool_search]}
    out = codec.render(body, view)
    assert out["system"] is wire["system"] and out["messages"][:2] == wire["messages"][:2]
    user = out["messages"][2]["content"]
    assert user[0] == wire["messages"][2]["content"][0], "the tool_result block as sent"
    assert user[1] == {"type": "text", "text": "<context_update>new date</context_update>"}
    assert user[2] == wire["messages"][2]["content"][1], "the client's text block, breakpoint and all"
    assert out["messages"][3] == wire["messages"][3]
    assert out["tools"] == [wire["tools"][0], wire["tools"][1],
                            {"name": "tool_search", "description": "find tools", "input_schema": {"type": "object"}}]


def test_messages_render_a_spliced_search_exchange_as_valid_turns() -> None:
    """Keel's own tool_search call and its result, put back after a user message, come out as an
    assistant tool_use and a user tool_result: roles still alternate."""
    codec = MessagesCodec()
    wire = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"},
                                                          {"role": "assistant", "content": "hello"}]}
    view = codec.view(wire)
    user, answer = view.body["messages"]
    hidden = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "ts1", "type": "function", "function": {"name": "tool_search", "arguments": '{"query":"x"}'}}]},
        {"role": "tool", "tool_call_id": "ts1", "content": "{\"tools\":[]}"}]
    out = codec.render({**view.body, "messages": [user, *hidden, answer]}, view)
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "user", "assistant"]
    assert out["messages"][1]["content"] == [{"type": "tool_use", "id": "ts1", "name": "tool_search",
                                              "input": {"query": "x"}}]
    assert out["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "ts1",
                                              "content": "{\"tools\":[]}"}]
    assert out["messages"][0] is wire["messages"][0] and out["messages"][3] is wire["messages"][1]


@pytest.mark.parametrize("odd", [{"type": "function"}, {"type": "function", "name": 7}, "a string"])
def test_responses_tools_keel_cannot_plan_ride_along(odd: Any) -> None:
    """A tool that is not a plannable function tool (no name, not an object) is sent on as the
    client wrote it when a planner changes the others; it never vanishes."""
    codec = ResponsesCodec()
    tools = [{"type": "function", "name": f"t{n}", "parameters": {}} for n in range(3)]
    wire = {"model": "m", "input": "hi", "tools": [*tools, odd]}
    view = codec.view(wire)
    out = codec.render({**view.body, "tools": view.body["tools"][:1]}, view)
    assert out["tools"] == [odd, tools[0]]


def test_responses_view_and_render() -> None:
    codec = ResponsesCodec()
    wire = codex_body()
    view = codec.view(wire)
    roles = [m["role"] for m in view.body["messages"]]
    assert roles == ["system", "developer", "user", "item", "assistant", "tool", "assistant", "tool", "user"]
    assert [t["function"]["name"] for t in view.body["tools"]] == ["shell"]
    assert view.body["foreign_tools"] == [wire["tools"][1], wire["tools"][2]]
    messages = list(view.body["messages"])
    messages[0] = {**messages[0], "content": "You are Codex.\n\n<keel_context>date</keel_context>"}
    messages[-1] = with_update(messages[-1], "<context_update>x</context_update>")
    out = codec.render({**view.body, "messages": messages}, view)
    assert out["instructions"] == "You are Codex.\n\n<keel_context>date</keel_context>"
    assert out["input"][:7] == wire["input"][:7]
    assert out["input"][7] == {"type": "message", "role": "user", "content": "<context_update>x</context_update>"
                                                                             "\n\nthanks, now run tests"}
    assert out["tools"] is wire["tools"] and list(out) == list(wire)


def test_a_resent_tools_array_is_viewed_once() -> None:
    """The same tools array object (a resent one, parsed once) gets the same view list, and each view
    tool still leads back to the client's own object; another array gets its own view."""
    from proxy.codecs.responses import ResponsesCodec

    codec = ResponsesCodec()
    tools = [{"type": "function", "name": f"t{i}", "parameters": {"type": "object"}} for i in range(3)]
    tools.append({"type": "web_search"})
    first = codec.view({"model": "m", "input": "hi", "tools": tools})
    second = codec.view({"model": "m", "input": "again", "tools": tools})
    assert second.body["tools"] is first.body["tools"] and len(second.body["tools"]) == 3
    assert [second.original(t) for t in second.body["tools"]] == tools[:3]
    other = codec.view({"model": "m", "input": "hi", "tools": [dict(t) for t in tools]})
    assert other.body["tools"] is not first.body["tools"] and other.body["tools"] == first.body["tools"]
