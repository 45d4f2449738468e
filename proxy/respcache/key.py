"""Cache keys: the request as the client meant it, and who asked.

An answer is keyed by the client's request with transport aside (`stream` and
`stream_options` say how the answer travels, not what it is: a JSON request may be answered
from a streamed original and the reverse), in canonical JSON (sorted keys, null members
dropped, numbers as written), with the query string and the headers that change what the
upstream answers (`anthropic-version`, `anthropic-beta`, `openai-beta`), the API shape, and
who asked: the tenant, a digest of the credential (`Turn.scope`), the end user and the
conversation id, like every other piece of scoped state (README's isolation rule). A different
credential, end user or tenant never reaches another's entry: the key says whose it is.

`stored.scope: tenant` widens an entry to every caller of the tenant: the credential and the
`X-Keel-User` / `X-Keel-Conversation` headers no longer separate entries (what the body says,
its `user` or `metadata` included, still does: it is part of the request).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from proxy.jsontext import Json, JsonFloat, JsonInt, JsonObject

TRANSPORT = frozenset({"stream", "stream_options"})
ANSWER_HEADERS = ("anthropic-version", "anthropic-beta", "openai-beta")  # they change what the upstream answers


@dataclass(frozen=True)
class Asker:
    """Who an entry belongs to: empty fields when the operator widened it to the tenant."""

    tenant: str
    scope: str = ""  # the credential's digest
    user: str = ""
    conversation: str = ""

    @classmethod
    def of(cls, tenant: str, scope: str, user: str | None, conversation: str | None, widened: bool) -> Asker:
        if widened:
            return cls(tenant)
        return cls(tenant, scope, user or "", conversation or "")


def _digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=20, person=b"keel-answers")
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def canonical(value: Json) -> bytes:
    """Sorted keys, numbers as written (no members dropped: an exact cache keys what was sent), in C."""
    return orjson.dumps(value, default=_text, option=orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_SUBCLASS)


def _text(value: Json) -> Json:
    if isinstance(value, (JsonFloat, JsonInt)):
        return orjson.Fragment(value.text)
    raise TypeError(f"not JSON: {type(value).__name__}")


def _who(asker: Asker) -> list[bytes]:
    return [asker.tenant.encode(), asker.scope.encode(), asker.user.encode(errors="surrogatepass"),
            asker.conversation.encode(errors="surrogatepass")]


def answer_key(asker: Asker, shape: str, wire: JsonObject, query: str, headers: Mapping[str, str]) -> str:
    """The key of a chat, responses or messages request's answer."""
    meant = {k: v for k, v in wire.items() if k not in TRANSPORT}
    sent = [headers.get(name, "").encode("latin-1", errors="replace") for name in ANSWER_HEADERS]
    return _digest(b"answer-v1", *_who(asker), shape.encode(), query.encode("latin-1", errors="replace"), *sent,
                   canonical(meant))


def embedding_key(asker: Asker, model: Json, dimensions: Json, encoding_format: Json, query: str, item: Json) -> str:
    """The key of one input item's vector: the same text under another model, size or format is another."""
    return _digest(b"embedding-v1", *_who(asker), canonical([model, dimensions, encoding_format or "float"]),
                   query.encode("latin-1", errors="replace"), canonical(item))
