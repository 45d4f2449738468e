"""/v1/messages: Anthropic's Messages API (system blocks, content blocks, `message_*` events)."""

from __future__ import annotations

import re

from proxy.codecs import Codec
from proxy.codecs.messages import MessagesCodec
from proxy.errors import ProxyError, anthropic_error_body
from proxy.jsontext import Json, JsonObject
from proxy.respcache.messages import MessagesAnswers
from proxy.respcache.replay import AnswerShape
from proxy.rounds import Framings
from proxy.rounds.messages import MessagesJson, MessagesStream
from proxy.shapes import ShownIds
from proxy.tools.catalog import Catalog
from proxy.usage import Usage


class Messages:
    name = "messages"
    codec: Codec = MessagesCodec()
    stream_end = re.compile(rb"(?:^|[\r\n])event: ?message_stop\b|\"type\": ?\"message_stop\"")
    chain_tag = b"messages"
    answers: AnswerShape = MessagesAnswers()
    dispatches = False  # a found tool joins the segment's block instead
    places_own_text = True  # in the system blocks
    always_cache_control = True  # Anthropic caches only at breakpoints
    prompt_cache_key = False  # OpenAI's field; an Anthropic upstream refuses it
    continues_by_id = False
    native_search_host: str | None = "api.anthropic.com"

    def framings(self, catalog: Catalog | None = None) -> Framings:
        return Framings(MessagesJson(), MessagesStream)

    def usage(self, raw: Json) -> Usage | None:
        return Usage.read(raw, messages=True)  # input_tokens leaves out what the cache read and wrote

    def error_body(self, error: ProxyError) -> bytes:
        return anthropic_error_body(error.status, error.message)

    def error_event(self, error: ProxyError) -> bytes:
        return b"event: error\ndata: " + anthropic_error_body(error.status, error.message) + b"\n\n"

    def shown_ids(self, wire: JsonObject) -> ShownIds | None:
        return None  # a message is not stored


MESSAGES = Messages()
