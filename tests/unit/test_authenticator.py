"""proxy/ingress.py `Authenticator` and proxy/credentials.py `KeelKeys` on their own: which tenant
a key opens, what goes upstream in its place, how passthrough callers are told apart, and that a
Keel key never leaves in any slot."""

from __future__ import annotations

import base64
import hashlib

import orjson
import pytest

from proxy.config import parse_config
from proxy.errors import AuthenticationError
from proxy.ingress import Authenticator, Caller


def digest(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def auth() -> Authenticator:
    config = parse_config({"store": {"url": "sqlite:///:memory:"}, "tenants": [
        {"id": "acme", "auth": {"keys": [digest("sk-keel-a")], "admin_keys": [digest("sk-keel-admin")],
                                "user_keys": [{"key": digest("sk-keel-carol"), "user": "carol"}]},
         "upstream": {"base_url": "http://up/v1"}},
        {"id": "claude", "auth": {"keys": [digest("sk-keel-c")]},
         "upstream": {"base_url": "http://up/v1", "kind": "anthropic-compatible", "api_key_env": "KEEL_UNIT_KEY"}},
        {"id": "byo", "default": True, "auth": {"passthrough": True}, "upstream": {"base_url": "http://up/v1"}},
        {"id": "other", "auth": {"passthrough": True}, "upstream": {"base_url": "http://up/v1"}}]}, "test")
    return Authenticator(config.tenants, config.server.keel_key_prefixes)


@pytest.mark.parametrize("headers", [{"authorization": "Bearer sk-keel-a"}, {"authorization": "  bearer   sk-keel-a "},
                                     {"x-api-key": "sk-keel-a"}, {"api-key": "sk-keel-a"}])
def test_a_keel_key_opens_its_tenant_in_every_slot_the_sdks_use(headers: dict[str, str]) -> None:
    caller = auth().authenticate(headers)
    assert caller.tenant.id == "acme" and caller.keyed and not caller.admin and caller.bound_user is None
    assert "sk-keel-a" not in orjson.dumps(dict(caller.upstream_credentials)).decode(), "never goes upstream"


def test_the_tenants_provider_key_goes_upstream_in_its_providers_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_UNIT_KEY", "sk-ant-provider")
    assert dict(auth().authenticate({"authorization": "Bearer sk-keel-c"}).upstream_credentials) == {
        "x-api-key": "sk-ant-provider"}


def test_admin_and_user_keys() -> None:
    assert auth().authenticate({"authorization": "Bearer sk-keel-admin"}).admin
    carol = auth().authenticate({"authorization": "Bearer sk-keel-carol"})
    assert carol.bound_user == "carol" and carol.keyed and carol.owner("dave").user == "carol", \
        "a user key acts as its own user whatever the request names"


def test_each_keel_key_has_its_own_scope() -> None:
    a, admin = (auth().authenticate({"authorization": f"Bearer {k}"}) for k in ("sk-keel-a", "sk-keel-admin"))
    assert a.scope and a.scope != admin.scope
    assert auth().authenticate({"x-api-key": "sk-keel-a"}).scope == a.scope, "the key, not the slot it came in"


def test_passthrough_callers_are_scoped_by_their_own_credential() -> None:
    one = auth().authenticate({"authorization": "Bearer sk-provider-1"})
    two = auth().authenticate({"authorization": "Bearer sk-provider-2"})
    again = auth().authenticate({"authorization": "Bearer sk-provider-1"})
    assert one.tenant.id == "byo" and not one.keyed and one.scope != two.scope and one.scope == again.scope
    assert dict(one.upstream_credentials) == {"authorization": "Bearer sk-provider-1"}, "their own key goes upstream"
    assert auth().authenticate({"x-api-key": "sk-provider-1"}).scope != one.scope, "another slot, another scope"


def test_a_passthrough_tenant_is_named_by_header() -> None:
    assert auth().authenticate({"authorization": "Bearer sk-p", "x-keel-tenant": "other"}).tenant.id == "other"
    with pytest.raises(AuthenticationError):
        auth().authenticate({"authorization": "Bearer sk-p", "x-keel-tenant": "acme"})  # a keyed tenant: no key


def test_a_keel_key_is_never_a_passthrough_credential() -> None:
    """A mistyped or revoked Keel key (its prefix) is a 401, never sent to a provider as the caller's own."""
    for headers in ({"authorization": "Bearer sk-keel-wrong"}, {"x-api-key": "keel-revoked"},
                    {"authorization": "Basic " + base64.b64encode(b"user:sk-keel-a").decode()}):
        with pytest.raises(AuthenticationError):
            auth().authenticate(headers)


def test_a_missing_or_wrong_key_is_a_401_where_no_tenant_is_passthrough() -> None:
    keyed_only = Authenticator(parse_config({"store": {"url": "sqlite:///:memory:"}, "tenants": [
        {"id": "acme", "auth": {"keys": [digest("sk-keel-a")]}, "upstream": {"base_url": "http://up/v1"}}]},
        "test").tenants)
    with pytest.raises(AuthenticationError, match="missing"):
        keyed_only.authenticate({})
    with pytest.raises(AuthenticationError, match="incorrect"):
        keyed_only.authenticate({"authorization": "Bearer sk-provider-1"})


def test_memory_scope() -> None:
    """A Keel key's tenant is enough to separate memory; a passthrough caller's credential is what
    separates it; a passthrough caller with no credential has no identity to keep memory by."""
    assert auth().authenticate({"authorization": "Bearer sk-keel-a"}).memory_scope == ""
    one = auth().authenticate({"authorization": "Bearer sk-provider-1"})
    assert one.memory_scope == one.scope != ""
    assert auth().authenticate({}).memory_scope is None


def keyed() -> Caller:
    return auth().authenticate({"authorization": "Bearer sk-keel-a"})


@pytest.mark.parametrize(("headers", "query", "path", "slot"), [
    ([("cookie", "session=sk-keel-a")], "", "/v1/chat/completions", "the cookie header"),
    ([("x-custom", "token sk-keel-a")], "", "/v1/chat/completions", "the x-custom header"),
    ([], "api_key=sk-keel-a", "/v1/chat/completions", "the query parameter api_key"),
    ([], "x=1;sk-keel-a", "/v1/chat/completions", "the query parameter "),
    ([], "", "/v1/files/sk-keel-a/content", "the path"),
    ([], "", "/v1/files/sk%252Dkeel%252Da", "the path"),  # encoded twice
])
def test_a_keel_key_in_any_other_slot_is_refused(headers: list[tuple[str, str]], query: str, path: str,
                                                 slot: str) -> None:
    with pytest.raises(AuthenticationError) as refused:
        auth().refuse_keel_keys(keyed(), headers, query, path)
    assert refused.value.code == "keel_key_misplaced" and slot in refused.value.message


def test_a_prefix_alone_in_another_slot_proves_nothing() -> None:
    """Only a configured key is refused outside the credential headers: a cookie that merely starts
    like one is some other application's."""
    auth().refuse_keel_keys(keyed(), [("cookie", "theme=keel-dark")], "q=sk-keel-docs", "/v1/models")


def test_the_keyed_callers_own_credential_headers_are_not_forwarded_so_not_refused() -> None:
    auth().refuse_keel_keys(keyed(), [("authorization", "Bearer sk-keel-a")], "", "/v1/models")
