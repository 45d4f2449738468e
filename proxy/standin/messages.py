"""The stand-in's Anthropic Messages shape (`POST /v1/messages`), JSON and SSE.

The script reads the request as chat: `system` (and any `role: system` entry Claude Code puts
in `messages`) as system messages, text blocks as text, `tool_use` blocks as assistant
tool_calls, `tool_result` blocks as `tool` messages. A user message that carries tool results
is a tool turn: text beside them (a harness's reminders) starts no new user turn. Images and
thinking blocks are left out; tools with a `name` and no `type` (or `custom`) are offered,
server tools (web search, tool search, ...) ignored. The API has no logprobs, so a yes/no judge
or tool picker prompt is answered in words. The prompt is cached under Anthropic's rules, in its
order (tools, system, messages), with breakpoints only where `cache_control` is; `usage.input_tokens`
counts what was neither read from nor written to the cache, as Anthropic's does.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import orjson
from starlette.responses import Response, StreamingResponse

from proxy.jsontext import Json, JsonObject
from proxy.standin.caching import Block, prompt_blocks
from proxy.standin.script import Script
from proxy.standin.shape import Rules, Turn, named_event, pieces, spoken

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}


class MessagesShape:
    rules: Rules | None = "anthropic"

    def read(self, body: Json) -> JsonObject | None:
        ok = (isinstance(body, dict) and isinstance(body.get("messages"), list)
              and all(isinstance(m, dict) for m in body["messages"]))
        return body if ok else None

    def chat_view(self, body: JsonObject) -> JsonObject:
        system = _text(body.get("system"))
        messages: list[JsonObject] = [{"role": "system", "content": system}] if system else []
        for message in body["messages"]:
            messages.extend(_as_chat(message))
        tools = [{"type": "function", "function": {"name": t["name"]}} for t in body.get("tools") or []
                 if isinstance(t, dict) and t.get("type", "custom") == "custom" and isinstance(t.get("name"), str)]
        # no logprobs in this API: a judge or picker prompt gets its answer in words
        return {"model": body.get("model"), "messages": messages, "tools": tools, "logprobs": True}

    def prompt(self, body: JsonObject) -> list[Block]:
        system = body.get("system")
        front = [{"role": "system", "content": system}] if system else []
        return prompt_blocks({"tools": body.get("tools") or [], "messages": [*front, *body["messages"]]})

    def error(self, status: int, message: str, type_: str) -> Response:
        error = {"type": "error", "error": {"type": ERROR_TYPES.get(status, type_), "message": message}}
        return Response(orjson.dumps(error), status_code=status, media_type="application/json")

    def answer(self, turn: Turn) -> Response:
        cache, script = turn.cache, turn.script
        usage = {
            "input_tokens": cache.prompt_tokens - cache.cached_tokens - cache.cache_write_tokens,
            "cache_creation_input_tokens": cache.cache_write_tokens,
            "cache_read_input_tokens": cache.cached_tokens,
            "output_tokens": turn.completion_tokens,
        }
        message = {
            "id": "msg_" + hashlib.blake2b(turn.raw, digest_size=12).hexdigest(), "type": "message",
            "role": "assistant", "model": str(turn.body.get("model") or "standin"), "content": content_blocks(script),
            "stop_reason": "tool_use" if script.tool_calls else "end_turn", "stop_sequence": None, "usage": usage,
        }
        if turn.body.get("stream"):
            return StreamingResponse(_stream(message, script), media_type="text/event-stream", headers=turn.headers)
        return Response(orjson.dumps(message), media_type="application/json", headers=turn.headers)


def _text(value: Json) -> str:
    """A string, or the text of a list of blocks (system, tool_result content), joined."""
    if isinstance(value, str):
        return value
    return "\n".join(b["text"] for b in value or []
                     if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str))


def _as_chat(message: JsonObject) -> list[JsonObject]:
    role, content = message.get("role"), message.get("content")
    if not isinstance(content, list):
        return [{"role": role, "content": content if isinstance(content, str) else ""}]
    blocks = [b for b in content if isinstance(b, dict)]
    results = [{"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": _text(b.get("content"))}
               for b in blocks if b.get("type") == "tool_result"]
    if results:
        return results
    out: JsonObject = {"role": role, "content": [{"type": "text", "text": b["text"]} for b in blocks
                                                     if b.get("type") == "text" and isinstance(b.get("text"), str)]}
    calls = [{"id": b.get("id"), "type": "function",
              "function": {"name": b.get("name"), "arguments": orjson.dumps(b.get("input") or {}).decode()}}
             for b in blocks if b.get("type") == "tool_use"]
    if calls:
        out["tool_calls"] = calls
    return [out]


def _input(arguments: str) -> JsonObject:
    """A tool call's arguments as Anthropic's `input` object (arguments that are no JSON object: {})."""
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def content_blocks(script: Script) -> list[JsonObject]:
    """The answer as content blocks: text, then a tool_use per call (ids `toolu_`, as Anthropic's)."""
    blocks: list[JsonObject] = [{"type": "text", "text": script.text}] if script.text else []
    blocks.extend({"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": call.name,
                   "input": _input(call.arguments)} for call in script.tool_calls)
    return blocks


async def _stream(message: JsonObject, script: Script) -> AsyncIterator[bytes]:
    def event(type_: str, **fields: Json) -> bytes:
        return named_event(type_, {"type": type_, **fields})

    start_usage = {**message["usage"], "output_tokens": 1}
    yield event("message_start", message={**message, "content": [], "stop_reason": None, "usage": start_usage})
    yield event("ping")
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            yield event("content_block_start", index=index, content_block={"type": "text", "text": ""})
            async for word in spoken(script):
                yield event("content_block_delta", index=index, delta={"type": "text_delta", "text": word})
        else:
            yield event("content_block_start", index=index, content_block={**block, "input": {}})
            for piece in pieces(orjson.dumps(block["input"]).decode()):
                yield event("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": piece})
        yield event("content_block_stop", index=index)
    if script.cut:
        raise ConnectionAbortedError("stand-in: stream cut on purpose")
    yield event("message_delta", delta={"stop_reason": message["stop_reason"], "stop_sequence": None},
                usage={"output_tokens": message["usage"]["output_tokens"]})
    yield event("message_stop")
