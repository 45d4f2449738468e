"""/v1/responses: OpenAI's Responses API (instructions, input items, typed `response.*` events)."""

from __future__ import annotations

import re

import orjson

from proxy.codecs import Codec
from proxy.codecs.responses import ResponsesCodec
from proxy.errors import ProxyError
from proxy.jsontext import Json, JsonObject
from proxy.respcache.replay import AnswerShape
from proxy.respcache.responses import ResponsesAnswers
from proxy.rounds import Framings
from proxy.rounds.responses import ResponsesJson, ResponsesStream
from proxy.tools.catalog import Catalog
from proxy.usage import Usage


class ResponseIds:
    """A stored response's id (`response.created`) and, for a scoped caller, its output items'."""

    once = False

    def read(self, data: bytes, scoped: bool) -> list[str]:
        if b'"response.created"' not in data and not (scoped and b'"response.output_item.added"' in data):
            return []
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            return []
        if not isinstance(parsed, dict):
            return []
        holder = parsed.get("response") if parsed.get("type") == "response.created" else parsed.get("item")
        named = holder.get("id") if isinstance(holder, dict) else None
        return [named] if isinstance(named, str) else []


class Responses:
    name = "responses"
    codec: Codec = ResponsesCodec()
    stream_end = re.compile(rb"(?:^|[\r\n])event: ?response\.(?:completed|failed|incomplete)\b|"
                            rb"\"type\": ?\"response\.(?:completed|failed|incomplete)\"")
    chain_tag = b"responses"
    answers: AnswerShape = ResponsesAnswers()
    dispatches = False  # a found tool joins the segment's block instead
    places_own_text = True  # in `instructions`
    always_cache_control = False
    prompt_cache_key = True
    continues_by_id = True  # previous_response_id
    native_search_host: str | None = "api.openai.com"

    def framings(self, catalog: Catalog | None = None) -> Framings:
        return Framings(ResponsesJson(), ResponsesStream)

    def usage(self, raw: Json) -> Usage | None:
        return Usage.read(raw, messages=False)

    def error_body(self, error: ProxyError) -> bytes:
        return error.body()

    def error_event(self, error: ProxyError) -> bytes:
        payload = {"type": "error", "code": error.code, "message": error.message, "param": error.param}
        return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"

    def shown_ids(self, wire: JsonObject) -> ResponseIds | None:
        return ResponseIds() if wire.get("store") is not False else None  # stored unless told not to


RESPONSES = Responses()
