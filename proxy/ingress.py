"""Ingress: who is calling (auth → tenant) and what they sent (a `Turn`, read by its shape's codec).

Nothing here knows about tools, memory or caching; it only turns bytes and headers into
plain data, or into a `ProxyError` the client can read.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from proxy import jsontext
from proxy.codecs import KEEL
from proxy.config import TenantConfig, key_digests
from proxy.credentials import CREDENTIAL_HEADERS, KeelKeys
from proxy.errors import AuthenticationError, BadRequestError, ForbiddenError
from proxy.owners import Owner, provider_account
from proxy.shapes import Shape
from proxy.shapes.chat import CHAT
from proxy.turn import Turn


@dataclass(frozen=True)
class Caller:
    tenant: TenantConfig
    upstream_credentials: Mapping[str, str]  # the credential headers sent upstream (`CREDENTIAL_HEADERS`)
    admin: bool = False  # may manage any user's memory in its tenant
    keyed: bool = False  # authenticated by a Keel key (not a passthrough tenant's own provider key)
    scope: str = ""  # a digest of the caller's credentials: part of every conversation's seed
    bound_user: str | None = None  # a user key: the one end user it acts as
    account: str = ""  # a keyed caller's provider account (`proxy.owners.provider_account`)
    shared: bool = False  # other Keel keys reach that account too

    @property
    def memory_scope(self) -> str | None:
        """What separates memory beyond tenant and user: a passthrough caller's credentials (a
        provider key proves nothing about who the user is); a Keel key's tenant is enough. None:
        a passthrough caller that sent no credential at all, so no identity to scope memory by."""
        if self.keyed:
            return ""
        return self.scope if self.upstream_credentials else None

    def owner(self, stated_user: str | None) -> Owner:
        """This caller as the owner of what it stores (`stated_user`: the end user the request
        names; a user key's own always)."""
        return Owner(self.account, self.scope, self.bound_user or stated_user or None, self.shared)


def credential_scope(credential: str) -> str:
    """What separates two passthrough callers' state: a digest of the credential they sent."""
    return hashlib.blake2b(credential.encode(), digest_size=12, person=b"keel-scope").hexdigest() if credential else ""


_BEARER = re.compile(r"^\s*bearer\s+(\S+)\s*$", re.IGNORECASE)


class Authenticator:
    """Maps a request's key to its tenant; every configured digest is compared in constant time.

    A Keel key is `Authorization: Bearer <key>`, `x-api-key: <key>` (Anthropic's SDKs) or
    `api-key: <key>` (Azure's). A request that carries no Keel key goes to a passthrough tenant
    (named by `X-Keel-Tenant`, or the default) with its own credentials forwarded, unless anything
    in them is, or looks like, a Keel key: that is a 401, never a Keel key sent to a provider
    (`proxy.credentials`; `refuse_keel_keys` looks at every other slot a request forwards)."""

    def __init__(self, tenants: tuple[TenantConfig, ...], keel_key_prefixes: tuple[str, ...] = ()) -> None:
        self._keyed = [(digest, t, False) for t in tenants for digest in t.auth.key_digests()]
        self._keyed += [(digest, t, True) for t in tenants for digest in t.auth.key_digests(admin=True)]
        self._bound = [(digest, t, u.user) for t in tenants for u in t.auth.user_keys for digest in key_digests((u.key,))]
        self._by_id = {t.id: t for t in tenants}
        self._default = next((t for t in tenants if t.default and t.auth.passthrough), None)
        self.keys = KeelKeys([d for d, _, _ in (*self._keyed, *self._bound)], keel_key_prefixes)
        self._accounts = {t.id: provider_account(t) for t in tenants if not t.auth.passthrough}
        reaching: dict[str, set[bytes]] = {}  # provider account -> the Keel keys that reach it
        for digest, tenant, _ in (*self._keyed, *self._bound):
            reaching.setdefault(self._accounts[tenant.id], set()).add(digest)
        self._shared = {account for account, digests in reaching.items() if len(digests) > 1}

    @staticmethod
    def _upstream_credentials(tenant: TenantConfig) -> dict[str, str]:
        """The tenant's provider key: `Authorization: Bearer` for OpenAI-style upstreams,
        `x-api-key` for Anthropic-style ones."""
        key = tenant.upstream.api_key()
        if not key:
            return {}
        return {"x-api-key": key} if tenant.upstream.kind == "anthropic-compatible" else {"authorization": f"Bearer {key}"}

    def authenticate(self, headers: Mapping[str, str]) -> Caller:
        sent = {name: headers.get(name, "").strip() for name in CREDENTIAL_HEADERS}
        sent = {name: value for name, value in sent.items() if value}
        authorization = sent.get("authorization", "")
        bearer = _BEARER.match(authorization)
        token = bearer.group(1) if bearer else ("" if authorization else sent.get("x-api-key") or sent.get("api-key", ""))
        named = headers.get("x-keel-tenant")
        if token:
            found = self._keel_key(token)
            if found is not None:
                return found
        passthrough = self._by_id.get(named) if named is not None else self._default
        if passthrough is not None and passthrough.auth.passthrough and not any(
                self.keys.in_credential(value) for value in sent.values()):
            parts = [authorization, sent.get("x-api-key", "")] + ([sent["api-key"]] if "api-key" in sent else [])
            return Caller(passthrough, sent, scope=credential_scope("\x00".join(parts)))
        if not token and not authorization:
            raise AuthenticationError("missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key")
        raise AuthenticationError("incorrect API key provided")

    def _keel_key(self, token: str) -> Caller | None:
        digest = hashlib.sha256(token.encode()).digest()
        match: tuple[TenantConfig, bool] | None = None
        for candidate, tenant, admin in self._keyed:
            if hmac.compare_digest(candidate, digest) and match is None:
                match = (tenant, admin)
        if match is not None:
            return Caller(match[0], self._upstream_credentials(match[0]), match[1], keyed=True,
                          scope=credential_scope(token), **self._account(match[0]))
        bound: tuple[TenantConfig, str] | None = None
        for candidate, tenant, user in self._bound:
            if hmac.compare_digest(candidate, digest) and bound is None:
                bound = (tenant, user)
        if bound is not None:
            return Caller(bound[0], self._upstream_credentials(bound[0]), keyed=True, bound_user=bound[1],
                          scope=credential_scope(token), **self._account(bound[0]))
        return None

    def _account(self, tenant: TenantConfig) -> dict[str, Any]:  # Any: Caller's keyword arguments
        account = self._accounts[tenant.id]
        return {"account": account, "shared": account in self._shared}

    def refuse_keel_keys(self, caller: Caller, headers: Iterable[tuple[str, str]], query: str, path: str) -> None:
        """A 401 for a request that would carry a Keel key upstream in any slot: a header, a
        cookie, the query, the path, or a passthrough caller's own credentials."""
        forwarded = {} if caller.keyed else caller.upstream_credentials
        slot = self.keys.carrier(headers, query, path, forwarded)
        if slot is not None:
            raise AuthenticationError(f"a Keel key in {slot}: Keel keys are never sent upstream; send yours as "
                                      "'Authorization: Bearer <key>' only", code="keel_key_misplaced")


def request_id(headers: Mapping[str, str]) -> str:
    given = headers.get("x-request-id", "")
    return given if 0 < len(given) <= 128 and given.isprintable() else uuid.uuid4().hex


KEEL_MARK = b'"' + KEEL.encode() + b'"'  # the key Keel marks its view objects with


def parse_turn(raw: bytes, caller: Caller, headers: Mapping[str, str], rid: str,
               shape: Shape = CHAT, resent: jsontext.Resent | None = None,
               plans: Callable[[Turn], bool] | None = None,
               might_plan: Callable[[TenantConfig], bool] | None = None) -> Turn:
    """The client's body, read by its API shape's codec into the planners' view (a tools
    array seen before, byte for byte, is not parsed again: `resent`). `plans`: would any planner
    act on this turn? When none would, no view is made: the turn goes upstream as the client's
    bytes, and whatever the upstream makes of its body is the client's own answer.
    `might_plan`: could any act for this tenant at all? When none could, the body is only read."""
    # A tenant no planner can act for: read to check, never written back (numbers unchecked).
    read_only = might_plan is not None and not might_plan(caller.tenant)
    try:
        whole = jsontext.read if read_only else jsontext.loads
        body = resent.loads(raw, read_only) if resent is not None else whole(raw)
    except jsontext.UnreadableJsonError:  # valid, but too deep to plan: the client's bytes go upstream
        return Turn(caller.tenant, raw, {}, headers, rid, shape, scope=caller.scope, plannable=False)
    except ValueError as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequestError("request body must be a JSON object", code="invalid_json")
    try:
        shape.codec.check(body)
        if plans is not None:
            wire = _bound(Turn(caller.tenant, raw, body, headers, rid, shape, scope=caller.scope,
                               memory_scope=caller.memory_scope, plannable=False), caller)
            if not plans(wire) or KEEL_MARK in raw:  # Keel's own view key, sent by the client: as sent
                return wire
        view = shape.codec.view(body)
    except ValueError as exc:
        raise BadRequestError(str(exc), param="messages" if "messages" in str(exc) else None) from None
    messages = view.body["messages"]
    request = Turn(caller.tenant, raw, view.body, headers, rid, shape, view, caller.scope, caller.memory_scope,
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
