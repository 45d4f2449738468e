"""Ingress: who is calling (auth → tenant) and what they sent (a `Turn`, read by its shape's codec).

Nothing here knows about tools, memory or caching; it only turns bytes and headers into
plain data, or into a `ProxyError` the client can read.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from proxy import jsontext
from proxy.codecs import Codec
from proxy.codecs.chat import ChatCodec
from proxy.config import TenantConfig, key_digests
from proxy.errors import AuthenticationError, BadRequestError, ForbiddenError
from proxy.turn import Turn


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
    def memory_scope(self) -> str | None:
        """What separates memory beyond tenant and user: a passthrough caller's credentials (a
        provider key proves nothing about who the user is); a Keel key's tenant is enough. None:
        a passthrough caller that sent no credential at all, so no identity to scope memory by."""
        if self.keyed:
            return ""
        return self.scope if self.upstream_authorization or self.upstream_api_key else None


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


def request_id(headers: Mapping[str, str]) -> str:
    given = headers.get("x-request-id", "")
    return given if 0 < len(given) <= 128 and given.isprintable() else uuid.uuid4().hex


def parse_turn(raw: bytes, caller: Caller, headers: Mapping[str, str], rid: str,
               codec: Codec | None = None, resent: jsontext.Resent | None = None,
               plans: Callable[[Turn], bool] | None = None,
               might_plan: Callable[[TenantConfig], bool] | None = None) -> Turn:
    """The client's body, read by the codec of its API shape into the planners' view (a tools
    array seen before, byte for byte, is not parsed again: `resent`). `plans`: would any planner
    act on this turn? When none would, no view is made: the turn goes upstream as the client's
    bytes, and whatever the upstream makes of its body is the client's own answer.
    `might_plan`: could any act for this tenant at all? When none could, the body is only read."""
    codec = codec or ChatCodec()
    # A tenant no planner can act for: read to check, never written back (numbers unchecked).
    read_only = might_plan is not None and not might_plan(caller.tenant)
    try:
        loads = jsontext.read if read_only else resent.loads if resent is not None else jsontext.loads
        body = loads(raw)
    except jsontext.UnreadableJsonError:  # valid, but too deep to plan: the client's bytes go upstream
        return Turn(caller.tenant, raw, {}, headers, rid, codec, scope=caller.scope, plannable=False)
    except ValueError as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequestError("request body must be a JSON object", code="invalid_json")
    try:
        codec.check(body)
        if plans is not None:
            wire = _bound(Turn(caller.tenant, raw, body, headers, rid, codec, scope=caller.scope,
                               memory_scope=caller.memory_scope, plannable=False), caller)
            if not plans(wire):
                return wire
        view = codec.view(body)
    except ValueError as exc:
        raise BadRequestError(str(exc), param="messages" if "messages" in str(exc) else None) from None
    messages = view.body["messages"]
    request = Turn(caller.tenant, raw, view.body, headers, rid, codec, view, caller.scope, caller.memory_scope,
                          client_messages=tuple(messages))
    return _bound(request, caller)


def _bound(request: Turn, caller: Caller) -> Turn:
    """A user key acts only as its own user (a 403 for a request claiming another)."""
    if caller.bound_user is None:
        return request
    claimed = request.end_user
    if claimed is not None and claimed != caller.bound_user:
        raise ForbiddenError(f"this key acts only for its own user, not {claimed!r}", code="user_mismatch")
    return replace(request, bound_user=caller.bound_user)
