"""/v1/responses: `instructions` and `input` items in, the planners' chat-shaped view out, and back.

    instructions                         -> a leading system message (marked, rendered back to it)
    input "text"                         -> one user message
    {"type": "message", role, content}   -> a message; input_text/output_text parts -> text parts
    assistant message and call items in a row -> one assistant message with `tool_calls` (the
                                            answer as one message, as in chat; rendered back
                                            as those same items while unchanged)
    function_call_output (and custom)    -> a role `tool` message
    anything else (reasoning, web_search_call, item_reference, ...) -> role `item`, kept as sent
    tools: flat function tools           -> {"type": "function", "function": {...}}; hosted and
                                            custom tools ride along as sent (`render_tools`)
A message item a planner changes (the date added to a developer message) keeps its own fields
(`id`, `status`) and key order; only its content is new.
"""

from __future__ import annotations

from proxy.codecs import KEEL, Origins, ToolViews, View, render_tools, strip_keel, view_body
from proxy.jsontext import Json, JsonObject
from proxy.messages import message_text

ITEM = "item"  # the view role of an input item the planners leave alone


def _part(part: Json, take: Origins) -> Json:
    if isinstance(part, dict) and part.get("type") in ("input_text", "output_text") and isinstance(part.get("text"), str):
        return take.take({"type": "text", "text": part["text"]}, part)
    return take.take({"type": "opaque", KEEL: "part", "part": part}, part)


def _content(content: Json, take: Origins) -> Json:
    if isinstance(content, list):
        return [_part(p, take) for p in content]
    return content


def _answer_part(item: JsonObject) -> bool:
    """Is this item part of an assistant answer (its text, or a call it makes)?"""
    kind = item.get("type", "message")
    return (kind == "message" and item.get("role") == "assistant") or kind in ("function_call", "custom_tool_call")


def item_messages(items: list[JsonObject], take: Origins) -> list[JsonObject]:
    """Input or output items as view messages, an answer's items in a row as one message."""
    out: list[JsonObject] = []
    run: list[JsonObject] = []
    for item in [*items, {"type": "end"}]:
        if _answer_part(item):
            run.append(item)
            continue
        if run:
            out.append(_answer(run, take))
            run = []
        if item.get("type") != "end":
            out.append(_message(item, take))
    return out


def _answer(items: list[JsonObject], take: Origins) -> JsonObject:
    parts: list[Json] = []
    calls: list[JsonObject] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            given = item.get("content")
            parts += [_part(p, take) for p in given] if isinstance(given, list) else (
                [take.take({"type": "text", "text": given}, given)] if isinstance(given, str) else [])
            continue
        arguments = item.get("arguments") if kind == "function_call" else item.get("input")
        calls.append(take.take({"id": item.get("call_id"), "type": "function" if kind == "function_call" else "custom",
                                "function": {"name": item.get("name"), "arguments": arguments}}, item))
    texts = [p for p in parts if p.get("type") == "text"]
    content: Json = "".join(p["text"] for p in texts) if len(texts) == len(parts) else parts
    message: JsonObject = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = calls
    return take.take(message, items)


def _message(item: JsonObject, take: Origins) -> JsonObject:
    kind = item.get("type", "message")
    if kind == "message" and isinstance(item.get("role"), str):
        message = {"role": item["role"], "content": _content(item.get("content"), take)}
        if set(item) - {"type", "role", "content"}:  # an `id`, a `status`: kept when a planner changes the content
            message[KEEL] = {k: None if k == "content" else v for k, v in item.items()}
        return take.take(message, item)
    if kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        text = output if isinstance(output, str) else message_text({"content": _content(output, Origins())})
        return take.take({"role": "tool", "tool_call_id": item.get("call_id"), "content": text}, item)
    return take.take({"role": ITEM, ITEM: item}, item)


def _is_function(tool: Json) -> bool:
    """A function tool Keel can plan around (hosted, custom and namespace tools ride along as sent)."""
    return isinstance(tool, dict) and tool.get("type") == "function" and isinstance(tool.get("name"), str)


def function_tool(tool: JsonObject) -> JsonObject:
    """A flat Responses function tool as the view's `{"type": "function", "function": {...}}`; the
    client's own object rides along (`_keel`), so it is rendered as sent in later requests too."""
    function = {k: v for k, v in tool.items() if k != "type"}
    return {"type": "function", "function": function, KEEL: tool}


def tool_choice(choice: Json) -> Json:
    """Responses' tool_choice in chat's forms: a named function, allowed tools ("none", "auto" and
    "required" are chat's own; hosted tools' choices name no function)."""
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if choice.get("type") == "allowed_tools":
        tools = choice.get("tools")
        named = [{"type": "function", "function": {"name": t.get("name")}}
                 for t in (tools if isinstance(tools, list) else []) if isinstance(t, dict) and t.get("type") == "function"]
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice.get("mode"), "tools": named}}
    return choice


class ResponsesCodec:
    def __init__(self) -> None:
        self._tools = ToolViews()

    def check(self, wire: JsonObject) -> None:
        given = wire.get("input")
        if isinstance(given, list) and not all(isinstance(item, dict) for item in given):
            raise ValueError("every entry of 'input' must be an object")
        if given is not None and not isinstance(given, (str, list)):
            raise ValueError("'input' must be a string or a list of items")

    def view(self, wire: JsonObject) -> View:
        self.check(wire)
        take = Origins()
        messages: list[JsonObject] = []
        instructions = wire.get("instructions")
        if isinstance(instructions, str) and instructions:
            messages.append(take.take({"role": "system", "content": instructions, KEEL: "instructions"}, instructions))
        given = wire.get("input")
        if isinstance(given, str):
            messages.append(take.take({"role": "user", "content": given}, given))
        elif isinstance(given, list):
            messages += item_messages(given, take)
        return view_body(wire, messages, ("input", "instructions", "tools"), _is_function, function_tool, tool_choice,
                         take, self._tools)

    def render(self, body: JsonObject, view: View) -> JsonObject:
        wire = dict(view.wire)
        if body.get("messages") is not view.body.get("messages"):
            instructions = [m for m in body["messages"] if m.get(KEEL) in ("instructions", "front")]
            if instructions:
                wire["instructions"] = view.original(instructions[0]) or "\n\n".join(
                    message_text(m) for m in instructions)
            items = [item for m in body["messages"] if m.get(KEEL) not in ("instructions", "front")
                     for item in self._items(m, view)]
            if len(items) == 1 and isinstance(items[0], str):
                wire["input"] = items[0]  # the client's string input, as sent
            else:
                wire["input"] = [{"role": "user", "content": i} if isinstance(i, str) else i for i in items]
        tools = render_tools(body, view, _is_function, self._tool)
        if tools is not None:
            wire["tools"] = tools
        if "prompt_cache_key" in body and "prompt_cache_key" not in wire:
            wire["prompt_cache_key"] = body["prompt_cache_key"]
        if body.get("previous_response_id") != view.body.get("previous_response_id"):
            wire["previous_response_id"] = body["previous_response_id"]
        return wire

    def _items(self, message: JsonObject, view: View) -> list[Json]:
        kept = view.original(message)
        if kept is not None:
            return list(kept) if isinstance(kept, list) else [kept]
        role = message.get("role")
        if role == ITEM:
            return [message[ITEM]]
        if role == "tool":
            return [{"type": "function_call_output", "call_id": message.get("tool_call_id"),
                     "output": message_text(message)}]
        out: list[Json] = []
        content = message.get("content")
        if content not in (None, "", []):
            kind = "output_text" if role == "assistant" else "input_text"
            parts = content if isinstance(content, str) else [self._part(p, view, kind) for p in content]
            source = message.get(KEEL)
            if isinstance(source, dict):  # the client's item, its own fields and key order, with the new content
                out.append({k: parts if k == "content" else role if k == "role" else v for k, v in source.items()})
            else:
                out.append({"type": "message", "role": role, "content": parts})
        for call in message.get("tool_calls") or []:
            original = view.original(call)
            if original is not None:
                out.append(original)
                continue
            function = call.get("function") or {}
            if call.get("type") == "custom":
                out.append({"type": "custom_tool_call", "call_id": call.get("id"), "name": function.get("name"),
                            "input": function.get("arguments")})
            else:
                out.append({"type": "function_call", "call_id": call.get("id"), "name": function.get("name"),
                            "arguments": function.get("arguments") or "{}"})
        return out

    @staticmethod
    def _part(part: JsonObject, view: View, kind: str) -> Json:
        original = view.original(part)
        if original is not None:
            return original
        if part.get(KEEL) == "part":
            return part["part"]
        if part.get("type") == "text":
            return {"type": kind, "text": part.get("text", "")}
        return strip_keel(part)

    @staticmethod
    def _tool(tool: JsonObject) -> JsonObject:
        """A view function tool as a flat Responses tool: the client's own, or Keel's (tool_search)."""
        client = tool.get(KEEL)
        if isinstance(client, dict):
            return client
        return {"type": "function", **(tool.get("function") or {})}
