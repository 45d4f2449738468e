"""Invariant 2 on /v1/responses and /v1/messages: within a segment, each request Keel sends
upstream begins with the previous one's tools, instructions/system and conversation, byte for
byte — through a ticking clock, a toggled section, a tool found by Keel's search (its hidden
exchange spliced back), a tool call and its result, and a regeneration."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import KEY, ServerThread, keel_config, small_catalog, tenant

from proxy.standin.script import hidden_call

Body = dict[str, Any]


def canon(value: Any) -> bytes:
    """Bytes to compare, without cache_control markers: Anthropic caches a prefix by its content,
    and the breakpoint at the end of the newest turn moves on by design."""
    return orjson.dumps(_unmarked(value), option=orjson.OPT_SORT_KEYS)


def _unmarked(value: Any) -> Any:
    """Also: a message's string content as the one text block the provider reads it as (Keel
    writes a breakpoint into a string-content message as a text block)."""
    if isinstance(value, dict):
        if isinstance(value.get("content"), str) and value.get("role") in ("user", "assistant"):
            value = {**value, "content": [{"type": "text", "text": value["content"]}]}
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


class Shape:
    """How a client of one API shape sends its conversation, and where the prefix lives."""

    path = ""
    conversation_key = ""  # the body key of the resent conversation
    front_key = ""  # the body key of the system prompt

    def tools(self) -> list[Any]:
        raise NotImplementedError

    def body(self, system: str, history: list[Any]) -> Body:
        raise NotImplementedError

    def reply_items(self, reply: Body) -> tuple[list[Any], list[str]]:
        """The reply as history entries, and the ids of the tool calls in it."""
        raise NotImplementedError

    def results(self, calls: list[str]) -> list[Any]:
        raise NotImplementedError

    def user(self, text: str) -> Any:
        raise NotImplementedError


class Responses(Shape):
    path, conversation_key, front_key = "/v1/responses", "input", "instructions"

    def tools(self) -> list[Any]:
        return [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                 "parameters": t["function"]["parameters"]} for t in small_catalog()]

    def body(self, system: str, history: list[Any]) -> Body:
        return {"model": "m", "instructions": system, "input": history, "tools": self.tools(), "store": False}

    def reply_items(self, reply: Body) -> tuple[list[Any], list[str]]:
        items = [{k: v for k, v in item.items() if k not in ("id", "status")} for item in reply["output"]]
        return items, [i["call_id"] for i in items if i["type"] == "function_call"]

    def results(self, calls: list[str]) -> list[Any]:
        return [{"type": "function_call_output", "call_id": c, "output": "done"} for c in calls]

    def user(self, text: str) -> Any:
        return {"role": "user", "content": text}


class Messages(Shape):
    path, conversation_key, front_key = "/v1/messages", "messages", "system"

    def tools(self) -> list[Any]:
        return [{"name": t["function"]["name"], "description": t["function"]["description"],
                 "input_schema": t["function"]["parameters"]} for t in small_catalog()]

    def body(self, system: str, history: list[Any]) -> Body:
        return {"model": "claude", "max_tokens": 100, "system": system, "messages": history, "tools": self.tools()}

    def reply_items(self, reply: Body) -> tuple[list[Any], list[str]]:
        return [{"role": "assistant", "content": reply["content"]}], [
            b["id"] for b in reply["content"] if b["type"] == "tool_use"]

    def results(self, calls: list[str]) -> list[Any]:
        return [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": c, "content": "done"}
                                             for c in calls]}]

    def user(self, text: str) -> Any:
        return {"role": "user", "content": text}


def assert_prefix(shape: Shape, before: Body, after: Body) -> None:
    old_tools, new_tools = before.get("tools", []), after.get("tools", [])
    assert [canon(t) for t in new_tools[: len(old_tools)]] == [canon(t) for t in old_tools], "tool block changed"
    assert canon(after.get(shape.front_key)) == canon(before.get(shape.front_key)), "system prompt changed"
    old, new = before[shape.conversation_key], after[shape.conversation_key]
    assert len(new) >= len(old)
    for i, (a, b) in enumerate(zip(old, new, strict=False)):
        assert canon(a) == canon(b), f"entry {i} changed: {canon(a)[:300]!r} -> {canon(b)[:300]!r}"


@pytest.mark.parametrize("shape", [Responses(), Messages()], ids=["responses", "messages"])
def test_prefix_stable_through_a_conversation(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                              tmp_path: Path, shape: Shape) -> None:
    config = keel_config(tenant(standin.url + "/v1", tools={"enabled": True, "stability": "segment"},
                                context={"stable": True}, cache={"breakpoints": "auto", "prompt_cache_key": "auto"}),
                         store={"url": f"sqlite:///{tmp_path / 'k.db'}", "budget_ms": 5000})
    keel = start_keel(config)
    headers = {"authorization": f"Bearer {KEY}", "x-keel-conversation": "conv-1", "anthropic-version": "2023-06-01"}
    sections = {"clock": "Now: 10:00:01", "rules": "You run Acme's help desk. " * 60}
    history: list[Any] = []
    last: Body | None = None

    def send(text: str | None) -> list[Body]:
        nonlocal last
        if text is not None:
            history.append(shape.user(text))
        before = len(standin.app.state.standin.requests)
        system = "\n\n".join(sections.values())
        reply = httpx.post(keel.url + shape.path, json=shape.body(system, history), headers=headers, timeout=30)
        assert reply.status_code == 200, reply.text
        calls = list(standin.app.state.standin.requests)[before:]
        if last is not None:
            assert_prefix(shape, last, calls[0])
        for a, b in itertools.pairwise(calls):  # Keel's own continuation extends its call
            assert_prefix(shape, a, b)
        items, call_ids = shape.reply_items(reply.json())
        history.extend(items)
        if call_ids:
            history.extend(shape.results(call_ids))
        last = calls[-1]
        return calls

    send("hello there")
    sections["clock"] = "Now: 10:04:17"
    send("it is about number 7")
    found = send("tidy up the queue " + hidden_call("archive_ticket", '{"id": "7"}'))
    assert len(found) == 2 and [t.get("name") for t in found[0]["tools"]][-1] == "tool_search"
    send(None)  # the client answers the tool call it got
    sections["toggle"] = "## Holiday\nThe desk closes at noon."
    send("anything else?")
    reply_count = len(history)
    history.pop()  # regenerate the last answer
    send(None)
    assert len(history) == reply_count
