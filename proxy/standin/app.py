"""The stand-in provider: an OpenAI-compatible model endpoint for tests, benchmarks and demos.

It answers deterministically (see `script`), streams exactly like OpenAI (role delta,
content deltas, tool_call deltas by index with id and name first, finish_reason, a usage
chunk when `stream_options.include_usage` is set), reports the tool block it was handed in
`x-standin-tools`, and simulates provider prefix caching (see `caching`). Its usage objects carry
only OpenAI's fields (and Anthropic's cache fields under its rules); what a perfect cache would
have served goes in `x-standin-prefix-ceiling`, streamed or not. Embeddings come as floats or,
with `encoding_format: "base64"`, as OpenAI sends them: little-endian float32, base64.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import struct
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Literal

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from proxy.errors import error_body
from proxy.standin.caching import PrefixCache, TooManyBreakpointsError, prompt_blocks
from proxy.standin.script import Script, plan_answer
from proxy.tokens import TokenCounter

log = logging.getLogger("keel.standin")

CacheRules = Literal["auto", "openai", "anthropic", "none"]


class StandIn:
    def __init__(self, rules: CacheRules = "auto", tokens: TokenCounter | None = None) -> None:
        self.rules = rules
        self.tokens = tokens or TokenCounter()
        self.cache = PrefixCache(self.tokens)
        if rules != "none":
            self.tokens.encode("warm up")  # load the encoding at start, not on the first request
        self.requests: deque[dict[str, Any]] = deque(maxlen=1000)  # recent chat bodies, for tests
        self.embedding_inputs = 0  # texts embedded so far, for tests

    def usage(self, body: dict[str, Any], script: Script, raw: bytes) -> tuple[dict[str, Any], int | None]:
        """The usage object, and the prefix ceiling: the tokens a perfect cache would have served
        (None without cache simulation)."""
        if self.rules == "none":  # no cache simulation: a cheap estimate (for overhead benchmarks)
            prompt = len(raw) // 4
            return {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1,
                    "prompt_tokens_details": {"cached_tokens": 0}}, None
        blocks = prompt_blocks(body)
        anthropic = self.rules == "anthropic" or (self.rules == "auto" and any(b.breakpoint for b in blocks))
        cache = self.cache.anthropic(blocks) if anthropic else self.cache.openai(blocks)
        ceiling = self.cache.ceiling(blocks)
        out = script.text or "".join(c.name + c.arguments for c in script.tool_calls)
        completion = self.tokens.count(out)
        usage: dict[str, Any] = {
            "prompt_tokens": cache.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": cache.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cache.cached_tokens},
        }
        if anthropic:
            usage["cache_read_input_tokens"] = cache.cached_tokens
            usage["cache_creation_input_tokens"] = cache.cache_write_tokens
        return usage, ceiling

    def tool_report(self, body: dict[str, Any]) -> str:
        tools = body.get("tools") or []
        texts = [orjson.dumps(t).decode() for t in tools]
        chars = sum(map(len, texts)) + (len(texts) + 1 if texts else 0)  # the JSON array's brackets and commas
        tokens = sum(self.tokens.count(t) for t in texts) if self.rules != "none" else chars // 4
        return f"count={len(tools)}; chars={chars}; tokens={tokens}"

    async def chat(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = orjson.loads(raw)
            assert isinstance(body, dict) and isinstance(body.get("messages"), list)
        except (orjson.JSONDecodeError, AssertionError):
            return _error(400, "invalid request body", "invalid_request_error")
        self.requests.append(body)
        script = plan_answer(body)
        if script.sleep:
            await asyncio.sleep(script.sleep)
        if script.error_status:
            return _error(script.error_status, f"stand-in error {script.error_status}", "api_error")
        try:
            usage, ceiling = self.usage(body, script, raw)
        except TooManyBreakpointsError as exc:
            return _error(400, str(exc), "invalid_request_error")
        report = self.tool_report(body)
        if log.isEnabledFor(logging.INFO):
            log.info("standin_request", extra={"tools": report, "usage": usage})
        headers = {"x-standin-tools": report}
        if ceiling is not None:  # not a usage field: no provider reports it (benchmarks sum it per response)
            headers["x-standin-prefix-ceiling"] = str(ceiling)
        cid = "chatcmpl-" + hashlib.blake2b(raw, digest_size=12).hexdigest()
        model = str(body.get("model") or "standin")
        if body.get("stream"):
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            chunks = _stream(cid, model, script, usage if include_usage else None)
            return StreamingResponse(chunks, media_type="text/event-stream", headers=headers)
        message: dict[str, Any] = {"role": "assistant", "content": script.text, "refusal": None}
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
        return Response(orjson.dumps(payload), media_type="application/json", headers=headers)

    async def models(self, request: Request) -> Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "keel-standin"} for m in ("standin", "gpt-4o-mini")]
        return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")

    async def embeddings(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.embedding_inputs += len(body["input"]) if isinstance(body.get("input"), list) else 1
        inputs = body.get("input")
        texts = [inputs] if isinstance(inputs, str) else list(inputs or [])
        encode = _base64_vector if body.get("encoding_format") == "base64" else None
        data = [{"object": "embedding", "index": i, "embedding": encode(vector) if encode else vector}
                for i, vector in enumerate(map(_pseudo_vector, texts))]
        tokens = sum(self.tokens.count(t) for t in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return Response(orjson.dumps({"object": "list", "data": data, "model": body.get("model"), "usage": usage}),
                        media_type="application/json")


def _pseudo_vector(text: str, dims: int = 16) -> list[float]:
    digest = hashlib.blake2b(text.encode(), digest_size=dims).digest()
    return [(b - 128) / 128 for b in digest]


def _base64_vector(vector: list[float]) -> str:
    """OpenAI's base64 encoding: the vector as little-endian float32, base64 (standard alphabet)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def _error(status: int, message: str, type_: str) -> Response:
    return Response(error_body(message, type_, str(status)), status_code=status, media_type="application/json")


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def _stream(cid: str, model: str, script: Script, usage: dict[str, Any] | None) -> AsyncIterator[bytes]:
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        payload: dict[str, Any] = {
            "id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if usage is not None:
            payload["usage"] = None
        return _sse(payload)

    yield chunk({"role": "assistant", "content": "", "refusal": None})
    if script.text:
        words = script.text.split(" ")
        for i, word in enumerate(words):
            yield chunk({"content": word if i == 0 else " " + word})
            if script.cut and i == 1:
                raise ConnectionAbortedError("stand-in: stream cut on purpose")
            if script.drip:
                await asyncio.sleep(script.drip)
            elif i % 8 == 7:
                await asyncio.sleep(0)
    for index, call in enumerate(script.tool_calls):
        head = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        yield chunk({"tool_calls": [head]})
        for start in range(0, len(call.arguments), 16):
            piece = call.arguments[start : start + 16]
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    if script.cut:
        raise ConnectionAbortedError("stand-in: stream cut on purpose")
    yield chunk({}, script.finish_reason)
    if usage is not None:
        yield _sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [], "usage": usage})
    yield b"data: [DONE]\n\n"


def create_standin_app(rules: CacheRules = "auto", standin: StandIn | None = None) -> Starlette:
    standin = standin or StandIn(rules)
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", standin.chat, methods=["POST"]),
            Route("/v1/models", standin.models, methods=["GET"]),
            Route("/v1/embeddings", standin.embeddings, methods=["POST"]),
        ]
    )
    app.state.standin = standin
    return app
