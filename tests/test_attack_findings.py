"""What the attack review of the savings page, /v1/responses and /v1/messages, learning from traffic and
isolation on the new shapes found, each reproduced through HTTP against real servers."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from conftest import KEY, KEY_DIGEST, ServerThread, eventually, keel_config, small_catalog, tenant
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz import json_values, scripted  # noqa: F401  (the scripted upstream fixture)

from proxy.standin.app import StandIn, create_standin_app
from proxy.standin.script import hidden_call
from proxy.testing import FakeClock
from proxy.tokens import TokenCounter
from proxy.tools.learned import INDEXES_KEPT, LearnedPhrases

ADMIN = "keel-admin-attack"
ADMIN_DIGEST = hashlib.sha256(ADMIN.encode()).hexdigest()
AUTH = {"authorization": f"Bearer {KEY}"}
ADMIN_AUTH = {"authorization": f"Bearer {ADMIN}"}
EVERYTHING: dict[str, Any] = {
    "tools": {"enabled": True, "stability": "per_turn"},
    "context": {"stable": True},
    "cache": {"prompt_cache_key": "auto", "breakpoints": "auto"},
}


@pytest.fixture
def stand(token_counter: TokenCounter) -> Iterator[ServerThread]:
    with ServerThread(create_standin_app(standin=StandIn(tokens=token_counter))) as server:
        yield server


def admin_tenant(url: str, **overrides: Any) -> dict[str, Any]:
    return tenant(url, auth={"keys": [f"sha256:{KEY_DIGEST}"], "admin_keys": [f"sha256:{ADMIN_DIGEST}"]}, **{**EVERYTHING, **overrides})


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
def test_conversation_id_header_is_safe(keel_on: ServerThread, shape: str, stream: bool, conversation: str) -> None:
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
        deadline = time.monotonic() + 15  # written in the background, after the turn before it (a loaded machine)
        while True:
            page = client.get(keel_on.url + "/keel/api/conversation", params={"id": label}, headers=ADMIN_AUTH)
            if page.json()["turns"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(page.json()["turns"]) == 1


def test_plain_conversation_ids_are_unchanged(keel_on: ServerThread) -> None:
    """The usual ids (a uuid, `conv-1`) stay what the client sent, on the header and the page."""
    for conversation in ("conv-1", "5f0c6c8e-8f1e-4b8e-9a51-0b6d3c1f2a77"):
        reply = httpx.post(keel_on.url + "/v1/chat/completions", headers={**AUTH, "x-keel-conversation": conversation}, json=bodies("chat"))
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
        return dict(conn.execute("SELECT field, value FROM hashes WHERE key LIKE ?", ("keel:{learned:acme:%}:phrases",)))


def gadget(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": "Count the lamps a lighthouse keeper logged.",
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
        },
    }


def found_by_search(
    keel: ServerThread, name: str, words: str = "tidy the old workshop bench", headers: dict[str, str] | None = None
) -> httpx.Response:
    """One turn whose model finds `name` by tool_search and calls it: Keel learns the turn's words for it."""
    reply = httpx.post(
        keel.url + "/v1/chat/completions",
        headers={**AUTH, **(headers or {})},
        timeout=15,
        json={
            "model": "m",
            "tools": [*small_catalog(), gadget(name)],
            "messages": [{"role": "user", "content": f"{words} " + hidden_call(name, '{"id": "1"}')}],
        },
    )
    reply.raise_for_status()
    return reply


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def learning(stand: ServerThread, start_keel: Callable[..., ServerThread], tmp_path: Path,
             clock: FakeClock) -> tuple[ServerThread, Path, ServerThread]:
    """Keel with lean tools on a SQLite file (read back by the test), the stand-in behind it, on a
    fake clock (`clock`) that moves only when the test says."""
    db = tmp_path / "keel.db"
    tools = {"enabled": True, "stability": "per_turn"}
    return start_keel(keel_config(tenant(stand.url + "/v1", tools=tools), store={"url": f"sqlite:///{db}"}),
                      clock=clock), db, stand


def learned_phrases(keel: ServerThread) -> LearnedPhrases:
    learned: LearnedPhrases = keel.app.state.keel.pipeline.planners[0].learned
    return learned


def test_learned_tools_per_tenant_are_bounded(learning: tuple[ServerThread, Path, ServerThread],
                                             clock: FakeClock) -> None:
    """Every tool a search found was kept for its tenant forever: `TOOLS_PER_TENANT` (now `TOOLS_PER_SCOPE`) capped only what
    a ranking reads, never what the store holds, so a client naming a new tool each turn grew the
    tenant's hash without end. The least recently learned now go once the tenant holds more."""
    keel, db, _ = learning
    learned_phrases(keel).tools_per_scope = 3  # this app's bound, not the module's
    for i in range(6):
        clock.advance(1)  # each learned a second after the one before
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


def test_learned_phrases_expire(learning: tuple[ServerThread, Path, ServerThread], clock: FakeClock) -> None:
    """`LearnedPhrases(ttl=90 days)` was never applied: hashes have no TTL in the store, so a user's words
    (up to 500 characters of their message) stayed in the tenant's phrases for good. A phrase older
    than the ttl no longer recalls its tool (and goes at the next reading)."""
    keel, _, _ = learning
    found_by_search(keel, "polish_gadget", words="buff the old trumpet valves until they shine")

    def shipped() -> list[str]:
        reply = httpx.post(keel.url + "/v1/chat/completions", headers=AUTH, timeout=15, json={
            "model": "m", "tools": [*small_catalog(), gadget("polish_gadget")],
            "messages": [{"role": "user", "content": "buff the trumpet valves until they shine"}]})
        assert reply.status_code == 200
        return [t["function"]["name"] for t in learning[2].app.state.standin.requests[-1].get("tools", [])]

    clock.advance(89 * 24 * 3600)
    assert "polish_gadget" in shipped(), "within the ttl the phrase recalls its tool"
    clock.advance(2 * 24 * 3600)
    assert "polish_gadget" not in shipped()


def test_learned_index_cache_is_bounded(learning: tuple[ServerThread, Path, ServerThread]) -> None:
    """The per-process cache of learned indexes kept one entry per (tenant, catalog) it ever saw, with no
    bound: a client sending a new catalog each turn grew a worker's memory without end."""
    keel, _, _ = learning
    phrases = keel.app.state.keel.pipeline.planners[0].learned
    with httpx.Client(timeout=15) as client:
        for i in range(300):
            client.post(
                keel.url + "/v1/chat/completions",
                headers=AUTH,
                json={
                    "model": "m",
                    "tools": [*small_catalog(), gadget(f"gadget_{i}")],
                    "messages": [{"role": "user", "content": "list the tickets"}],
                },
            ).raise_for_status()
    assert len(phrases._indexes) <= INDEXES_KEPT


def test_learned_words_never_reach_another_users_request(learning: tuple[ServerThread, Path, ServerThread]) -> None:
    """What one user's turn taught never reaches the other user's request: not a word of it, and since
    learning is scoped like every stored state (issue 20, finding 7), not the tool it taught either."""
    keel, _, _ = learning
    found_by_search(keel, "polish_gadget", words="buff the zanzibar trumpet valves", headers={"x-keel-user": "ana"})
    httpx.post(
        keel.url + "/v1/chat/completions",
        headers={**AUTH, "x-keel-user": "bo"},
        timeout=15,
        json={
            "model": "m",
            "tools": [*small_catalog(), gadget("polish_gadget")],
            "messages": [{"role": "user", "content": "buff the trumpet valves"}],
        },
    ).raise_for_status()
    sent = learning[2].app.state.standin.requests[-1]
    assert "polish_gadget" not in [t["function"]["name"] for t in sent["tools"]]  # ana's lesson, not bo's
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


def test_the_configs_digest_is_not_a_cookie(keel_on: ServerThread) -> None:
    """The sign-in cookie was the admin key's SHA-256 digest, exactly what `auth.admin_keys` holds
    (`sha256:<hex>`): anyone who read the config opened the page without the key, for as long as
    the key lived. Now it is signed (a secret in the store) and expires: the digest alone, an
    altered expiry or a stale cookie opens nothing; the cookie a sign-in sets does."""
    def page(cookie: str) -> str:
        return httpx.get(keel_on.url + "/keel/", cookies={"keel_admin": cookie}).text

    signed_in = httpx.post(keel_on.url + "/keel/login", data={"key": ADMIN}).cookies["keel_admin"]
    assert "Sign out" in page(signed_in)
    expires, nonce, digest, mac = signed_in.split(".")
    assert digest == ADMIN_DIGEST
    for forged in (ADMIN_DIGEST, f"{int(expires) + 3600}.{nonce}.{digest}.{mac}",
                   f"{int(time.time()) - 1}.{nonce}.{digest}.{mac}", f"{expires}.{nonce}.{digest}.{'0' * 64}",
                   f"{expires}.{'0' * len(nonce)}.{digest}.{mac}"):
        assert "Sign out" not in page(forged), forged


def test_signing_out_revokes_the_cookie(keel_on: ServerThread) -> None:
    """Sign-out only asked the browser to drop the cookie: a copy (another tab's, a stolen one) stayed
    valid for 12 hours. Signing out revokes that cookie in the store, for every worker and replica;
    a fresh sign-in, even in the same second, gets a cookie of its own that works."""
    def signed_in(cookie: str) -> bool:
        return "Sign out" in httpx.get(keel_on.url + "/keel/", cookies={"keel_admin": cookie}).text

    first = httpx.post(keel_on.url + "/keel/login", data={"key": ADMIN}).cookies["keel_admin"]
    second = httpx.post(keel_on.url + "/keel/login", data={"key": ADMIN}).cookies["keel_admin"]
    assert signed_in(first) and signed_in(second) and first != second
    out = httpx.post(keel_on.url + "/keel/logout", cookies={"keel_admin": first})
    assert out.status_code == 303 and not signed_in(first)
    assert signed_in(second)  # another sign-in (another browser) stays signed in


# --- 5. isolation on /v1/responses: previous_response_id ----------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_previous_response_id_of_another_user_is_refused(stand: ServerThread, start_keel: Callable[..., ServerThread],
                                                         stream: bool) -> None:
    """With `auth.user_keys` each key "acts only as its own user" (a 403 for any other). Yet bob's key may
    continue from alice's response: Keel forwards `previous_response_id` with the tenant's one provider
    key, and the provider, which stores responses per key, answers bob from alice's conversation. (The
    alias Keel keeps for a searched stream is scoped by credential, not end user, likewise.) Response ids
    are not secrets (logs, shared links, a support ticket); a user key should prove the id is its own."""
    keys = {"alice": "sk-keel-alice", "bob": "sk-keel-bob"}
    config = admin_tenant(stand.url + "/v1")
    config["auth"] = {"user_keys": [{"key": "sha256:" + hashlib.sha256(k.encode()).hexdigest(), "user": u} for u, k in keys.items()]}
    keel = start_keel(keel_config(config))
    alice = openai.OpenAI(base_url=keel.url + "/v1", api_key=keys["alice"], max_retries=0)
    if stream:
        with alice.responses.stream(model="m", input="my PIN is 4711") as events:
            theirs = events.get_final_response().id
    else:
        theirs = alice.responses.create(model="m", input="my PIN is 4711").id
    mine = httpx.post(keel.url + "/v1/responses", headers={"authorization": f"Bearer {keys['alice']}"},
                      json={"model": "m", "input": "and now?", "previous_response_id": theirs})
    assert mine.status_code == 200, "the owner continues as usual"
    before = len(stand.app.state.standin.requests)
    reply = httpx.post(
        keel.url + "/v1/responses",
        headers={"authorization": f"Bearer {keys['bob']}"},
        json={"model": "m", "input": "what did I say?", "previous_response_id": theirs},
    )
    forwarded = [r for r in list(stand.app.state.standin.requests)[before:] if r.get("previous_response_id") == theirs]
    assert reply.status_code == 403 and not forwarded


# --- held: what the page shows of client-chosen text is escaped ---------------------------------------------


def test_inspector_escapes_what_clients_chose(keel_on: ServerThread) -> None:
    """Held: a conversation id, a model name, a system prompt section (the context update) and a user id
    with markup show as text on the overview and in the inspector, never as markup."""
    evil = '"><script>alert(1)</script><img src=x onerror=alert(2)>'
    headers = {**AUTH, "x-keel-conversation": evil, "x-keel-user": evil}
    for section in ("<rules>be brief</rules>", f"<rules>be brief</rules>\n\n<evil>{evil}</evil>"):
        reply = httpx.post(
            keel_on.url + "/v1/chat/completions",
            headers=headers,
            json={"model": evil, "messages": [{"role": "system", "content": section}, {"role": "user", "content": f"hi {evil}"}]},
        )
        assert reply.status_code == 200
    deadline = time.monotonic() + 5
    while not httpx.get(keel_on.url + "/keel/api/conversation", params={"id": evil}, headers=ADMIN_AUTH).json()["turns"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for path, params in (("/keel/", {}), ("/keel/conversation", {"id": evil})):
        page = httpx.get(keel_on.url + path, params=params, headers=ADMIN_AUTH).text
        assert "<script" not in page and "<img" not in page and "&lt;script&gt;" in page, path


# --- held: fuzzed bodies and upstream replies on /v1/responses and /v1/messages (tools deferred, context, cache) ---
# Whatever the client sends or the upstream answers (tool_search with odd arguments, events out of order, cut
# streams, wrong types), Keel answers the upstream's reply or the shape's own error: never a 5xx of its own.

FUZZ_ON: dict[str, Any] = {
    "tools": {"enabled": True, "stability": "per_turn", "defer": {"min_tools": 2}},
    "context": {"stable": True},
    "cache": {"prompt_cache_key": "auto", "breakpoints": "auto"},
}
FUZZ_AUTH = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def rtools():
    return [
        {
            "type": "function",
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "parameters": t["function"]["parameters"],
        }
        for t in small_catalog()
    ]


def mtools():
    return [
        {"name": t["function"]["name"], "description": t["function"]["description"], "input_schema": t["function"]["parameters"]}
        for t in small_catalog()
    ]


def own_failure(r: httpx.Response) -> bool:
    return r.status_code >= 500 and (b'"internal_error"' in r.content or "x-request-id" not in r.headers)


@pytest.fixture
def fuzz_keels(standin: ServerThread, start_keel: Any) -> list[ServerThread]:
    return [start_keel(keel_config(tenant(standin.url + "/v1", **FUZZ_ON)))]


items = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "item_reference", "x", "input_text"])},
        optional={
            "role": st.sampled_from(["user", "assistant", "system", "developer", 5]),
            "content": st.one_of(
                json_values,
                st.lists(
                    st.fixed_dictionaries(
                        {"type": st.sampled_from(["input_text", "output_text", "input_image", "text", "x"])}, optional={"text": json_values}
                    ),
                    max_size=3,
                ),
            ),
            "call_id": json_values,
            "name": st.one_of(json_values, st.sampled_from(["tool_search", "close_ticket"])),
            "arguments": json_values,
            "output": json_values,
            "id": json_values,
        },
    ),
)
rfields = st.dictionaries(
    st.sampled_from(
        [
            "model",
            "stream",
            "tools",
            "tool_choice",
            "user",
            "metadata",
            "instructions",
            "previous_response_id",
            "prompt_cache_key",
            "store",
            "safety_identifier",
            "text",
            "include",
            "x",
        ]
    ),
    json_values,
    max_size=5,
)


@FUZZ
@given(extra=rfields, inp=st.one_of(json_values, st.lists(items, max_size=5)), with_tools=st.booleans())
def test_held_fuzzed_responses_bodies(fuzz_keels: list[ServerThread], extra: dict[str, Any], inp: Any, with_tools: bool) -> None:
    body: dict[str, Any] = {"model": "m", "input": inp, **extra}
    if with_tools:
        body["tools"] = rtools()
    for keel in fuzz_keels:
        r = httpx.post(keel.url + "/v1/responses", content=json.dumps(body).encode(), headers=FUZZ_AUTH, timeout=10)
        assert not own_failure(r), (body, r.content[:300])


blocks = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "tool_use", "tool_result", "image", "thinking", "x"])},
    optional={
        "text": json_values,
        "id": json_values,
        "name": st.one_of(json_values, st.just("tool_search")),
        "input": json_values,
        "tool_use_id": json_values,
        "content": json_values,
        "cache_control": json_values,
    },
)
mmsgs = st.lists(
    st.one_of(
        json_values,
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "assistant", "system", 3])},
            optional={"content": st.one_of(json_values, st.lists(st.one_of(blocks, json_values), max_size=3))},
        ),
    ),
    max_size=4,
)
mfields = st.dictionaries(
    st.sampled_from(["model", "stream", "tools", "tool_choice", "metadata", "system", "max_tokens", "thinking", "x"]),
    json_values,
    max_size=5,
)


@FUZZ
@given(extra=mfields, history=mmsgs, with_tools=st.booleans())
def test_held_fuzzed_messages_bodies(fuzz_keels: list[ServerThread], extra: dict[str, Any], history: list[Any], with_tools: bool) -> None:
    body: dict[str, Any] = {"model": "c", "max_tokens": 10, "messages": [*history, {"role": "user", "content": "hi"}], **extra}
    if with_tools:
        body["tools"] = mtools()
    for keel in fuzz_keels:
        r = httpx.post(keel.url + "/v1/messages", content=json.dumps(body).encode(), headers=FUZZ_AUTH, timeout=10)
        assert not own_failure(r), (body, r.content[:300])


def sse(kind: str | None, payload: Any) -> bytes:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return (f"event: {kind}\n".encode() if kind else b"") + b"data: " + data + b"\n\n"


fc_item = st.fixed_dictionaries(
    {"type": st.sampled_from(["function_call", "message", "reasoning", "x"])},
    optional={
        "name": st.one_of(st.sampled_from(["tool_search", "close_ticket"]), json_values),
        "call_id": st.one_of(st.text(max_size=4), json_values),
        "arguments": st.one_of(st.just('{"query":"archive"}'), st.just('{"names":["archive_ticket"]}'), json_values, st.text(max_size=10)),
        "id": st.text(max_size=4),
        "content": json_values,
    },
)
r_events = st.lists(
    st.one_of(
        st.builds(
            lambda i, it: sse("response.output_item.added", {"type": "response.output_item.added", "output_index": i, "item": it}),
            st.one_of(st.integers(-2, 3), json_values),
            fc_item,
        ),
        st.builds(
            lambda i, it: sse("response.output_item.done", {"type": "response.output_item.done", "output_index": i, "item": it}),
            st.one_of(st.integers(-2, 3), json_values),
            fc_item,
        ),
        st.builds(
            lambda i, d: sse("response.output_text.delta", {"type": "response.output_text.delta", "output_index": i, "delta": d}),
            st.integers(0, 3),
            json_values,
        ),
        st.builds(
            lambda r: sse("response.created", {"type": "response.created", "response": r}),
            st.one_of(json_values, st.fixed_dictionaries({"id": st.text(max_size=4)})),
        ),
        st.builds(
            lambda r: sse("response.completed", {"type": "response.completed", "response": r}),
            st.one_of(
                json_values,
                st.fixed_dictionaries(
                    {"id": st.one_of(st.text(max_size=4), json_values)},
                    optional={"output": st.one_of(json_values, st.lists(fc_item, max_size=2)), "usage": json_values},
                ),
            ),
        ),
        st.builds(lambda p: sse(None, p), json_values),
        st.binary(max_size=20),
        st.just(b'event: error\ndata: {"type":"error"}\n\n'),
    ),
    max_size=8,
)
r_json = st.fixed_dictionaries(
    {"id": st.text(max_size=3), "object": st.just("response")},
    optional={"output": st.one_of(json_values, st.lists(fc_item, max_size=3)), "usage": json_values},
).map(lambda v: json.dumps(v).encode())

block = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "tool_use", "thinking", "x"])},
    optional={
        "name": st.one_of(st.just("tool_search"), st.just("close_ticket"), json_values),
        "id": st.one_of(st.text(max_size=3), json_values),
        "input": json_values,
        "text": json_values,
        "thinking": json_values,
    },
)
m_events = st.lists(
    st.one_of(
        st.builds(
            lambda m: sse("message_start", {"type": "message_start", "message": m}),
            st.one_of(json_values, st.fixed_dictionaries({"id": st.text(max_size=3)}, optional={"usage": json_values})),
        ),
        st.builds(
            lambda i, b: sse("content_block_start", {"type": "content_block_start", "index": i, "content_block": b}),
            st.one_of(st.integers(-1, 3), json_values),
            block,
        ),
        st.builds(
            lambda i, d: sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d}),
            st.integers(-1, 3),
            st.one_of(
                json_values,
                st.fixed_dictionaries(
                    {"type": st.sampled_from(["text_delta", "input_json_delta", "thinking_delta", "signature_delta"])},
                    optional={
                        "text": json_values,
                        "partial_json": st.one_of(st.just('{"query": "arch'), json_values),
                        "thinking": json_values,
                        "signature": json_values,
                    },
                ),
            ),
        ),
        st.builds(
            lambda i: sse("content_block_stop", {"type": "content_block_stop", "index": i}), st.one_of(st.integers(-1, 3), json_values)
        ),
        st.builds(lambda d, u: sse("message_delta", {"type": "message_delta", "delta": d, "usage": u}), json_values, json_values),
        st.just(sse("message_stop", {"type": "message_stop"})),
        st.builds(lambda p: sse(None, p), json_values),
        st.binary(max_size=20),
    ),
    max_size=9,
)
m_json = st.fixed_dictionaries(
    {"id": st.text(max_size=3), "type": st.just("message"), "role": st.just("assistant")},
    optional={"content": st.one_of(json_values, st.lists(block, max_size=3)), "usage": json_values, "stop_reason": json_values},
).map(lambda v: json.dumps(v).encode())


@pytest.fixture
def scripted_keel(scripted: Any, start_keel: Any) -> tuple[Any, ServerThread]:  # noqa: F811
    return scripted[0], start_keel(keel_config(tenant(scripted[1].url + "/v1", **FUZZ_ON)))


@FUZZ
@given(
    shape=st.sampled_from(["responses", "messages"]),
    stream=st.booleans(),
    as_sse=st.booleans(),
    status=st.sampled_from([200, 200, 200, 429]),
    data=st.data(),
)
def test_held_fuzzed_replies_on_responses_and_messages(
    scripted_keel: Any, shape: str, stream: bool, as_sse: bool, status: int, data: Any
) -> None:
    upstream, keel = scripted_keel
    if as_sse:
        upstream.reply = (status, b"text/event-stream", data.draw(r_events if shape == "responses" else m_events))
    else:
        upstream.reply = (status, b"application/json", [data.draw(r_json if shape == "responses" else m_json)])
    if shape == "responses":
        body = {"model": "m", "stream": stream, "tools": rtools(), "input": "close the ticket please"}
    else:
        body = {
            "model": "c",
            "max_tokens": 9,
            "stream": stream,
            "tools": mtools(),
            "messages": [{"role": "user", "content": "close the ticket please"}],
        }
    r = httpx.post(keel.url + f"/v1/{shape}", json=body, headers=FUZZ_AUTH, timeout=10)
    assert not own_failure(r), r.content[:300]
    if r.status_code == 200 and r.headers.get("content-type", "").startswith("text/event-stream") and stream and as_sse:
        ends = (b"response.completed", b"response.incomplete", b"response.failed", b"message_stop", b'"error"')
        assert any(e in r.content for e in ends), r.content[-300:]  # a whole answer, or the shape's error
