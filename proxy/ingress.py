"""Ingress: who is calling (auth → tenant) and what they sent (a parsed `ChatRequest`).

Nothing here knows about tools, memory or caching; it only turns bytes and headers into
plain data, or into a `ProxyError` the client can read.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import orjson

from proxy.chain import chain_seed
from proxy.config import TenantConfig

if TYPE_CHECKING:
    from proxy.conversations import Location
    from proxy.pipeline import Responder
from proxy.errors import AuthenticationError, BadRequestError


@dataclass(frozen=True)
class Caller:
    tenant: TenantConfig
    upstream_authorization: str | None  # the header value to send upstream
    admin: bool = False  # may manage any user's memory in its tenant
    keyed: bool = False  # authenticated by a Keel key (not a passthrough tenant's own provider key)


class Authenticator:
    """Maps a request's key to its tenant; every configured digest is compared in constant time."""

    def __init__(self, tenants: tuple[TenantConfig, ...]) -> None:
        self._keyed = [(digest, t, False) for t in tenants for digest in t.auth.key_digests()]
        self._keyed += [(digest, t, True) for t in tenants for digest in t.auth.key_digests(admin=True)]
        self._by_id = {t.id: t for t in tenants}
        self._default = next((t for t in tenants if t.default and t.auth.passthrough), None)

    def _upstream_auth(self, tenant: TenantConfig) -> str | None:
        key = tenant.upstream.api_key()
        return f"Bearer {key}" if key else None

    def authenticate(self, headers: Mapping[str, str]) -> Caller:
        authorization = headers.get("authorization", "")
        token = authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""
        if not token:
            token = headers.get("x-api-key", "").strip()  # Anthropic-style clients
        named = headers.get("x-keel-tenant")
        if named is not None:
            tenant = self._by_id.get(named)
            if tenant is not None and tenant.auth.passthrough:
                return Caller(tenant, authorization or None)
        if token:
            digest = hashlib.sha256(token.encode()).digest()
            match: tuple[TenantConfig, bool] | None = None
            for candidate, tenant, admin in self._keyed:
                if hmac.compare_digest(candidate, digest) and match is None:
                    match = (tenant, admin)
            if match is not None:
                return Caller(match[0], self._upstream_auth(match[0]), match[1], keyed=True)
        if named is None and self._default is not None:
            return Caller(self._default, authorization or None)
        if not token:
            raise AuthenticationError("missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key")
        raise AuthenticationError("incorrect API key provided")


@dataclass(frozen=True)
class ChatRequest:
    """One chat completion request as the planners see it.

    `raw` is the client's body; it is forwarded untouched unless a planner returns a request
    with a different `body` (invariant 1: features off is byte-identical).
    """

    tenant: TenantConfig
    raw: bytes
    body: dict[str, Any]
    headers: Mapping[str, str]
    request_id: str
    client_messages: tuple[dict[str, Any], ...] = ()  # the client's own message objects, as parsed
    location: Location | None = None  # where the turn sits in its conversation (features on only)
    responder: Responder | None = None  # set by a planner that must see the response (tool_search)
    response_headers: Mapping[str, str] = field(default_factory=dict)
    record_fields: Mapping[str, Any] = field(default_factory=dict)  # for the newest turn record, written once
    notes: Mapping[str, Any] = field(default_factory=dict)  # why the prompt prefix may have changed (logs)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.body["messages"]
        return messages

    @property
    def end_user(self) -> str | None:
        metadata = self.body.get("metadata")
        from_meta = metadata.get("user_id") if isinstance(metadata, dict) else None
        value = self.body.get("user") or self.headers.get("x-keel-user") or from_meta
        return str(value) if value else None

    @property
    def conversation_id(self) -> str | None:
        metadata = self.body.get("metadata")
        from_meta = metadata.get("conversation_id") if isinstance(metadata, dict) else None
        value = self.headers.get("x-keel-conversation") or from_meta or self.body.get("prompt_cache_key")
        return str(value) if value else None

    @property
    def chain_seed(self) -> str:
        return chain_seed(self.tenant.id, self.end_user, self.conversation_id)

    def with_body(self, body: dict[str, Any], **changes: Any) -> ChatRequest:
        return replace(self, body=body, **changes)

    def with_record(self, **fields: Any) -> ChatRequest:
        """Fields for the newest user message's turn record (the pipeline writes it once)."""
        return replace(self, record_fields={**self.record_fields, **fields})

    def with_note(self, **notes: Any) -> ChatRequest:
        return replace(self, notes={**self.notes, **notes})

    def with_headers(self, **headers: str) -> ChatRequest:
        return replace(self, response_headers={**self.response_headers, **headers})

    def encoded(self, original: ChatRequest) -> bytes:
        """The bytes to send upstream: the client's own unless a planner changed the body,
        in which case everything is rendered canonically (sorted keys) so reordered JSON
        from the client still renders the same bytes."""
        return self.raw if self.body is original.body else encode(self.body)


def encode(body: dict[str, Any]) -> bytes:
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


def request_id(headers: Mapping[str, str]) -> str:
    given = headers.get("x-request-id", "")
    return given if 0 < len(given) <= 128 and given.isprintable() else uuid.uuid4().hex


def parse_chat(raw: bytes, caller: Caller, headers: Mapping[str, str], rid: str) -> ChatRequest:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequestError("request body must be a JSON object", code="invalid_json")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise BadRequestError("'messages' must be a list of message objects", param="messages")
    if not all(isinstance(m, dict) for m in messages):
        raise BadRequestError("every entry of 'messages' must be an object", param="messages")
    return ChatRequest(caller.tenant, raw, body, headers, rid, tuple(messages))
