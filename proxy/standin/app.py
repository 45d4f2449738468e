"""The stand-in provider: a fake model endpoint for tests, benchmarks and demos.

It serves three API shapes with one behaviour: OpenAI Chat Completions (`chat`), the OpenAI
Responses API (`responses`) and Anthropic Messages (`messages`), JSON and SSE. It answers
deterministically (see `script`), reports the tool block it was handed in `x-standin-tools`,
and simulates provider prefix caching (see `caching`): Responses under OpenAI's rules, Messages
under Anthropic's, chat under `--rules` (auto: Anthropic's when a block carries cache_control).
Usage objects carry only each provider's own fields; what a perfect cache would have served
goes in `x-standin-prefix-ceiling`, streamed or not. Embeddings come as floats or, with
`encoding_format: "base64"`, as OpenAI sends them: little-endian float32, base64.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import struct
from collections import deque
from dataclasses import dataclass
from typing import Literal

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.jsontext import JsonObject
from proxy.standin.caching import CacheUsage, PrefixCache, TooManyBreakpointsError
from proxy.standin.chat import ChatShape
from proxy.standin.compress import GzipEverything
from proxy.standin.messages import MessagesShape
from proxy.standin.responses import ResponsesShape
from proxy.standin.script import Script, plan_answer
from proxy.standin.shape import Rules, Shape, Turn
from proxy.tokens import TokenCounter

log = logging.getLogger("keel.standin")

CacheRules = Literal["auto", "openai", "anthropic", "none"]


@dataclass(frozen=True)
class Served:
    """One answered request as the provider would bill it."""

    shape: str
    tools: str  # "count=…; chars=…; tokens=…" (the x-standin-tools header)
    prompt_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    ceiling: int | None  # what a perfect prefix cache would have served
    completion_tokens: int = 0

    @property
    def tool_tokens(self) -> int:
        return int(self.tools.rsplit("tokens=", 1)[1]) if "tokens=" in self.tools else 0


class StandIn:
    def __init__(self, rules: CacheRules = "auto", tokens: TokenCounter | None = None) -> None:
        self.rules = rules
        self.tokens = tokens or TokenCounter()
        self.cache = PrefixCache(self.tokens)
        if rules != "none":
            self.tokens.encode("warm up")  # load the encoding at start, not on the first request
        self.requests: deque[JsonObject] = deque(maxlen=1000)  # recent request bodies, every shape, for tests
        self.headers: deque[dict[str, str]] = deque(maxlen=1000)  # their headers, in the same order
        self.served: deque[Served] = deque(maxlen=1000)  # what each answered request cost, for benchmarks
        self.embedding_inputs = 0  # texts embedded so far, for tests
        self.chat_shape = ChatShape()
        self.responses_shape = ResponsesShape()
        self.messages_shape = MessagesShape()

    def simulate(self, shape: Shape, body: JsonObject, raw: bytes) -> tuple[CacheUsage, Rules | None, int | None]:
        """Cache usage under the rules that apply, those rules, and the prefix ceiling: the tokens a
        perfect cache would have served (None without cache simulation)."""
        if self.rules == "none":  # no cache simulation: a cheap estimate (for overhead benchmarks)
            return CacheUsage(len(raw) // 4, 0, 0), None, None
        blocks = shape.prompt(body)
        rules: Rules = shape.rules or ("anthropic" if self.rules == "anthropic" else "openai")
        if shape.rules is None and self.rules == "auto" and any(b.breakpoint for b in blocks):
            rules = "anthropic"
        cache = self.cache.anthropic(blocks) if rules == "anthropic" else self.cache.openai(blocks)
        return cache, rules, self.cache.ceiling(blocks)

    def completion_tokens(self, script: Script) -> int:
        if self.rules == "none":
            return 1
        return self.tokens.count(script.text or "".join(c.name + c.arguments for c in script.tool_calls))

    def tool_report(self, body: JsonObject) -> str:
        tools = body.get("tools") or []
        texts = [orjson.dumps(t).decode() for t in tools]
        chars = sum(map(len, texts)) + (len(texts) + 1 if texts else 0)  # the JSON array's brackets and commas
        tokens = sum(self.tokens.count(t) for t in texts) if self.rules != "none" else chars // 4
        return f"count={len(tools)}; chars={chars}; tokens={tokens}"

    async def serve(self, shape: Shape, request: Request) -> Response:
        """Every shape's answer loop: read, record, plan, wait, fail or account, then render."""
        raw = await request.body()
        try:
            body = shape.read(orjson.loads(raw))
        except orjson.JSONDecodeError:
            body = None
        if body is None:
            return shape.error(400, "invalid request body", "invalid_request_error")
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        view = shape.chat_view(body)
        script = plan_answer(view)
        if script.sleep:
            await asyncio.sleep(script.sleep)
        if script.error_status:
            return shape.error(script.error_status, f"stand-in error {script.error_status}", "api_error")
        try:
            cache, rules, ceiling = self.simulate(shape, body, raw)
        except TooManyBreakpointsError as exc:
            return shape.error(400, str(exc), "invalid_request_error")
        completion = self.completion_tokens(script)
        report = self.tool_report(body)
        self.served.append(Served(type(shape).__name__.removesuffix("Shape").lower(), report, cache.prompt_tokens, cache.cached_tokens,
                                  getattr(cache, "cache_write_tokens", 0), ceiling, completion))
        if log.isEnabledFor(logging.INFO):
            log.info("standin_request", extra={"tools": report, "prompt_tokens": cache.prompt_tokens,
                                               "cached_tokens": cache.cached_tokens})
        headers = {"x-standin-tools": report}
        if ceiling is not None:  # not a usage field: no provider reports it (benchmarks sum it per response)
            headers["x-standin-prefix-ceiling"] = str(ceiling)
        return shape.answer(Turn(raw, body, view, script, cache, rules, completion, headers))

    async def chat(self, request: Request) -> Response:
        return await self.serve(self.chat_shape, request)

    async def responses(self, request: Request) -> Response:
        return await self.serve(self.responses_shape, request)

    async def messages(self, request: Request) -> Response:
        return await self.serve(self.messages_shape, request)

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


def create_standin_app(rules: CacheRules = "auto", standin: StandIn | None = None,
                       gzip: bool = False) -> Starlette:
    """`gzip`: answer as a provider behind a CDN does, every reply gzipped when the client accepts it."""
    standin = standin or StandIn(rules)
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", standin.chat, methods=["POST"]),
            Route("/v1/responses", standin.responses, methods=["POST"]),
            Route("/v1/messages", standin.messages, methods=["POST"]),
            Route("/v1/models", standin.models, methods=["GET"]),
            Route("/v1/embeddings", standin.embeddings, methods=["POST"]),
        ]
    )
    app.state.standin = standin
    if gzip:
        app.add_middleware(GzipEverything)
    return app
