"""Reading chat messages: the text of a message, the newest user turn, the tools called."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.jsontext import JsonObject

Message = JsonObject


def message_text(message: Message) -> str:
    """The text of a message: string content, or its text parts joined (images ignored)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p["text"] for p in content
                        if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str))
    return ""


def tool_calls(message: Message) -> list[Message]:
    """The calls an assistant message makes: the objects of its `tool_calls` list. Anything else there
    (a number, a string, an object) is the client's own odd input: no calls Keel can read, and
    forwarded as sent."""
    calls = message.get("tool_calls")
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def newest_user_index(messages: Sequence[Message]) -> int:
    """The index of the newest user message (-1 when there is none)."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    return -1


def newest_user_text(messages: Sequence[Message]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return message_text(message)
    return ""


def called_in_order(messages: Sequence[Message]) -> list[str]:
    """Names of the tools assistant messages in the history called, first call first."""
    names: list[str] = []
    for message in messages:
        for call in tool_calls(message):
            fn = call.get("function")
            if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"] not in names:
                names.append(fn["name"])
    return names


def called_tools(messages: Sequence[Message]) -> set[str]:
    """Names of every tool an assistant message in the history called."""
    return set(called_in_order(messages))
