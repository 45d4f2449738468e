"""The stand-in's OpenAI Chat Completions shape (`POST /v1/chat/completions`), JSON and SSE.

It streams exactly like OpenAI: a role delta, content deltas, tool_call deltas by index with
id and name first, the finish_reason, a usage chunk when `stream_options.include_usage` is set,
then `[DONE]`. The request already is the chat view the script reads.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator

import orjson
from starlette.responses import Response, StreamingResponse

from proxy.errors import error_body
from proxy.jsontext import Json, JsonObject
from proxy.standin.caching import Block, prompt_blocks
from proxy.standin.script import Script
from proxy.standin.shape import Rules, Turn, pieces, spoken


class ChatShape:
    rules: Rules | None = None  # --rules decides (auto: Anthropic's when a block carries cache_control)

    def read(self, body: Json) -> JsonObject | None:
        return body if isinstance(body, dict) and isinstance(body.get("messages"), list) else None

    def chat_view(self, body: JsonObject) -> JsonObject:
        return body

    def prompt(self, body: JsonObject) -> list[Block]:
        return prompt_blocks(body)

    def error(self, status: int, message: str, type_: str) -> Response:
        return openai_error(status, message, type_)

    def answer(self, turn: Turn) -> Response:
        body, script = turn.body, turn.script
        usage = chat_usage(turn)
        cid = "chatcmpl-" + hashlib.blake2b(turn.raw, digest_size=12).hexdigest()
        model = str(body.get("model") or "standin")
        if body.get("stream"):
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            chunks = _stream(cid, model, script, usage if include_usage else None)
            return StreamingResponse(chunks, media_type="text/event-stream", headers=turn.headers)
        message: JsonObject = {"role": "assistant", "content": script.text, "refusal": None}
        if script.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in script.tool_calls
            ]
        logprobs = None
        if script.logprobs:
            first = script.logprobs[0]
            logprobs = {"content": [{**first, "bytes": None, "top_logprobs": script.logprobs}]}
        payload = {
            "id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": script.finish_reason}],
            "usage": usage,
        }
        return Response(orjson.dumps(payload), media_type="application/json", headers=turn.headers)


def chat_usage(turn: Turn) -> JsonObject:
    """OpenAI's usage fields; under Anthropic's rules also Anthropic's two cache fields (what an
    OpenAI-compatible gateway in front of Claude reports)."""
    cache = turn.cache
    usage: JsonObject = {
        "prompt_tokens": cache.prompt_tokens,
        "completion_tokens": turn.completion_tokens,
        "total_tokens": cache.prompt_tokens + turn.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cache.cached_tokens},
    }
    if turn.rules == "anthropic":
        usage["cache_read_input_tokens"] = cache.cached_tokens
        usage["cache_creation_input_tokens"] = cache.cache_write_tokens
    return usage


def openai_error(status: int, message: str, type_: str) -> Response:
    return Response(error_body(message, type_, str(status)), status_code=status, media_type="application/json")


def _sse(payload: JsonObject) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def _stream(cid: str, model: str, script: Script, usage: JsonObject | None) -> AsyncIterator[bytes]:
    created = int(time.time())

    def chunk(delta: JsonObject, finish: str | None = None) -> bytes:
        payload: JsonObject = {
            "id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if usage is not None:
            payload["usage"] = None
        return _sse(payload)

    yield chunk({"role": "assistant", "content": "", "refusal": None})
    async for word in spoken(script):
        yield chunk({"content": word})
    for index, call in enumerate(script.tool_calls):
        head = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        yield chunk({"tool_calls": [head]})
        for piece in pieces(call.arguments):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    if script.cut:
        raise ConnectionAbortedError("stand-in: stream cut on purpose")
    yield chunk({}, script.finish_reason)
    if usage is not None:
        yield _sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [], "usage": usage})
    yield b"data: [DONE]\n\n"
