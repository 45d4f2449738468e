"""What a client's `tool_choice` requires of the tools Keel ships.

A tool the client forces (`{"type": "function", …}`) or allows (`allowed_tools`) must ship, or
the model cannot call it (the provider refuses a choice naming a tool that is not there, and
`tool_search` is not among the allowed); a call the client requires ("required", Messages'
"any") must find client tools to call, not only Keel's `tool_search`, whatever the needs-tool
gate made of the words. The codecs hand over every shape's forms in chat's (`view_body`), so
this reads one vocabulary: "none", "auto", "required", a named function, allowed tools.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.jsontext import Json


@dataclass(frozen=True, slots=True)
class ToolChoice:
    required: bool = False  # the model must call a tool
    named: frozenset[str] = frozenset()  # the tools the client forces or allows: each ships


def _name(tool: Json) -> str | None:
    """A chat-form tool reference's name: {"type": "function", "function": {"name": …}}."""
    if not isinstance(tool, dict):
        return None
    function = tool.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def read_choice(value: Json) -> ToolChoice:
    """The view's `tool_choice` (chat's forms) as what it requires; anything else requires nothing."""
    if value == "required":
        return ToolChoice(required=True)
    if not isinstance(value, dict):
        return ToolChoice()
    if value.get("type") == "function":
        name = _name(value)
        return ToolChoice(True, frozenset({name})) if name else ToolChoice()
    allowed = value.get("allowed_tools")
    if value.get("type") == "allowed_tools" and isinstance(allowed, dict):
        tools = allowed.get("tools")
        names = frozenset(n for n in map(_name, tools if isinstance(tools, list) else []) if n)
        return ToolChoice(allowed.get("mode") == "required", names)
    return ToolChoice()
