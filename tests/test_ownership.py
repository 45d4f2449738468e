"""Stored objects belong to whom they were shown (issue 20, finding 2), through HTTP against real
servers: `proxy/owners.py` (who owns an id), `proxy/stored.py` (which requests reach stored objects).

The provider is the stand-in for the API routes, behind a recorder that also answers the stored-object
routes the stand-in lacks (retrieve, delete, list, create a conversation or a file)."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import orjson
import pytest
from conftest import ServerThread, eventually, keel_config
from recorder import lifespan, read_body

from proxy.owners import RETRIES
from proxy.standin.app import StandIn, create_standin_app
from proxy.stores.sqlite import SqliteStore
from proxy.testing import FakeClock, FaultyStore
from proxy.tokens import TokenCounter

KEYS = {"alice": "sk-keel-alice", "bob": "sk-keel-bob", "other": "sk-keel-other", "solo": "sk-keel-solo"}


def auth(who: str, **extra: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[who]}", **extra}


def digest(who: str) -> str:
    return "sha256:" + hashlib.sha256(KEYS[who].encode()).hexdigest()


@dataclass
class Provider:
    """The stand-in for the three API routes; every other path is recorded and answered as a
    provider would: a new object's id for a create, an item list for `…/items`, else a plain object."""

    standin: Any
    seen: list[tuple[str, str]] = field(default_factory=list)  # (method, raw path) of every request

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await lifespan(scope, receive, send):
            return
        raw_path = (scope.get("raw_path") or scope["path"].encode()).decode()
        self.seen.append((scope["method"], raw_path))
        if scope["method"] == "POST" and scope["path"] in ("/v1/responses", "/v1/chat/completions"):
            await self.standin(scope, receive, send)
            return
        await read_body(receive)
        parts = [p for p in scope["path"].split("/") if p][1:]
        if parts in (["conversations"], ["files"]) and scope["method"] == "POST":
            reply: dict[str, Any] = {"id": f"{parts[0][:4]}_{len(self.seen)}", "object": parts[0]}
        elif parts[-1:] in (["items"], ["input_items"]):
            reply = {"object": "list", "data": [{"id": f"msg_listed{len(self.seen)}", "type": "message"}]}
        else:
            reply = {"id": parts[-1] if parts else "", "object": "thing"}
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": orjson.dumps(reply)})


@pytest.fixture
def provider(token_counter: TokenCounter) -> Iterator[tuple[Provider, ServerThread]]:
    upstream = Provider(create_standin_app(standin=StandIn(tokens=token_counter)))
    with ServerThread(upstream) as server:
        yield upstream, server


def tenants(url: str) -> list[dict[str, Any]]:
    """`app` (alice's and bob's user keys) and `other` share one provider key; `solo` has its own."""
    upstream = {"base_url": url + "/v1", "api_key_env": "KEEL_TEST_UPSTREAM_KEY"}
    return [
        {"id": "app", "auth": {"user_keys": [{"key": digest("alice"), "user": "alice"},
                                             {"key": digest("bob"), "user": "bob"}]}, "upstream": upstream},
        {"id": "other", "auth": {"keys": [digest("other")]}, "upstream": upstream},
        {"id": "solo", "auth": {"keys": [digest("solo")]},
         "upstream": {"base_url": url + "/v1", "api_key_env": "KEEL_TEST_SOLO_KEY"}},
    ]


@pytest.fixture
def keel(provider: tuple[Provider, ServerThread], start_keel: Callable[..., ServerThread],
         monkeypatch: pytest.MonkeyPatch) -> ServerThread:
    monkeypatch.setenv("KEEL_TEST_SOLO_KEY", "sk-solo-provider")
    return start_keel(keel_config(*tenants(provider[1].url)))


def create_response(keel: ServerThread, who: str, stream: bool = False, **extra: Any) -> Any:
    client = openai.OpenAI(base_url=keel.url + "/v1", api_key=KEYS[who], max_retries=0)
    if stream:
        with client.responses.stream(model="m", input="my PIN is 4711", **extra) as events:
            return events.get_final_response()
    return client.responses.create(model="m", input="my PIN is 4711", **extra)


def forwarded(provider: Provider, since: int, needle: str) -> list[tuple[str, str]]:
    return [seen for seen in provider.seen[since:] if needle in seen[1] or needle in seen[1].lower()]


def raw_request(port: int, method: str, path: str, who: str) -> int:
    """A request with its path exactly as written (no client normalizes it); the status line's code."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEYS[who]}\r\n"
                     "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    return int(reply.split(b" ", 2)[1])


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_another_keys_response_is_not_found(keel: ServerThread, provider: tuple[Provider, ServerThread],
                                            stream: bool) -> None:
    """Bob's user key used to GET and DELETE alice's stored response and its input items: these went out
    on the passthrough route with the tenant's provider key. Now every route under a response id is
    the owner's: another key of the account gets a 404 in OpenAI's shape, and nothing is sent."""
    upstream, _ = provider
    theirs = create_response(keel, "alice", stream).id
    routes = [("GET", f"/v1/responses/{theirs}"), ("GET", f"/v1/responses/{theirs}/input_items"),
              ("POST", f"/v1/responses/{theirs}/cancel"), ("DELETE", f"/v1/responses/{theirs}")]
    for who in ("bob", "other"):
        before = len(upstream.seen)
        for method, path in routes:
            reply = httpx.request(method, keel.url + path, headers=auth(who))
            assert reply.status_code == 404 and reply.json()["error"]["type"] == "invalid_request_error", reply.text
        assert forwarded(upstream, before, theirs) == []
    before = len(upstream.seen)
    for method, path in routes:
        assert httpx.request(method, keel.url + path, headers=auth("alice")).status_code == 200
    assert len(forwarded(upstream, before, theirs)) == len(routes)


@pytest.mark.parametrize("spelling", ["/v1/Responses/{id}", "/v1//responses/{id}", "/v1/responses//{id}/input_items",
                                      "/v1/RESPONSES/{id}/INPUT_ITEMS", "/v1/%72esponses/{id}",
                                      "/v1/responses%2F{id}", "/v1/responses/{pct}", "/v1/responses/{id}/"])
def test_every_spelling_of_a_stored_path_is_checked(keel: ServerThread, provider: tuple[Provider, ServerThread],
                                                    spelling: str) -> None:
    """A path a provider may read as alice's response (letter case, doubled slashes, percent-encoding)
    is checked like the plain one."""
    upstream, _ = provider
    theirs = create_response(keel, "alice").id
    path = spelling.format(id=theirs, pct="".join(f"%{b:02X}" for b in theirs.encode()))
    before = len(upstream.seen)
    assert raw_request(keel.port, "GET", path, "bob") in (403, 404)
    assert upstream.seen[before:] == []


@pytest.mark.parametrize("method,path", [("GET", "/v1/chat/completions"), ("GET", "/v1/files"), ("GET", "/v1/responses"),
                                         ("GET", "/v1/Chat//Completions"), ("GET", "/v1/conversations"),
                                         ("POST", "/v1/realtime/client_secrets"), ("GET", "/v1/organization/projects")])
def test_listings_and_unknown_routes_are_refused_on_a_shared_account(keel: ServerThread, provider: tuple[Provider, ServerThread],
                                                                     method: str, path: str) -> None:
    """A listing of stored objects would show every key's (`GET /v1/chat/completions` listed alice's
    stored completions to bob); a route Keel does not know to be stateless may reach stored objects:
    both are a 403 for keys that share their provider account. The account's one key keeps them."""
    upstream, _ = provider
    before = len(upstream.seen)
    reply = httpx.request(method, keel.url + path, headers=auth("bob"))
    assert reply.status_code == 403 and reply.json()["error"]["type"] == "permission_error"
    assert upstream.seen[before:] == []
    assert httpx.request(method, keel.url + path, headers=auth("solo")).status_code == 200
    assert len(upstream.seen) == before + 1


def test_stateless_routes_stay_open(keel: ServerThread, provider: tuple[Provider, ServerThread]) -> None:
    """Models, embeddings and the like store nothing: every key reaches them."""
    for method, path in (("GET", "/v1/models"), ("GET", "/v1/models/gpt-4o"), ("POST", "/v1/embeddings"),
                         ("POST", "/v1/moderations"), ("POST", "/v1/audio/speech")):
        assert httpx.request(method, keel.url + path, headers=auth("bob"), json={}).status_code == 200, path


@pytest.mark.parametrize("body", [
    {"previous_response_id": "resp_of_alice"},
    {"conversation": "conv_of_alice"},
    {"conversation": {"id": "conv_of_alice"}},
    {"input": [{"type": "item_reference", "id": "msg_of_alice"}]},
    {"input": [{"id": "msg_of_alice"}]},
    {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-of-alice"}]}]},
    {"input": "hi", "tools": [{"type": "file_search", "vector_store_ids": ["vs_of_alice"]}]},
], ids=["previous", "conversation", "conversation-object", "item_reference", "bare-reference", "file", "vector-store"])
def test_ids_keel_cannot_prove_are_refused_in_the_body(keel: ServerThread, provider: tuple[Provider, ServerThread],
                                                       body: dict[str, Any]) -> None:
    """Only `previous_response_id` was checked, and an id Keel never recorded was let through: the
    `conversation` parameter, `item_reference` inputs and file references reached the provider with the
    tenant's key. A key of a shared account gets a 403 naming the field; the account's one key, whose
    ids these may be, is forwarded."""
    upstream, _ = provider
    request = {"model": "m", "input": "what did I say?", **body}
    before = len(upstream.seen)
    reply = httpx.post(keel.url + "/v1/responses", json=request, headers=auth("bob"))
    assert reply.status_code == 403 and reply.json()["error"]["param"] in ("previous_response_id", "conversation",
                                                                           "input", "tools")
    assert upstream.seen[before:] == []
    assert httpx.post(keel.url + "/v1/responses", json=request, headers=auth("solo")).status_code == 200


def test_chat_messages_and_token_counts_are_checked_too(keel: ServerThread, provider: tuple[Provider, ServerThread]) -> None:
    """A stored chat completion's messages, a file in a chat message and a token count over someone's
    conversation are refused like the rest."""
    upstream, _ = provider
    before = len(upstream.seen)
    assert httpx.get(keel.url + "/v1/chat/completions/chatcmpl-x/messages", headers=auth("bob")).status_code == 404
    file_part = {"role": "user", "content": [{"type": "file", "file": {"file_id": "file-of-alice"}}]}
    chat = httpx.post(keel.url + "/v1/chat/completions", json={"model": "m", "messages": [file_part]}, headers=auth("bob"))
    count = httpx.post(keel.url + "/v1/responses/input_tokens", json={"model": "m", "conversation": "conv_x"},
                       headers=auth("bob"))
    assert chat.status_code == count.status_code == 403 and upstream.seen[before:] == []


def test_objects_created_through_keel_are_their_creators(keel: ServerThread, provider: tuple[Provider, ServerThread]) -> None:
    """What alice creates or is shown through Keel is hers: a conversation, its listed items, her
    response's output items, a stored chat completion, a file. She uses them; bob gets 404 or 403."""
    conversation = httpx.post(keel.url + "/v1/conversations", json={}, headers=auth("alice")).json()["id"]
    assert httpx.get(keel.url + f"/v1/conversations/{conversation}", headers=auth("alice")).status_code == 200
    assert httpx.get(keel.url + f"/v1/conversations/{conversation}", headers=auth("bob")).status_code == 404
    listed = httpx.get(keel.url + f"/v1/conversations/{conversation}/items", headers=auth("alice")).json()["data"][0]["id"]
    output = create_response(keel, "alice", stream=True).output[0].id
    stored = httpx.post(keel.url + "/v1/chat/completions", headers=auth("alice"),
                        json={"model": "m", "store": True, "messages": [{"role": "user", "content": "hi"}]}).json()["id"]
    uploaded = httpx.post(keel.url + "/v1/files", files={"file": ("a.jsonl", b"{}")}, data={"purpose": "batch"},
                          headers=auth("alice")).json()["id"]
    for body in ({"conversation": conversation}, {"input": [{"type": "item_reference", "id": listed}]},
                 {"input": [{"type": "item_reference", "id": output}]}):
        request = {"model": "m", "input": "go on", **body}
        assert httpx.post(keel.url + "/v1/responses", json=request, headers=auth("alice")).status_code == 200, body
        assert httpx.post(keel.url + "/v1/responses", json=request, headers=auth("bob")).status_code == 403, body
    for path in (f"/v1/chat/completions/{stored}", f"/v1/files/{uploaded}/content"):
        assert httpx.get(keel.url + path, headers=auth("alice")).status_code == 200, path
        assert httpx.get(keel.url + path, headers=auth("bob")).status_code == 404, path


def test_objects_named_in_a_passthrough_body_are_checked(keel: ServerThread, provider: tuple[Provider, ServerThread]) -> None:
    """A batch over someone's input file, or someone's file added to a vector store, would hand its
    contents to another key: a JSON body on a stored-object route names only the caller's objects."""
    upstream, _ = provider
    mine = httpx.post(keel.url + "/v1/files", files={"file": ("a.jsonl", b"{}")}, data={"purpose": "batch"},
                      headers=auth("alice")).json()["id"]
    batch = {"input_file_id": mine, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    assert httpx.post(keel.url + "/v1/batches", json=batch, headers=auth("alice")).status_code == 200
    before = len(upstream.seen)
    assert httpx.post(keel.url + "/v1/batches", json=batch, headers=auth("bob")).status_code == 403
    assert httpx.post(keel.url + "/v1/vector_stores", json={"file_ids": [mine]}, headers=auth("bob")).status_code == 403
    assert upstream.seen[before:] == []


def test_tenants_on_one_provider_key_do_not_continue_each_others_responses(keel: ServerThread) -> None:
    """Owners were recorded per tenant: tenant `other`, on the same provider key, continued alice's
    response. They are recorded per provider account now."""
    theirs = create_response(keel, "alice").id
    reply = httpx.post(keel.url + "/v1/responses", headers=auth("other"),
                       json={"model": "m", "input": "go on", "previous_response_id": theirs})
    assert reply.status_code == 403


def test_an_accounts_one_key_is_checked_only_between_its_users(keel: ServerThread) -> None:
    """The one key of a provider account reaches its unknown ids as before; a response it made for one
    end user is refused to another it names, and open when it names none (it acts for them all)."""
    assert httpx.get(keel.url + "/v1/responses/resp_never_seen", headers=auth("solo")).status_code == 200
    mine = create_response(keel, "solo", user="carol").id
    for user, status in (("carol", 200), ("dave", 403), (None, 200)):
        body = {"model": "m", "input": "go on", "previous_response_id": mine, **({"user": user} if user else {})}
        assert httpx.post(keel.url + "/v1/responses", json=body, headers=auth("solo")).status_code == status, user
    assert httpx.get(keel.url + f"/v1/responses/{mine}", headers=auth("solo", **{"x-keel-user": "dave"})).status_code == 404


def test_an_owner_record_that_could_not_be_written_never_opens_the_id(
        provider: tuple[Provider, ServerThread], start_keel: Callable[..., ServerThread], tmp_path: Any) -> None:
    """A record whose write failed left the id open to every caller of the tenant. Now the id is closed
    to other keys (a 404, or a 503 while the store cannot answer) and the write is retried in the
    background until the owner has it (the wait between retries on a fake clock the test moves)."""
    store = FaultyStore(SqliteStore(str(tmp_path / "k.db")), mode="ok")
    clock = FakeClock()
    keel = start_keel(keel_config(*tenants(provider[1].url)), store=store, clock=clock)
    store.mode = "raise"
    theirs = create_response(keel, "alice").id  # delivered, unrecorded
    assert eventually(lambda: clock.sleeping > 0), "a retry waits (one per unrecorded id)"
    bob = httpx.get(keel.url + f"/v1/responses/{theirs}", headers=auth("bob"))
    assert bob.status_code == 503 and bob.json()["error"]["code"] == "store_unavailable"
    clock.advance(RETRIES[0])  # the first retries, while the store still fails: they wait again
    assert eventually(lambda: clock.sleeping > 0)
    store.mode = "ok"

    def recorded() -> bool:
        if clock.sleeping and keel.app.state.keel.store.healthy:  # the breaker closed: the next retry
            clock.advance(RETRIES[-1])
        return httpx.get(keel.url + f"/v1/responses/{theirs}", headers=auth("alice")).status_code == 200

    assert eventually(recorded, seconds=10)
    assert httpx.get(keel.url + f"/v1/responses/{theirs}", headers=auth("bob")).status_code == 404
