"""The stand-in's OpenAI Responses API shape (`POST /v1/responses`), JSON and SSE.

The script reads the request as chat: `instructions` a system message, input messages by
role (developer as system), function and custom tool calls as assistant tool_calls, their
outputs as `tool` messages; function and custom tools (flat, `{"type", "name", ...}`, in `tools`
or in an `additional_tools` input item, namespaces opened) are offered by name, hosted tools
(web_search, ...) ignored. `previous_response_id` prepends what that response saw and said while
the stand-in still remembers it (the last 1,000 stored ones);
otherwise the input is taken as the whole conversation. The prompt is cached under OpenAI's
rules, in its order: tools, instructions, input. Streams are named SSE events, each with a
sequence number, ending with `response.completed` (no `[DONE]`).
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections import OrderedDict
from collections.abc import AsyncIterator

import orjson
from starlette.responses import Response, StreamingResponse

from proxy.jsontext import Json, JsonObject, canonical
from proxy.standin.caching import Block
from proxy.standin.chat import openai_error
from proxy.standin.script import Script
from proxy.standin.shape import Rules, Turn, named_event, pieces, spoken

REMEMBERED = 1000  # stored responses kept for previous_response_id
TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesShape:
    rules: Rules | None = "openai"

    def __init__(self) -> None:
        self._stored: OrderedDict[str, list[JsonObject]] = OrderedDict()  # response id -> its input and output

    def read(self, body: Json) -> JsonObject | None:
        ok = isinstance(body, dict) and (body.get("input") is None or isinstance(body["input"], str | list))
        return body if ok else None

    def items(self, body: JsonObject) -> list[JsonObject]:
        """The conversation: a remembered previous response's items, then this input's."""
        earlier = self._stored.get(str(body.get("previous_response_id")), [])
        value = body.get("input")
        if isinstance(value, str):
            return [*earlier, {"type": "message", "role": "user", "content": value}]
        return [*earlier, *(item for item in value or [] if isinstance(item, dict))]

    def chat_view(self, body: JsonObject) -> JsonObject:
        messages: list[JsonObject] = []
        if isinstance(body.get("instructions"), str) and body["instructions"]:
            messages.append({"role": "system", "content": body["instructions"]})
        messages.extend(m for m in map(_as_chat, self.items(body)) if m is not None)
        tools = [{"type": "function", "function": {"name": name}} for name in _offered(body)]
        view: JsonObject = {"model": body.get("model"), "messages": messages, "tools": tools}
        if body.get("top_logprobs") or "message.output_text.logprobs" in (body.get("include") or []):
            view["logprobs"] = True
        return view

    def prompt(self, body: JsonObject) -> list[Block]:
        blocks = [Block(canonical(tool).decode(), False) for tool in body.get("tools") or []]
        if isinstance(body.get("instructions"), str) and body["instructions"]:
            blocks.append(Block("<|system|>" + body["instructions"], False))
        blocks.extend(Block(_rendered(item), False) for item in self.items(body))
        return blocks

    def error(self, status: int, message: str, type_: str) -> Response:
        return openai_error(status, message, type_)

    def answer(self, turn: Turn) -> Response:
        body, cache = turn.body, turn.cache
        rid = "resp_" + hashlib.blake2b(turn.raw, digest_size=16).hexdigest()
        output = output_items(rid, turn.script, _offered(body), bool(turn.view.get("logprobs")))
        usage = {
            "input_tokens": cache.prompt_tokens,
            "input_tokens_details": {"cached_tokens": cache.cached_tokens},
            "output_tokens": turn.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": cache.prompt_tokens + turn.completion_tokens,
        }
        response = _response(rid, body, output, usage)
        if body.get("store") is not False:  # stored unless the client says not to
            self._stored[rid] = [*self.items(body), *output]
            self._stored.move_to_end(rid)
            while len(self._stored) > REMEMBERED:
                self._stored.popitem(last=False)
        if body.get("stream"):
            return StreamingResponse(_stream(response, turn.script), media_type="text/event-stream", headers=turn.headers)
        return Response(orjson.dumps(response), media_type="application/json", headers=turn.headers)


def _offered(body: JsonObject) -> dict[str, str]:
    """Tools the model may call, by name: function or custom (hosted tools run at the provider), from
    `tools` and from `additional_tools` input items (newer Codex models send theirs so), namespaces
    opened: a namespaced tool is offered by its own name."""
    tools: list[Json] = list(body.get("tools") or [])
    inputs = body.get("input")
    for item in inputs if isinstance(inputs, list) else []:
        if isinstance(item, dict) and item.get("type") == "additional_tools" and isinstance(item.get("tools"), list):
            tools.extend(item["tools"])
    offered: dict[str, str] = {}
    while tools:
        tool = tools.pop(0)
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
            tools[:0] = tool["tools"]
        elif tool.get("type") in ("function", "custom") and isinstance(tool.get("name"), str):
            offered[tool["name"]] = str(tool["type"])
    return offered


def _text(content: Json) -> str | list[JsonObject]:
    """Message or tool-output content as chat content: a string, or its text parts."""
    if isinstance(content, str):
        return content
    return [{"type": "text", "text": p["text"]} for p in content or []
            if isinstance(p, dict) and p.get("type") in TEXT_PARTS and isinstance(p.get("text"), str)]


def _as_chat(item: JsonObject) -> JsonObject | None:
    kind = item.get("type", "message")
    if kind == "message":
        role = str(item.get("role", "user"))
        return {"role": "system" if role == "developer" else role, "content": _text(item.get("content"))}
    if kind in ("function_call", "custom_tool_call"):
        arguments = item.get("arguments" if kind == "function_call" else "input")
        call = {"id": item.get("call_id"), "type": "function",
                "function": {"name": item.get("name"), "arguments": arguments if isinstance(arguments, str) else ""}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {"role": "tool", "tool_call_id": item.get("call_id"), "content": _text(item.get("output"))}
    return None  # reasoning, item references, hosted tool calls: nothing the script reads


def _rendered(item: JsonObject) -> str:
    """An input item as the model would see it: a message as its role and text, the rest as JSON."""
    if item.get("type", "message") != "message":
        return canonical(item).decode()
    content = item.get("content")
    head = f"<|{item.get('role')}|>"
    if isinstance(content, str):
        return head + content
    parts = content if isinstance(content, list) else []
    return head + "".join(p["text"] if isinstance(p, dict) and p.get("type") in TEXT_PARTS and isinstance(p.get("text"), str)
                          else canonical(p).decode() for p in parts)


def _item_id(prefix: str, seed: str) -> str:
    return prefix + hashlib.blake2b(seed.encode(), digest_size=16).hexdigest()


def output_items(rid: str, script: Script, offered: dict[str, str], logprobs: bool) -> list[JsonObject]:
    """The answer as output items: a message for text, a function_call (or custom_tool_call) per call."""
    items: list[JsonObject] = []
    if script.text is not None:
        part: JsonObject = {"type": "output_text", "text": script.text, "annotations": []}
        if logprobs and script.logprobs:
            top = [{"token": t["token"], "logprob": t["logprob"], "bytes": list(t["token"].encode())} for t in script.logprobs]
            part["logprobs"] = [{**top[0], "top_logprobs": top}]
        items.append({"type": "message", "id": _item_id("msg_", rid), "status": "completed", "role": "assistant",
                      "content": [part]})
    for call in script.tool_calls:
        if offered.get(call.name) == "custom":
            items.append({"type": "custom_tool_call", "id": _item_id("ctc_", call.id), "call_id": call.id,
                          "name": call.name, "input": call.arguments, "status": "completed"})
        else:
            items.append({"type": "function_call", "id": _item_id("fc_", call.id), "call_id": call.id,
                          "name": call.name, "arguments": call.arguments, "status": "completed"})
    return items


def _response(rid: str, body: JsonObject, output: list[JsonObject], usage: JsonObject) -> JsonObject:
    """The response object, echoing the request's settings as OpenAI does."""
    return {
        "id": rid, "object": "response", "created_at": int(time.time()), "status": "completed",
        "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"), "model": str(body.get("model") or "standin"),
        "output": output, "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"), "prompt_cache_key": body.get("prompt_cache_key"),
        "store": body.get("store", True), "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}}, "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [], "top_p": body.get("top_p", 1.0), "truncation": body.get("truncation", "disabled"),
        "metadata": body.get("metadata") or {}, "usage": usage,
    }


_ARGUMENT_EVENTS = {"function_call": ("arguments", "response.function_call_arguments"),
                    "custom_tool_call": ("input", "response.custom_tool_call_input")}


async def _stream(response: JsonObject, script: Script) -> AsyncIterator[bytes]:
    sequence = itertools.count()

    def event(type_: str, **fields: Json) -> bytes:
        return named_event(type_, {"type": type_, **fields, "sequence_number": next(sequence)})

    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=pending)
    yield event("response.in_progress", response=pending)
    for index, item in enumerate(response["output"]):
        at: JsonObject = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            part = item["content"][0]
            yield event("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []})
            yield event("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
            first = True
            async for word in spoken(script):
                yield event("response.output_text.delta", **at, content_index=0, delta=word,
                            logprobs=part.get("logprobs", []) if first else [])
                first = False
            yield event("response.output_text.done", **at, content_index=0, text=part["text"], logprobs=part.get("logprobs", []))
            yield event("response.content_part.done", **at, content_index=0, part=part)
        else:
            key, name = _ARGUMENT_EVENTS[item["type"]]
            yield event("response.output_item.added", output_index=index, item={**item, key: "", "status": "in_progress"})
            for piece in pieces(item[key]):
                yield event(name + ".delta", **at, delta=piece)
            yield event(name + ".done", **at, **{key: item[key]})
        yield event("response.output_item.done", output_index=index, item=item)
    if script.cut:
        raise ConnectionAbortedError("stand-in: stream cut on purpose")
    yield event("response.completed", response=response)
