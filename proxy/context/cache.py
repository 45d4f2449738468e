"""The cache planner: tell the provider where the stable prefix ends.

Anthropic-style upstreams (`anthropic-compatible`, `openrouter` with a Claude model, and every
/v1/messages request) cache only at `cache_control` breakpoints: at most 4 per request, each
read looking back at most 20 blocks. Keel places them where its frozen prefix ends: after the
tools, after the system prompt, at the end of the previous turn, and at the end of this one
(written now, read on the next turn), skipping any whose prefix is shorter than the model's
minimum. The client's own breakpoints are kept and count toward the 4. OpenAI-kind
upstreams cache automatically; Keel adds a `prompt_cache_key` per conversation segment so
that requests of one conversation land on the same cache.
"""

from __future__ import annotations

import hashlib

from proxy import breakpoints
from proxy.breakpoints import MAX_BREAKPOINTS
from proxy.config import TenantConfig
from proxy.jsontext import Json, JsonObject
from proxy.turn import Turn


def _marks(message: JsonObject) -> int:
    content = message.get("content")
    return sum(1 for p in content if isinstance(p, dict) and "cache_control" in p) if isinstance(content, list) else 0


def _client_marks(request: Turn) -> int:
    """Breakpoints the client set itself, wherever they sit on the wire (tool_result and system
    blocks included): kept, and Keel adds its own only up to the limit."""
    if request.view is not None:
        return sum(1 for _ in breakpoints.marks(request.view.wire))
    body = request.body
    tools = sum(1 for t in body.get("tools") or [] if isinstance(t, dict) and "cache_control" in t)
    return tools + sum(_marks(m) for m in body.get("messages") or [] if isinstance(m, dict))


def _marked_message(message: JsonObject, marker: JsonObject) -> JsonObject | None:
    """The message with a breakpoint on its last text part, or None if it has no text."""
    content = message.get("content")
    if isinstance(content, str) and content:
        return {**message, "content": [{"type": "text", "text": content, "cache_control": marker}]}
    if isinstance(content, list) and content and isinstance(content[-1], dict):
        return {**message, "content": [*content[:-1], {**content[-1], "cache_control": marker}]}
    return None


def _chars(value: Json) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_chars(v) for v in value.values())
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    return 0


class CachePlanner:
    name = "cache"
    after: tuple[str, ...] = ("tools", "memory", "context")  # breakpoints go on the prompt as the others left it

    def applies(self, request: Turn) -> bool:
        return self.for_tenant(request.tenant)

    def for_tenant(self, tenant: TenantConfig) -> bool:
        return tenant.cache.breakpoints == "auto" or tenant.cache.prompt_cache_key == "auto"

    async def plan(self, request: Turn) -> Turn:
        cache = request.tenant.cache
        body = request.body
        if (cache.prompt_cache_key == "auto" and request.tenant.upstream.kind == "openai"
                and request.shape.prompt_cache_key
                and "prompt_cache_key" not in body and request.location and request.location.segment):
            digest = hashlib.sha256(f"{request.tenant.id}:{request.location.segment}".encode()).hexdigest()
            body = {**body, "prompt_cache_key": "keel-" + digest[:32]}
        if cache.breakpoints == "auto" and request.caches_at_breakpoints and _client_marks(request) < MAX_BREAKPOINTS:
            body = self._breakpoints(body, request)
        return request if body is request.body else request.with_body(body)

    def _breakpoints(self, body: JsonObject, request: Turn) -> JsonObject:
        cache = request.tenant.cache
        marker: JsonObject = {"type": "ephemeral", **({"ttl": cache.ttl} if cache.ttl else {})}
        min_chars = cache.min_tokens * 4  # ~4 characters per token, on the safe side of the minimum
        tools = list(body.get("tools") or [])
        messages = list(body["messages"])
        placed = _client_marks(request)
        prefix = _chars(tools)
        if tools and prefix >= min_chars and "cache_control" not in tools[-1]:
            tools[-1] = {**tools[-1], "cache_control": marker}
            placed += 1
        # Candidate ends of the stable prefix: the system prompt, the previous turn, this turn.
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        candidates = []
        systems = [i for i, m in enumerate(messages) if m.get("role") in ("system", "developer")]
        if systems:
            candidates.append(systems[-1])
        if len(users) >= 2:
            candidates.append(users[-1] - 1)
        candidates.append(len(messages) - 1)
        running = prefix
        ends = {}
        for i, message in enumerate(messages):
            running += _chars(message.get("content"))
            ends[i] = running
        for index in sorted(set(candidates)):
            if placed >= MAX_BREAKPOINTS or ends.get(index, 0) < min_chars:
                continue
            for j in range(index, -1, -1):  # the nearest message at or before it that has text
                if _marks(messages[j]):
                    break  # the client already ends a prefix here
                marked = _marked_message(messages[j], marker)
                if marked is not None:
                    messages[j] = marked
                    placed += 1
                    break
        return {**body, "tools": tools, "messages": messages} if tools else {**body, "messages": messages}
