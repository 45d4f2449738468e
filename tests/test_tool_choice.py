"""A `tool_choice` names what the client requires, and Keel ships it (issue 20, finding 12): every
form on every shape, through the openai and anthropic SDKs, read off what the stand-in received.
A forced or allowed tool is shipped whatever the ranking thought of it; a required call ("required",
Messages' "any") is never left with nothing but Keel's own tool_search to call; tool_choice itself
reaches the upstream as the client sent it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest
from conftest import KEY, ServerThread, keel_config, small_catalog, tenant

THANKS = "thanks, that's all!"  # the needs-tool gate withholds every ranked tool; nothing ranks lexically
WANTED = "archive_ticket"


def client_tools(shape: str) -> list[dict[str, Any]]:
    tools = small_catalog()
    if shape == "responses":
        return [{"type": "function", **t["function"]} for t in tools]
    if shape == "messages":
        return [{"name": t["function"]["name"], "description": t["function"]["description"],
                 "input_schema": t["function"]["parameters"]} for t in tools]
    return tools


def upstream(standin: ServerThread) -> tuple[list[str], Any]:
    """The first upstream request of the last turn: its tool names and its tool_choice."""
    body: dict[str, Any] = standin.app.state.standin.requests[-1]
    names = [t.get("name") or t.get("function", {}).get("name") for t in body.get("tools", [])]
    return names, body.get("tool_choice")


def client_tool_shipped(names: list[str]) -> bool:
    return any(n in {t["function"]["name"] for t in small_catalog()} for n in names)


@pytest.fixture
def keel(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> ServerThread:
    return start_keel(keel_config(tenant(standin.url + "/v1", tools={"enabled": True, "stability": "per_turn"})))


CHAT = [
    ("required", None),
    ({"type": "function", "function": {"name": WANTED}}, WANTED),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": WANTED}}]}}, WANTED),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
        {"type": "function", "function": {"name": WANTED}}]}}, WANTED),
]


@pytest.mark.parametrize("choice, named", CHAT, ids=["required", "function", "allowed_required", "allowed_auto"])
def test_chat_tool_choice(keel: ServerThread, standin: ServerThread, choice: Any, named: str | None) -> None:
    client = openai.OpenAI(base_url=keel.url + "/v1", api_key=KEY, max_retries=0)
    client.chat.completions.create(model="m", tools=client_tools("chat"), tool_choice=choice,  # type: ignore[arg-type]
                                   messages=[{"role": "user", "content": THANKS}])
    names, sent = upstream(standin)
    assert sent == choice
    assert named in names if named else client_tool_shipped(names), names


def test_chat_none_and_auto_leave_the_gate_alone(keel: ServerThread, standin: ServerThread) -> None:
    """"none" and "auto" require nothing: a thanks still ships no ranked tool."""
    client = openai.OpenAI(base_url=keel.url + "/v1", api_key=KEY, max_retries=0)
    for choice in ("none", "auto"):
        client.chat.completions.create(model="m", tools=client_tools("chat"), tool_choice=choice,  # type: ignore[arg-type]
                                       messages=[{"role": "user", "content": THANKS}])
        names, sent = upstream(standin)
        assert sent == choice and names == ["tool_search"]


RESPONSES = [
    ("required", None),
    ({"type": "function", "name": WANTED}, WANTED),
    ({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": WANTED}]}, WANTED),
]


@pytest.mark.parametrize("choice, named", RESPONSES, ids=["required", "function", "allowed_tools"])
def test_responses_tool_choice(keel: ServerThread, standin: ServerThread, choice: Any, named: str | None) -> None:
    client = openai.OpenAI(base_url=keel.url + "/v1", api_key=KEY, max_retries=0)
    client.responses.create(model="m", input=THANKS, tools=client_tools("responses"),  # type: ignore[arg-type]
                            tool_choice=choice, store=False)
    names, sent = upstream(standin)
    assert sent == choice
    assert named in names if named else client_tool_shipped(names), names


MESSAGES = [({"type": "any"}, None), ({"type": "tool", "name": WANTED}, WANTED)]


@pytest.mark.parametrize("choice, named", MESSAGES, ids=["any", "tool"])
def test_messages_tool_choice(standin: ServerThread, start_keel: Callable[..., ServerThread], choice: Any,
                              named: str | None) -> None:
    config = tenant(standin.url + "/v1", tools={"enabled": True, "stability": "per_turn"})
    config["upstream"]["kind"] = "anthropic-compatible"
    keel = start_keel(keel_config(config))
    client = anthropic.Anthropic(base_url=keel.url, api_key=KEY, max_retries=0)
    client.messages.create(model="claude", max_tokens=50, tools=client_tools("messages"),  # type: ignore[arg-type]
                           tool_choice=choice, messages=[{"role": "user", "content": THANKS}])
    names, sent = upstream(standin)
    assert sent == choice
    assert named in names if named else client_tool_shipped(names), names
