"""An answer in any form, from one kept: each API shape's reading and writing of its answers.

An entry keeps the whole answer as the shape's JSON body, whichever form the original came in:
a JSON request gets it as is, a streamed one gets the events a client of that shape would have
received (`AnswerShape.events`), with the cached usage. A streamed original is read into its
JSON body once, when it is kept (`AnswerShape.assemble`).

    chat.py       Chat Completions: `data:` chunks and `[DONE]`
    responses.py  Responses: typed `response.*` events, numbered
    messages.py   Messages: `message_start` … `message_stop`
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import orjson

from proxy.jsontext import Json, JsonObject
from proxy.respcache.entries import Entry
from proxy.respcache.flights import Form
from proxy.sse import Event, EventParser


class AnswerShape(Protocol):
    def never(self, wire: JsonObject) -> str | None:
        """Why a request of this shape is never cached (state the provider holds), or None."""
        ...

    def whole(self, body: JsonObject, wire: JsonObject) -> bool:
        """Is this answer complete and successful, so that it may be served again?"""
        ...

    def assemble(self, events: Iterable[Event]) -> JsonObject | None:
        """The JSON body a whole stream adds up to; None for a stream that is not whole or not readable."""
        ...

    def events(self, body: JsonObject, stream_options: Json) -> bytes:
        """The stream a client of this shape would have received for this answer."""
        ...


def answer_of(shape: AnswerShape, plain: bytes, streamed: bool, wire: JsonObject) -> JsonObject | None:
    """The whole answer in a reply (decoded), or None when it is not one to keep."""
    try:
        if streamed:
            parser = EventParser()
            body = shape.assemble([*parser.feed(plain), *parser.feed(b"\n\n")])
        else:
            body = orjson.loads(plain)
    except (orjson.JSONDecodeError, ValueError):
        return None
    return body if isinstance(body, dict) and shape.whole(body, wire) else None


def serves(entry: Entry, form: Form) -> bool:
    """Can the entry answer this form? A chat stream kept without usage answers only streams
    that do not ask for it (a whole body or an include_usage stream would lack it)."""
    return entry.usage is not None or (form.stream and not form.usage_asked)


def rendered(shape: AnswerShape, entry: Entry, form: Form) -> tuple[bytes, str]:
    """The entry as this form wants it, and its media type."""
    if not form.stream:
        return entry.body, "application/json"
    options = orjson.loads(form.options) if form.options else None
    return shape.events(orjson.loads(entry.body), options), "text/event-stream; charset=utf-8"
