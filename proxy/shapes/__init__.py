"""One object per API shape: everything Keel does differently for Chat Completions, Responses
and Messages lives in that shape's module, and no other module compares a shape's name.

    chat.py       /v1/chat/completions
    responses.py  /v1/responses
    messages.py   /v1/messages

A `Shape` holds its codec (the client's body to the planners' view and back, `proxy.codecs`),
its round framings (an answer read and written, whole and streamed, `proxy.rounds`), its
answers as the response cache keeps them (`proxy.respcache`), its error body and error event,
how its usage reads, what a whole stream of it ends with, and what it can do: the capabilities
the planners ask about instead of its name. Adding a shape is one module here and one route.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from proxy.codecs import Codec
    from proxy.errors import ProxyError
    from proxy.jsontext import Json, JsonObject
    from proxy.respcache.replay import AnswerShape
    from proxy.rounds import Framings
    from proxy.tools.catalog import Catalog
    from proxy.usage import Usage


class ShownIds(Protocol):
    """The ids of stored objects a reply's events show the client (`proxy.owners` records them)."""

    once: bool  # True: every event names the same one id, so the first is enough

    def read(self, data: bytes, scoped: bool) -> list[str]:
        """The ids one event's data shows; `scoped`: also the items a scoped caller must own."""
        ...


class Shape(Protocol):
    name: str  # chat | responses | messages: what logs, metrics, facts and cache keys say
    codec: Codec  # the client's body to the planners' view, and a planned view back
    stream_end: re.Pattern[bytes]  # what a whole event stream of this shape ends with
    chain_tag: bytes  # what the shape adds to a caller's seed (chat adds nothing: its records predate shapes)
    answers: AnswerShape  # its answers as the response cache reads, keeps and replays them
    dispatches: bool  # Keel may answer the generic `call_tool` itself (a block that never changes)
    places_own_text: bool  # Keel's system text goes to the shape's own place (instructions, system blocks)
    always_cache_control: bool  # its upstream caches only at `cache_control` breakpoints, whoever serves it
    prompt_cache_key: bool  # the body may carry OpenAI's `prompt_cache_key`
    continues_by_id: bool  # a request may continue a stored answer by its id (`previous_response_id`)
    native_search_host: str | None  # the provider host that runs a client's deferred-tool search itself

    def framings(self, catalog: Catalog | None = None) -> Framings:
        """Its framings; with a dispatch `catalog`, generic calls are rewritten into the client's own."""
        ...

    def usage(self, raw: Json) -> Usage | None:
        """An answer's usage object read as this shape means it; None when it is not one."""
        ...

    def error_body(self, error: ProxyError) -> bytes:
        """The error as a whole JSON body of this shape."""
        ...

    def error_event(self, error: ProxyError) -> bytes:
        """The error as the last event of a stream of this shape."""
        ...

    def shown_ids(self, wire: JsonObject) -> ShownIds | None:
        """What reading its replies to this body show ids of objects the provider stores; None
        when they show none (a message is never stored; a chat completion only on request)."""
        ...
