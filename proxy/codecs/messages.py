"""/v1/messages: Anthropic's system blocks, content blocks and tools in, the chat-shaped view out.

    system (string or text blocks)   -> a leading system message (marked, rendered back to `system`)
    user content blocks              -> role `tool` messages for tool_result blocks, then one user
                                        message for the rest (text parts; images and documents
                                        ride along as sent); marked with their wire message
    assistant content blocks         -> one assistant message: every block a part in order
                                        (text, thinking, tool_use kept as sent) and `tool_calls`
                                        for the tool_use blocks
    a `system` entry inside messages -> a system message where it stands (Claude Code sends them)
    tools: {name, description, input_schema} -> function tools; server tools ride along (`render_tools`)

Rendering walks the view: the leading marked system messages become `system`; consecutive
user-side messages (tool results, user content) become one user message, and a run that is
exactly one client message, unchanged, goes back as the client sent it.
"""

from __future__ import annotations

from proxy import jsontext
from proxy.codecs import KEEL, Origins, ToolViews, View, render_tools, strip_keel, view_body
from proxy.jsontext import Json, JsonObject
from proxy.messages import message_text


def _part(block: Json, take: Origins) -> Json:
    if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
        part = {"type": "text", "text": block["text"]}
        if "cache_control" in block:
            part["cache_control"] = block["cache_control"]
        return take.take(part, block)
    return take.take({"type": "opaque", KEEL: "part", "part": block}, block)


def _user(message: JsonObject, group: int, take: Origins) -> list[JsonObject]:
    content = message.get("content")
    if not isinstance(content, list):
        return [take.take({"role": message["role"], "content": content, KEEL: f"g{group}"}, message)]
    out: list[JsonObject] = []
    rest: list[Json] = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            result = block.get("content")
            text = result if isinstance(result, str) else message_text({"content": [
                b for b in result or [] if isinstance(b, dict)]}) if isinstance(result, list) else ""
            out.append(take.take({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text,
                                  KEEL: f"g{group}"}, block))
        else:
            rest.append(_part(block, take))
    if rest or not out:
        out.append({"role": message["role"], "content": rest, KEEL: f"g{group}"})
    return out


def _assistant(message: JsonObject, group: int, take: Origins) -> JsonObject:
    content = message.get("content")
    if not isinstance(content, list):
        return take.take({"role": "assistant", "content": content, KEEL: f"g{group}"}, message)
    parts = [_part(block, take) for block in content]
    calls = [take.take({"id": b.get("id"), "type": "function", "function": {
        "name": b.get("name"), "arguments": jsontext.dumps(b.get("input", {})).decode()}}, b)
        for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
    view: JsonObject = {"role": "assistant", "content": parts, KEEL: f"g{group}"}
    if calls:
        view["tool_calls"] = calls
    return take.take(view, message)


def assistant_message(message: JsonObject, take: Origins) -> JsonObject:
    """An assistant answer (a round's content blocks) as a view message rendered back block for block."""
    view = _assistant(message, 0, take)
    view[KEEL] = "answer"
    return view


def function_tool(tool: JsonObject) -> JsonObject:
    """A Messages tool as a view function tool; the client's own object rides along (`_keel`), so
    a tool rendered again, in a later request too, is the client's, unknown fields and all."""
    function = {"name": tool["name"], "parameters": tool.get("input_schema", {})}
    if "description" in tool:
        function["description"] = tool["description"]
    out: JsonObject = {"type": "function", "function": function, KEEL: tool}
    if "cache_control" in tool:
        out["cache_control"] = tool["cache_control"]
    return out


def _is_custom(tool: Json) -> bool:
    return isinstance(tool, dict) and isinstance(tool.get("name"), str) and tool.get("type") in (None, "custom")


def tool_choice(choice: Json) -> Json:
    """Messages' tool_choice in chat's forms: `tool` a named function, `any` "required", `auto` and
    `none` themselves."""
    if not isinstance(choice, dict):
        return choice
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return "required" if kind == "any" else kind if kind in ("auto", "none") else choice


class MessagesCodec:
    def __init__(self) -> None:
        self._tools = ToolViews()

    def check(self, wire: JsonObject) -> None:
        given = wire.get("messages")
        if not isinstance(given, list) or not all(isinstance(m, dict) for m in given):
            raise ValueError("'messages' must be a list of message objects")

    def view(self, wire: JsonObject) -> View:
        self.check(wire)
        given = wire["messages"]
        take = Origins()
        messages: list[JsonObject] = []
        system = wire.get("system")
        if isinstance(system, str) and system:
            messages.append(take.take({"role": "system", "content": system, KEEL: "system"}, system))
        elif isinstance(system, list) and system:
            messages.append(take.take({"role": "system", "content": [_part(b, take) for b in system], KEEL: "system"},
                                      system))
        for group, message in enumerate(given):
            role = message.get("role")
            if role == "assistant":
                messages.append(_assistant(message, group, take))
            elif role == "user":
                messages += _user(message, group, take)
            else:
                messages.append(take.take({**message, KEEL: f"g{group}"}, message))
        return view_body(wire, messages, ("messages", "system", "tools"), _is_custom, function_tool, tool_choice, take,
                         self._tools)

    def render(self, body: JsonObject, view: View) -> JsonObject:
        wire = dict(view.wire)
        if body.get("messages") is not view.body.get("messages"):
            messages = body["messages"]
            lead = 0
            while lead < len(messages) and messages[lead].get(KEEL) in ("system", "front"):
                lead += 1
            if lead:
                wire["system"] = self._system(messages[:lead], view)
            elif "system" in wire:
                del wire["system"]
            wire["messages"] = self._messages(messages[lead:], view)
        tools = render_tools(body, view, _is_custom, lambda tool: self._tool(tool, view))
        if tools is not None:
            wire["tools"] = tools
        return wire

    @staticmethod
    def _block(part: Json, view: View) -> Json:
        original = view.original(part)
        if original is not None and (not isinstance(part, dict) or part.get("cache_control") == (
                original.get("cache_control") if isinstance(original, dict) else None)):
            return original
        if isinstance(part, dict) and part.get(KEEL) == "part":
            return part["part"]
        if isinstance(part, dict) and part.get("type") == "text":
            block = {"type": "text", "text": part.get("text", "")}
            if "cache_control" in part:
                block["cache_control"] = part["cache_control"]
            return block
        return strip_keel(part)

    def _system(self, messages: list[JsonObject], view: View) -> Json:
        if len(messages) == 1 and view.original(messages[0]) is not None:
            return view.original(messages[0])
        blocks: list[Json] = []
        for message in messages:
            content = message.get("content")
            if isinstance(content, list):
                blocks += [self._block(p, view) for p in content]
            elif isinstance(content, str) and content:
                blocks.append({"type": "text", "text": content})
        if all(isinstance(b, dict) and set(b) == {"type", "text"} for b in blocks):
            return "\n\n".join(b["text"] for b in blocks)  # plain text in, plain text out
        return blocks

    def _messages(self, messages: list[JsonObject], view: View) -> list[Json]:
        out: list[Json] = []
        run: list[JsonObject] = []  # consecutive user-side view messages: one wire user message

        def flush() -> None:
            if run:
                out.append(self._user_message(run, view))
                run.clear()

        for message in messages:
            if message.get("role") in ("user", "tool"):
                run.append(message)
                continue
            flush()
            original = view.original(message)
            if original is not None:
                out.append(original)
            elif message.get("role") == "assistant":
                out.append(self._assistant_message(message, view))
            else:
                out.append(strip_keel(message))
        flush()
        return out

    def _user_message(self, run: list[JsonObject], view: View) -> Json:
        group = run[0].get(KEEL)
        whole = [m for m in run if m.get(KEEL) == group]
        if group and len(whole) == len(run):  # one client message: as sent when nothing in it changed
            parts_unchanged = all(view.original(m) is not None or (
                m.get("role") == "user" and all(view.original(p) is not None for p in m.get("content") or []))
                for m in run)
            original = self._source(run, view)
            if parts_unchanged and original is not None:
                return original
        blocks: list[Json] = []
        for message in run:
            if message.get("role") == "tool":
                original = view.original(message)
                blocks.append(original if original is not None else {
                    "type": "tool_result", "tool_use_id": message.get("tool_call_id"), "content": message_text(message)})
                continue
            content = message.get("content")
            if isinstance(content, list):
                blocks += [self._block(p, view) for p in content]
            elif isinstance(content, str) and content:
                blocks.append({"type": "text", "text": content})
        if len(run) == 1 and isinstance(run[0].get("content"), str) and run[0].get("role") == "user":
            return {"role": "user", "content": run[0]["content"]}
        return {"role": "user", "content": blocks}

    @staticmethod
    def _source(run: list[JsonObject], view: View) -> Json:
        """The client message a run of view messages was made from, if every one came from it."""
        group = run[0].get(KEEL)
        if not isinstance(group, str) or not group.startswith("g"):
            return None
        index = int(group[1:])
        messages = view.wire.get("messages") or []
        source = messages[index] if index < len(messages) else None
        count = sum(1 for m in view.body["messages"] if m.get(KEEL) == group)
        return source if count == len(run) else None

    def _assistant_message(self, message: JsonObject, view: View) -> JsonObject:
        content = message.get("content")
        if isinstance(content, list) and message.get(KEEL):  # made from a client message: its blocks, in order
            return {"role": "assistant", "content": [self._block(p, view) for p in content]}
        blocks: list[Json] = [{"type": "text", "text": content}] if isinstance(content, str) and content else []
        for call in message.get("tool_calls") or []:
            original = view.original(call)
            if original is not None:
                blocks.append(original)
                continue
            function = call.get("function") or {}
            try:
                arguments = jsontext.loads(str(function.get("arguments") or "{}").encode())
            except ValueError:
                arguments = {}
            blocks.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
                           "input": arguments if isinstance(arguments, dict) else {}})
        return {"role": "assistant", "content": blocks}

    @staticmethod
    def _tool(tool: JsonObject, view: View) -> Json:
        client = tool.get(KEEL)
        if isinstance(client, dict):  # the client's tool, with the breakpoint a planner set or removed
            if tool.get("cache_control") == client.get("cache_control"):
                return client
            out = {k: v for k, v in client.items() if k != "cache_control"}
            if "cache_control" in tool:
                out["cache_control"] = tool["cache_control"]
            return out
        function = tool.get("function") or {}
        made: JsonObject = {"name": function.get("name")}
        if "description" in function:
            made["description"] = function["description"]
        made["input_schema"] = function.get("parameters", {"type": "object"})
        if "cache_control" in tool:
            made["cache_control"] = tool["cache_control"]
        return made
