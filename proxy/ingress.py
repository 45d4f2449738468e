"""Ingress: who is calling (auth → tenant) and what they sent (a parsed `ChatRequest`).

Nothing here knows about tools, memory or caching; it only turns bytes and headers into
plain data, or into a `ProxyError` the client can read.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from proxy import jsontext
from proxy.chain import CONTEXT_ROLES, chain_seed
from proxy.codecs import Codec, View
from proxy.codecs.chat import ChatCodec
from proxy.config import TenantConfig, key_digests
from proxy.messages import message_text

if TYPE_CHECKING:
    from proxy.conversations import Location
    from proxy.pipeline import Responder
from proxy.errors import AuthenticationError, BadRequestError, ForbiddenError


@dataclass(frozen=True)
class Caller:
    tenant: TenantConfig
    upstream_authorization: str | None  # the header value to send upstream
    admin: bool = False  # may manage any user's memory in its tenant
    keyed: bool = False  # authenticated by a Keel key (not a passthrough tenant's own provider key)
    scope: str = ""  # a digest of the caller's credentials: part of every conversation's seed
    bound_user: str | None = None  # a user key: the one end user it acts as
    upstream_api_key: str | None = None  # sent upstream as x-api-key (Anthropic-style upstreams; passthrough's own)

    @property
    def memory_scope(self) -> str:
        """What separates memory beyond tenant and user: a passthrough caller's credentials (a
        provider key proves nothing about who the user is); a Keel key's tenant is enough."""
        return "" if self.keyed else self.scope


def credential_scope(credential: str) -> str:
    """What separates two passthrough callers' state: a digest of the credential they sent."""
    return hashlib.blake2b(credential.encode(), digest_size=12, person=b"keel-scope").hexdigest() if credential else ""


_BEARER = re.compile(r"^\s*bearer\s+(\S+)\s*$", re.IGNORECASE)
_WORDS = re.compile(r"[\s:,;=]+")


class Authenticator:
    """Maps a request's key to its tenant; every configured digest is compared in constant time.

    A Keel key is `Authorization: Bearer <key>` or `x-api-key: <key>`. A request that carries
    no Keel key goes to a passthrough tenant (named by `X-Keel-Tenant`, or the default) with its
    own credentials forwarded, unless anything in them is, or looks like, a Keel key: that is a
    401, never a Keel key sent to a provider."""

    def __init__(self, tenants: tuple[TenantConfig, ...], keel_key_prefixes: tuple[str, ...] = ()) -> None:
        self._prefixes = tuple(p.lower() for p in keel_key_prefixes)
        self._keyed = [(digest, t, False) for t in tenants for digest in t.auth.key_digests()]
        self._keyed += [(digest, t, True) for t in tenants for digest in t.auth.key_digests(admin=True)]
        self._bound = [(digest, t, u.user) for t in tenants for u in t.auth.user_keys for digest in key_digests((u.key,))]
        self._by_id = {t.id: t for t in tenants}
        self._default = next((t for t in tenants if t.default and t.auth.passthrough), None)

    def _upstream_auth(self, tenant: TenantConfig) -> str | None:
        """The tenant's provider key as `Authorization` (OpenAI-style upstreams; Anthropic-style
        ones get it as `x-api-key`, see `upstream_api_key`)."""
        key = tenant.upstream.api_key()
        return f"Bearer {key}" if key and tenant.upstream.kind != "anthropic-compatible" else None

    @staticmethod
    def _upstream_key(tenant: TenantConfig) -> str | None:
        key = tenant.upstream.api_key()
        return key if key and tenant.upstream.kind == "anthropic-compatible" else None

    def authenticate(self, headers: Mapping[str, str]) -> Caller:
        authorization = headers.get("authorization", "")
        api_key = headers.get("x-api-key", "").strip()  # Anthropic-style clients
        bearer = _BEARER.match(authorization)
        token = bearer.group(1) if bearer else ("" if authorization.strip() else api_key)
        named = headers.get("x-keel-tenant")
        if token:
            found = self._keel_key(token)
            if found is not None:
                return found
        passthrough = self._by_id.get(named) if named is not None else self._default
        if passthrough is not None and passthrough.auth.passthrough and not self._carries_keel_key(authorization,
                                                                                                  api_key):
            scope = credential_scope(authorization + "\x00" + api_key)
            return Caller(passthrough, authorization or None, scope=scope, upstream_api_key=api_key or None)
        if not token and not authorization.strip():
            raise AuthenticationError("missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key")
        raise AuthenticationError("incorrect API key provided")

    def _keel_key(self, token: str) -> Caller | None:
        digest = hashlib.sha256(token.encode()).digest()
        match: tuple[TenantConfig, bool] | None = None
        for candidate, tenant, admin in self._keyed:
            if hmac.compare_digest(candidate, digest) and match is None:
                match = (tenant, admin)
        if match is not None:
            return Caller(match[0], self._upstream_auth(match[0]), match[1], keyed=True, scope=credential_scope(token),
                          upstream_api_key=self._upstream_key(match[0]))
        bound: tuple[TenantConfig, str] | None = None
        for candidate, tenant, user in self._bound:
            if hmac.compare_digest(candidate, digest) and bound is None:
                bound = (tenant, user)
        if bound is not None:
            return Caller(bound[0], self._upstream_auth(bound[0]), keyed=True, bound_user=bound[1],
                          scope=credential_scope(token), upstream_api_key=self._upstream_key(bound[0]))
        return None

    def _carries_keel_key(self, authorization: str, api_key: str) -> bool:
        """Is any word of these credentials a Keel key, or shaped like one (a mistyped or revoked
        key, in any scheme or case)? Such credentials are never forwarded upstream."""
        words = [w for w in (*_WORDS.split(authorization), *_WORDS.split(api_key), authorization.strip(), api_key) if w]
        return any(w.lower().startswith(self._prefixes) or self._keel_key(w) is not None for w in words)


@dataclass(frozen=True)
class ChatRequest:
    """One turn as the planners see it, whatever the API shape it came in.

    `body` is the wire-neutral view its codec made (Chat-Completions-shaped; for
    /v1/chat/completions the client's body itself). `raw` is the client's body; it is forwarded
    untouched unless a planner returns a turn with a different `body`, which the codec then
    renders back into the shape, unchanged parts as sent (invariants 1 and 7).
    """

    tenant: TenantConfig
    raw: bytes
    body: dict[str, Any]
    headers: Mapping[str, str]
    request_id: str
    codec: Codec = field(default_factory=ChatCodec)
    view: View | None = None  # what the codec made of the client's body (None: not read)
    scope: str = ""  # the caller's credential digest, see `Caller.scope`
    memory_scope: str = ""  # see `Caller.memory_scope`
    bound_user: str | None = None  # the end user a user key acts as (overrides what the body says)
    plannable: bool = True  # False: a body Keel cannot hold (too deep); forwarded as sent
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
        """`user`, `safety_identifier`, `X-Keel-User` or `metadata.user_id` (a user key's own user)."""
        if self.bound_user is not None:
            return self.bound_user
        metadata = self.body.get("metadata")
        from_meta = metadata.get("user_id") if isinstance(metadata, dict) else None
        value = (self.body.get("user") or self.body.get("safety_identifier") or self.headers.get("x-keel-user")
                 or from_meta)
        return str(value) if isinstance(value, (str, int)) and value != "" else None

    @property
    def conversation_id(self) -> str | None:
        """An explicit conversation id: `X-Keel-Conversation` or `metadata.conversation_id`."""
        metadata = self.body.get("metadata")
        from_meta = metadata.get("conversation_id") if isinstance(metadata, dict) else None
        value = self.headers.get("x-keel-conversation") or from_meta
        return str(value) if isinstance(value, (str, int)) and value != "" else None

    @property
    def cache_key(self) -> str | None:
        """The client's own `prompt_cache_key`: it separates conversations, but an app may
        send one constant for all its users, so it never stands in for the system prompt."""
        value = self.body.get("prompt_cache_key")
        return str(value) if isinstance(value, str) and value else None

    @property
    def context_text(self) -> str:
        """The system and developer messages that open the conversation, joined: context, not
        chain links (later system messages stay in place and are not frozen)."""
        out = []
        for message in self.messages:
            if message.get("role") not in CONTEXT_ROLES:
                break
            out.append(message_text(message))
        return "\n\n".join(out)

    def chain_seed(self, context_digest: str) -> str:
        """Whose conversation this is (see `proxy.chain`); `context_digest` is the masked
        system prompt's, used unless the client names the conversation."""
        return chain_seed(self.tenant.id, self.end_user, self.conversation_id, scope=self.scope,
                          cache_key=self.cache_key, context=context_digest, shape=self.codec.shape)

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
        """The bytes to send upstream: the client's own unless a planner changed the body;
        then the body in its own key order, numbers as the client wrote them (invariant 7)."""
        if self.body is original.body:
            return self.raw
        return encode(self.wire_body())

    def wire_body(self, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """A view body (this turn's, or one derived from it) in the client's API shape."""
        body = self.body if body is None else body
        return self.codec.render(body, self.view) if self.view is not None else body


def encode(body: dict[str, Any]) -> bytes:
    return jsontext.dumps(body)


def request_id(headers: Mapping[str, str]) -> str:
    given = headers.get("x-request-id", "")
    return given if 0 < len(given) <= 128 and given.isprintable() else uuid.uuid4().hex


def parse_turn(raw: bytes, caller: Caller, headers: Mapping[str, str], rid: str,
               codec: Codec | None = None) -> ChatRequest:
    """The client's body, read by the codec of its API shape into the planners' view."""
    codec = codec or ChatCodec()
    try:
        body = jsontext.loads(raw)
    except jsontext.UnreadableJsonError:  # valid, but too deep to plan: the client's bytes go upstream
        return ChatRequest(caller.tenant, raw, {}, headers, rid, codec, scope=caller.scope, plannable=False)
    except ValueError as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequestError("request body must be a JSON object", code="invalid_json")
    try:
        view = codec.view(body)
    except ValueError as exc:
        raise BadRequestError(str(exc), param="messages" if "messages" in str(exc) else None) from None
    messages = view.body["messages"]
    request = ChatRequest(caller.tenant, raw, view.body, headers, rid, codec, view, caller.scope, caller.memory_scope,
                          client_messages=tuple(messages))
    if caller.bound_user is not None:
        claimed = request.end_user
        if claimed is not None and claimed != caller.bound_user:
            raise ForbiddenError(f"this key acts only for its own user, not {claimed!r}", code="user_mismatch")
        request = replace(request, bound_user=caller.bound_user)
    return request
