"""A Keel key never leaves Keel, whatever slot it arrives in (issue 20, finding 9), through HTTP
against a recording upstream: `proxy/credentials.py` and `Authenticator` in `proxy/ingress.py`."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from conftest import KEY, KEY_DIGEST, ServerThread, keel_config, tenant
from recorder import Recorder

from proxy.credentials import KeelKeys, words

BASE64_KEY = base64.b64encode(KEY.encode()).decode().rstrip("=")
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def keel_and_upstream(start_keel: Callable[..., ServerThread]) -> Iterator[tuple[ServerThread, Recorder]]:
    """A keyed tenant and a default passthrough tenant, both in front of one recording upstream."""
    recorder = Recorder()
    with ServerThread(recorder) as upstream:
        byok = {"id": "byok", "default": True, "auth": {"passthrough": True}, "upstream": {"base_url": upstream.url + "/v1"}}
        yield start_keel(keel_config(tenant(upstream.url + "/v1"), byok)), recorder


def _leaked(recorder: Recorder) -> bool:
    seen = " ".join(f"{r.headers} {r.query!r} {r.raw_path!r} {r.path}" for r in recorder.received)
    return KEY in seen or BASE64_KEY in seen or KEY.upper() in seen


def basic(credential: str) -> str:
    return "Basic " + base64.b64encode(credential.encode()).decode()


CARRIERS: dict[str, dict[str, Any]] = {
    "Basic key:": {"headers": {"authorization": basic(f"{KEY}:")}},
    "Basic user:key": {"headers": {"authorization": basic(f"user:{KEY}")}},
    "Token scheme": {"headers": {"authorization": f"Token {KEY}"}},
    "x-api-key beside a provider key": {"headers": {"authorization": "Bearer sk-real", "x-api-key": KEY}},
    "two bearer tokens": {"headers": {"authorization": f"Bearer sk-real, Bearer {KEY}"}},
    "openai-organization": {"headers": {"authorization": "Bearer sk-real", "openai-organization": KEY}},
    "another header": {"headers": {"authorization": "Bearer sk-real", "x-custom": f"token={KEY}"}},
    "cookie": {"headers": {"authorization": "Bearer sk-real", "cookie": f"session={KEY}; theme=dark"}},
    "query api_key": {"headers": {"authorization": "Bearer sk-real"}, "query": f"?api_key={KEY}"},
    "query percent-encoded": {"headers": {"authorization": "Bearer sk-real"},
                              "query": "?k=" + "".join(f"%{b:02x}" for b in KEY.encode())},
    "query without a provider key": {"headers": {}, "query": f"?api_key={KEY}"},
    "path": {"headers": {"authorization": "Bearer sk-real"}, "path": f"/v1/files/{KEY}"},
    "keyed caller's cookie": {"headers": {"authorization": f"Bearer {KEY}", "cookie": f"k={KEY}"}},
    "keyed caller's query": {"headers": {"authorization": f"Bearer {KEY}"}, "query": f"?key={KEY}"},
}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models"])
@pytest.mark.parametrize("carrier", list(CARRIERS))
def test_keel_key_in_any_slot_never_reaches_the_provider(keel_and_upstream: tuple[ServerThread, Recorder],
                                                         carrier: str, path: str) -> None:
    """Basic credentials, other schemes, other headers, cookies, the query and the path: a request
    that would carry a Keel key upstream is a 401 saying where the key was, and nothing is sent."""
    keel, recorder = keel_and_upstream
    case = CARRIERS[carrier]
    url = keel.url + case.get("path", path) + case.get("query", "")
    reply = httpx.post(url, json=CHAT, headers=case["headers"])
    assert reply.status_code == 401, reply.text
    assert reply.json()["error"]["code"] in ("keel_key_misplaced", "invalid_api_key")
    assert recorder.received == [] and not _leaked(recorder)


def test_azure_api_key_header_authenticates_a_keel_key(keel_and_upstream: tuple[ServerThread, Recorder]) -> None:
    """The Azure SDKs send their key as `api-key`: a Keel key there authenticates, and the provider gets
    the tenant's own key in its place, never the header."""
    keel, recorder = keel_and_upstream
    reply = httpx.post(keel.url + "/v1/chat/completions", json=CHAT, headers={"api-key": KEY})
    assert reply.status_code == 200
    sent = recorder.received[0].headers
    assert sent["authorization"] == "Bearer sk-upstream-secret" and "api-key" not in sent and not _leaked(recorder)


def test_keyed_callers_credential_headers_stay_in_keel(keel_and_upstream: tuple[ServerThread, Recorder]) -> None:
    """A client that sends its Keel key in every credential header at once is served; none of them
    goes upstream."""
    keel, recorder = keel_and_upstream
    headers = {"authorization": f"Bearer {KEY}", "x-api-key": KEY, "api-key": KEY}
    assert httpx.post(keel.url + "/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
    assert not _leaked(recorder) and "api-key" not in recorder.received[0].headers


def test_passthrough_callers_own_credentials_still_go_upstream(keel_and_upstream: tuple[ServerThread, Recorder]) -> None:
    """A passthrough caller's own provider key goes upstream in the slot it used (an Azure `api-key`
    too), and ordinary headers that merely start like a Keel key (a user agent) pass."""
    keel, recorder = keel_and_upstream
    for headers in ({"api-key": "azure-secret"}, {"authorization": "Bearer sk-proj", "user-agent": "keel-demo/1.0"}):
        assert httpx.post(keel.url + "/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
    assert recorder.received[0].headers["api-key"] == "azure-secret"
    assert recorder.received[1].headers["authorization"] == "Bearer sk-proj"
    assert recorder.received[1].headers["user-agent"] == "keel-demo/1.0"


def test_words_see_through_basic_and_separators() -> None:
    """A credential's words: Basic decoded, and split on the separators schemes and cookies use."""
    keys = KeelKeys([bytes.fromhex(KEY_DIGEST)], ("keel-",))
    assert KEY in words(basic(f"user:{KEY}")) and KEY in words(f"a=1; b={KEY}")
    assert keys.in_credential(basic(f"{KEY}:")) and keys.in_credential("Bearer keel-typo")
    assert not keys.in_credential("Bearer sk-proj-abc") and not keys.is_key("keel-typo")
