"""/v1/chat/completions: OpenAI's Chat Completions, the shape the planners' view is written in."""

from __future__ import annotations

import re

import orjson

from proxy.codecs import Codec
from proxy.codecs.chat import ChatCodec
from proxy.errors import ProxyError
from proxy.jsontext import Json, JsonObject
from proxy.respcache.chat import ChatAnswers
from proxy.respcache.replay import AnswerShape
from proxy.rounds import Framings
from proxy.rounds.chat import ChatJson, ChatStream
from proxy.tools.catalog import Catalog
from proxy.usage import Usage


class CompletionIds:
    """A stored chat completion's id: every chunk of its stream names it."""

    once = True

    def read(self, data: bytes, scoped: bool) -> list[str]:
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            return []
        named = parsed.get("id") if isinstance(parsed, dict) else None
        return [named] if isinstance(named, str) else []


class Chat:
    name = "chat"
    codec: Codec = ChatCodec()
    stream_end = re.compile(rb"(?:^|[\r\n])data: ?\[DONE\]")
    chain_tag = b""
    answers: AnswerShape = ChatAnswers()
    dispatches = True  # its framings rewrite a generic call_tool into the client's own call
    places_own_text = False  # Keel's system text is a system message like any other
    always_cache_control = False  # only where an Anthropic-compatible upstream serves it
    prompt_cache_key = True
    continues_by_id = False
    native_search_host: str | None = None

    def framings(self, catalog: Catalog | None = None) -> Framings:
        return Framings(ChatJson(catalog), lambda: ChatStream(catalog=catalog))

    def usage(self, raw: Json) -> Usage | None:
        return Usage.read(raw, messages=False)

    def error_body(self, error: ProxyError) -> bytes:
        return error.body()

    def error_event(self, error: ProxyError) -> bytes:
        return b"data: " + error.body() + b"\n\n"

    def shown_ids(self, wire: JsonObject) -> CompletionIds | None:
        return CompletionIds() if wire.get("store") is True else None  # stored only on request


CHAT = Chat()
