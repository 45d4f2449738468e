"""What the attack review of the savings page, /v1/responses and /v1/messages, learning from traffic and
isolation on the new shapes found, each reproduced through HTTP against real servers."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import KEY, KEY_DIGEST, ServerThread, eventually, keel_config, small_catalog, tenant

import proxy.tools.learned as learned_module
from proxy.standin.app import StandIn, create_standin_app
from proxy.standin.script import hidden_call
from proxy.tokens import TokenCounter

ADMIN = "keel-admin-attack"
ADMIN_DIGEST = hashlib.sha256(ADMIN.encode()).hexdigest()
AUTH = {"authorization": f"Bearer {KEY}"}
ADMIN_AUTH = {"authorization": f"Bearer {ADMIN}"}
EVERYTHING: dict[str, Any] = {"tools": {"enabled": True}, "context": {"stable": True},
                              "cache": {"prompt_cache_key": "auto", "breakpoints": "auto"}}


@pytest.fixture
def stand(token_counter: TokenCounter) -> Iterator[ServerThread]:
    with ServerThread(create_standin_app(standin=StandIn(tokens=token_counter))) as server:
        yield server


def admin_tenant(url: str, **overrides: Any) -> dict[str, Any]:
    return tenant(url, auth={"keys": [f"sha256:{KEY_DIGEST}"], "admin_keys": [f"sha256:{ADMIN_DIGEST}"]},
                  **{**EVERYTHING, **overrides})


@pytest.fixture
def keel_on(stand: ServerThread, start_keel: Callable[..., ServerThread]) -> ServerThread:
    """Keel with every request feature on, in front of the stand-in; ADMIN opens its page."""
    return start_keel(keel_config(admin_tenant(stand.url + "/v1")))


def bodies(shape: str, **extra: Any) -> dict[str, Any]:
    if shape == "chat":
        return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    if shape == "responses":
        return {"model": "m", "input": "hi", **extra}
    return {"model": "c", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}], **extra}


PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


# --- 1. x-keel-conversation echoes metadata.conversation_id into a response header -----------------------

@pytest.mark.parametrize("shape", ["chat", "responses", "messages"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("conversation", ["会话-1", "a\r\nx-injected: 1", "c" * 100_000])
def test_conversation_id_header_is_safe(keel_on: ServerThread, shape: str, stream: bool,
                                        conversation: str) -> None:
    """A conversation id from the body (a unicode one, one with a line break, a very long one) used to be
    echoed as `x-keel-conversation`: a 500 after the upstream had answered (not latin-1), a dropped
    connection (a CR/LF in a header), or a header no client reads (100 KB). The reply is the upstream's,
    and the header a short printable label the page finds the conversation by."""
    body = bodies(shape, stream=stream, metadata={"conversation_id": conversation})
    if shape == "chat" and stream:
        body["stream_options"] = {"include_usage": True}  # a streamed chat turn is metered only with its usage
    with httpx.Client(timeout=10) as client:
        reply = client.post(keel_on.url + PATHS[shape], headers=AUTH, json=body)
        assert reply.status_code == 200, reply.text[:300]
        label = reply.headers["x-keel-conversation"]
        assert 0 < len(label) <= 128 and label.isascii() and label.isprintable() and " " not in label
        assert "x-injected" not in reply.headers
        deadline = time.monotonic() + 5
        while True:
            page = client.get(keel_on.url + "/keel/api/conversation", params={"id": label}, headers=ADMIN_AUTH)
            if page.json()["turns"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(page.json()["turns"]) == 1


def test_plain_conversation_ids_are_unchanged(keel_on: ServerThread) -> None:
    """The usual ids (a uuid, `conv-1`) stay what the client sent, on the header and the page."""
    for conversation in ("conv-1", "5f0c6c8e-8f1e-4b8e-9a51-0b6d3c1f2a77"):
        reply = httpx.post(keel_on.url + "/v1/chat/completions", headers={**AUTH, "x-keel-conversation": conversation},
                           json=bodies("chat"))
        assert reply.headers["x-keel-conversation"] == conversation


# --- 2. ?since= reaching back centuries -------------------------------------------------------------------

@pytest.mark.parametrize("since", ["0001-01-01", "100000d", "9" * 400 + "d", "1000000w"])
def test_since_far_back_is_bounded_by_retention(keel_on: ServerThread, since: str) -> None:
    """`since` reaching back past the retention used to read one store key per hour of the range,
    built on the event loop: `0001-01-01` hung the worker (17.5 million hours; every tenant's traffic
    with it), `100000d` took seconds and ended in a 500, a number too large for a float a 500. Nothing
    older than `savings.retention_days` exists: the range starts there at the earliest."""
    started = time.monotonic()
    for path in ("/keel/api/summary", "/keel/"):
        reply = httpx.get(keel_on.url + path, params={"since": since}, headers=ADMIN_AUTH, timeout=10)
        assert reply.status_code == 200, reply.text[:300]
    assert time.monotonic() - started < 3
    ping = httpx.post(keel_on.url + "/v1/chat/completions", headers=AUTH, json=bodies("chat"), timeout=5)
    assert ping.status_code == 200


# --- 3. learning from traffic: what a client can make Keel keep ------------------------------------------

def learned_fields(db: Path) -> dict[str, bytes]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT field, value FROM hashes WHERE key = ?", ("keel:{learned:acme}:phrases",)))


def gadget(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": "Count the lamps a lighthouse keeper logged.",
                                             "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}}


def found_by_search(keel: ServerThread, name: str, words: str = "tidy the old workshop bench",
                    headers: dict[str, str] | None = None) -> httpx.Response:
    """One turn whose model finds `name` by tool_search and calls it: Keel learns the turn's words for it."""
    reply = httpx.post(keel.url + "/v1/chat/completions", headers={**AUTH, **(headers or {})}, timeout=15, json={
        "model": "m", "tools": [*small_catalog(), gadget(name)],
        "messages": [{"role": "user", "content": f"{words} " + hidden_call(name, '{"id": "1"}')}]})
    reply.raise_for_status()
    return reply


@pytest.fixture
def learning(stand: ServerThread, start_keel: Callable[..., ServerThread],
             tmp_path: Path) -> tuple[ServerThread, Path, ServerThread]:
    """Keel with lean tools on a SQLite file (read back by the test), the stand-in behind it."""
    db = tmp_path / "keel.db"
    return start_keel(keel_config(tenant(stand.url + "/v1", tools={"enabled": True}),
                                  store={"url": f"sqlite:///{db}"})), db, stand


def test_learned_tools_per_tenant_are_bounded(learning: tuple[ServerThread, Path, ServerThread],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tool a search found was kept for its tenant forever: `TOOLS_PER_TENANT` capped only what
    a ranking reads, never what the store holds, so a client naming a new tool each turn grew the
    tenant's hash without end. The least recently learned now go once the tenant holds more."""
    monkeypatch.setattr(learned_module, "TOOLS_PER_TENANT", 3)
    keel, db, _ = learning
    for i in range(6):
        found_by_search(keel, f"zz_gadget_{i}")
        found_by_search(keel, "plain_request_ranks_again", words="list the tickets")  # a ranking reads the phrases
    assert eventually(lambda: len(learned_fields(db)) <= 3), sorted(learned_fields(db))
    assert "zz_gadget_5" in learned_fields(db)


def test_learned_tool_names_are_bounded(learning: tuple[ServerThread, Path, ServerThread]) -> None:
    """A tool name has no length limit in a client's catalog; a 20,000-character one found by search was
    kept as a field name of the tenant's phrases. Names longer than any provider accepts are not learned."""
    keel, db, _ = learning
    found_by_search(keel, "zz_" + "q" * 20_000)
    assert all(len(name) <= 256 for name in learned_fields(db))


def test_learned_phrases_expire(learning: tuple[ServerThread, Path, ServerThread], monkeypatch: pytest.MonkeyPatch) -> None:
    """`LearnedPhrases(ttl=90 days)` was never applied: hashes have no TTL in the store, so a user's words
    (up to 500 characters of their message) stayed in the tenant's phrases for good. A phrase older
    than the ttl no longer recalls its tool (and goes at the next reading)."""
    keel, _, _ = learning
    found_by_search(keel, "polish_gadget", words="buff the old trumpet valves until they shine")
    later = time.time() + 91 * 24 * 3600
    monkeypatch.setattr(learned_module.time, "time", lambda: later)
    reply = httpx.post(keel.url + "/v1/chat/completions", headers=AUTH, timeout=15, json={
        "model": "m", "tools": [*small_catalog(), gadget("polish_gadget")],
        "messages": [{"role": "user", "content": "buff the trumpet valves until they shine"}]})
    assert reply.status_code == 200
    sent = learning[2].app.state.standin.requests[-1]
    assert "polish_gadget" not in [t["function"]["name"] for t in sent.get("tools", [])]


def test_learned_index_cache_is_bounded(learning: tuple[ServerThread, Path, ServerThread]) -> None:
    """The per-process cache of learned indexes kept one entry per (tenant, catalog) it ever saw, with no
    bound: a client sending a new catalog each turn grew a worker's memory without end."""
    keel, _, _ = learning
    phrases = keel.app.state.keel.pipeline.planners[0].learned
    with httpx.Client(timeout=15) as client:
        for i in range(300):
            client.post(keel.url + "/v1/chat/completions", headers=AUTH, json={
                "model": "m", "tools": [*small_catalog(), gadget(f"gadget_{i}")],
                "messages": [{"role": "user", "content": "list the tickets"}]}).raise_for_status()
    assert len(phrases._indexes) <= learned_module.INDEXES_KEPT


def test_learned_words_never_reach_another_users_request(learning: tuple[ServerThread, Path, ServerThread]) -> None:
    """Held: what one user's turn taught ships a tool of the other user's own catalog, never a word of it."""
    keel, _, _ = learning
    found_by_search(keel, "polish_gadget", words="buff the zanzibar trumpet valves", headers={"x-keel-user": "ana"})
    httpx.post(keel.url + "/v1/chat/completions", headers={**AUTH, "x-keel-user": "bo"}, timeout=15, json={
        "model": "m", "tools": [*small_catalog(), gadget("polish_gadget")],
        "messages": [{"role": "user", "content": "buff the trumpet valves"}]}).raise_for_status()
    sent = learning[2].app.state.standin.requests[-1]
    assert "polish_gadget" in [t["function"]["name"] for t in sent["tools"]]  # recalled: a tool of bo's catalog
    assert "zanzibar" not in orjson.dumps(sent).decode()


# --- 4. the savings page's sign-in ------------------------------------------------------------------------

def test_cookie_opens_the_page_never_the_api(keel_on: ServerThread) -> None:
    """The README and the page's docstring: the sign-in cookie "opens the page, never the API". It opened
    /keel/api/summary and /keel/api/conversation too (the cookie's path, /keel, covers them)."""
    login = httpx.post(keel_on.url + "/keel/login", data={"key": ADMIN})
    cookie = {"keel_admin": login.cookies["keel_admin"]}
    assert httpx.get(keel_on.url + "/keel/", cookies=cookie).status_code == 200
    for path in ("/keel/api/summary", "/keel/api/conversation?id=x"):
        assert httpx.get(keel_on.url + path, cookies=cookie).status_code == 401, path
        assert httpx.get(keel_on.url + path, headers=ADMIN_AUTH).status_code == 200, path


def test_login_from_another_site_is_refused(keel_on: ServerThread) -> None:
    """A form on another site could post a key to /keel/login and sign the browser in (login CSRF: the
    victim then reads, and acts on, figures the attacker chose). A sign-in whose Origin (or
    Sec-Fetch-Site) says it came from another site is refused; the page's own form still works."""
    cross = httpx.post(keel_on.url + "/keel/login", data={"key": ADMIN}, headers={"origin": "https://evil.example"})
    assert cross.status_code == 403 and "set-cookie" not in cross.headers
    fetched = httpx.post(keel_on.url + "/keel/login", data={"key": ADMIN}, headers={"sec-fetch-site": "cross-site"})
    assert fetched.status_code == 403 and "set-cookie" not in fetched.headers
    same = httpx.post(keel_on.url + "/keel/login", data={"key": ADMIN}, headers={"origin": keel_on.url})
    assert same.status_code == 303 and "keel_admin" in same.cookies
    assert httpx.post(keel_on.url + "/keel/login", data={"key": ADMIN}).status_code == 303  # no Origin: curl, tests


@pytest.mark.xfail(strict=True, reason="not fixed: the cookie is the key's SHA-256, the very value auth.admin_keys "
                                       "stores; a signed, expiring cookie needs a secret Keel does not have yet")
def test_the_configs_digest_is_not_a_cookie(keel_on: ServerThread) -> None:
    """The sign-in cookie is the admin key's SHA-256 digest, which is exactly what `auth.admin_keys` holds
    (`sha256:<hex>`): anyone who reads the config (a ConfigMap, a repository, `keel check-config`'s
    output) opens the page without the key, and a cookie once seen opens it for as long as the key
    lives (max_age is the browser's business; sign-out revokes nothing)."""
    assert httpx.get(keel_on.url + "/keel/", cookies={"keel_admin": ADMIN_DIGEST}).status_code != 200
