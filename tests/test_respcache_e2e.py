"""The exact response cache through HTTP, with the real `openai` and `anthropic` SDKs in front of
Keel and the stand-in: a repeated deterministic request is answered from Keel's cache on every
shape, JSON and SSE, in either form whatever the original's; another caller never gets it; what
is never cached is not; the client's Cache-Control is honoured; concurrent identical requests
share one upstream call; a purge forgets; hits and dollars saved are counted."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
import yaml
from conftest import KEY, KEY_DIGEST, REDIS_URL, ServerThread, eventually, keel_config, redis_or_skip, tenant

from proxy.cli import main
from proxy.config import parse_config
from proxy.defaults import create_upstream
from proxy.testing import RecordingUpstream

H = "x-keel-response-cache"
SHAPES = ["chat", "responses", "messages"]
SECOND, OTHER, ADMIN = "sk-keel-second", "sk-keel-other-tenant", "sk-keel-admin"
ON = {"cache": {"responses": "on"}}


def digest(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


@dataclass
class Reply:
    text: str
    header: str
    age: str | None
    usage: tuple[int, int]  # input, output tokens as the client reads them


def ask(keel: ServerThread, shape: str, stream: bool, text: str = "what is an exact cache?", key: str = KEY,
        headers: dict[str, str] | None = None, deterministic: bool = True, **extra: Any) -> Reply:
    """One request through the shape's SDK; a stream is checked for being well formed as it is read."""
    if shape == "messages":
        client = anthropic.Anthropic(base_url=keel.url, api_key=key, max_retries=0, default_headers=headers)
        body = {"temperature": 0} if deterministic else {}  # this anthropic SDK has no temperature argument
        raw = client.messages.with_raw_response.create(
            model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": text}], stream=stream,
            extra_body={**body, **extra})
        if not stream:
            message = raw.parse()
            return Reply(message.content[0].text, raw.headers[H], raw.headers.get("age"),
                         (message.usage.input_tokens, message.usage.output_tokens))
        events = list(raw.parse())
        kinds = [e.type for e in events]
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
        assert kinds.count("content_block_start") == kinds.count("content_block_stop")
        said = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
        start, delta = events[0].message.usage, events[-2].usage
        return Reply(said, raw.headers[H], raw.headers.get("age"), (start.input_tokens, delta.output_tokens))
    client_ = openai.OpenAI(base_url=keel.url + "/v1", api_key=key, max_retries=0, default_headers=headers)
    sampling = {"temperature": 0} if deterministic else {}
    if shape == "responses":
        raw = client_.responses.with_raw_response.create(model="gpt-4o-mini", input=text, store=False, stream=stream,
                                                         **sampling, extra_body=extra or None)
        if not stream:
            response = raw.parse()
            return Reply(response.output_text, raw.headers[H], raw.headers.get("age"),
                         (response.usage.input_tokens, response.usage.output_tokens))
        events = list(raw.parse())
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        said = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        final = events[-1].response
        assert said == final.output_text
        return Reply(said, raw.headers[H], raw.headers.get("age"), (final.usage.input_tokens, final.usage.output_tokens))
    options = {"stream_options": {"include_usage": True}} if stream else {}
    raw = client_.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": text}], stream=stream, **sampling, **options,
        extra_body=extra or None)
    if not stream:
        completion = raw.parse()
        return Reply(completion.choices[0].message.content or "", raw.headers[H], raw.headers.get("age"),
                     (completion.usage.prompt_tokens, completion.usage.completion_tokens))
    chunks = list(raw.parse())
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return Reply(said, raw.headers[H], raw.headers.get("age"),
                 (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens))


def upstream_calls(standin: ServerThread) -> int:
    return len(standin.app.state.standin.requests)


def landed(keel: ServerThread) -> bool:
    """Every answer in flight is in the store (a request sent earlier would share a flight instead)."""
    return eventually(lambda: len(keel.app.state.keel.answers.flights) == 0)


@pytest.fixture
def keel_cached(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> ServerThread:
    return start_keel(keel_config(tenant(standin.url + "/v1", **ON)))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("first", "second"), [(False, False), (True, True), (False, True), (True, False)],
                         ids=["json-json", "sse-sse", "json-then-sse", "sse-then-json"])
def test_a_repeated_deterministic_request_is_answered_from_the_cache(standin: ServerThread, keel_cached: ServerThread,
                                                                     shape: str, first: bool, second: bool) -> None:
    """The second identical request never reaches the upstream and gets the same answer and usage,
    in the form it asked for: a well-formed stream of its shape, or a whole body."""
    original = ask(keel_cached, shape, first)
    assert landed(keel_cached)
    calls = upstream_calls(standin)
    again = ask(keel_cached, shape, second)
    assert original.header == "miss; reason=absent" and again.header == "hit"
    assert again.age is not None and again.age.isdigit()
    assert upstream_calls(standin) == calls
    assert again.text == original.text and "exact cache" in again.text
    assert again.usage == original.usage


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_replicas_share_their_answers(standin: ServerThread, start_keel: Callable[..., ServerThread], tmp_path: Path,
                                      backend: str) -> None:
    """Two replicas on one store: an answer one kept, the other serves."""
    if backend == "redis":
        asyncio.run(_flushed_redis())
    url = REDIS_URL if backend == "redis" else f"sqlite:///{tmp_path / 'shared.db'}"
    config = keel_config(tenant(standin.url + "/v1", **ON), store={"url": url})
    first, second = start_keel(config), start_keel(config)
    assert ask(first, "responses", False).header.startswith("miss") and landed(first)
    calls = upstream_calls(standin)
    assert ask(second, "responses", True).header == "hit" and upstream_calls(standin) == calls


async def _flushed_redis() -> None:
    store = await redis_or_skip()
    await store.close()


def test_a_hit_carries_its_own_request_id(keel_cached: ServerThread) -> None:
    """Keel answered a hit itself: the request's own id is both its x-request-id and x-keel-request-id."""
    body = {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "which id?"}]}
    url = keel_cached.url + "/v1/chat/completions"
    for n in range(2):
        reply = httpx.post(url, json=body, headers={"authorization": f"Bearer {KEY}", "x-request-id": f"mine-{n}"})
        assert reply.headers["x-keel-request-id"] == f"mine-{n}"
    assert reply.headers[H] == "hit" and reply.headers["x-request-id"] == "mine-1"


def test_another_end_user_credential_or_tenant_never_gets_the_answer(standin: ServerThread,
                                                                     start_keel: Callable[..., ServerThread]) -> None:
    """The key names who asked: the same request from another end user, another key of the tenant
    or another tenant goes upstream; only the same caller gets the cached answer."""
    acme = tenant(standin.url + "/v1", **ON)
    acme["auth"] = {"keys": [f"sha256:{KEY_DIGEST}", digest(SECOND)]}
    other = {**tenant(standin.url + "/v1", **ON), "id": "other", "auth": {"keys": [digest(OTHER)]}}
    keel = start_keel(keel_config(acme, other))
    alice = {"x-keel-user": "alice"}
    assert ask(keel, "chat", False, headers=alice).header.startswith("miss")
    assert ask(keel, "chat", True, headers=alice).header == "hit"
    for key, headers in ((KEY, {"x-keel-user": "bob"}), (KEY, None), (SECOND, alice), (OTHER, alice),
                         (KEY, {**alice, "x-keel-conversation": "another-chat"})):
        calls = upstream_calls(standin)
        assert ask(keel, "chat", False, key=key, headers=headers).header.startswith("miss")
        assert upstream_calls(standin) == calls + 1
    calls = upstream_calls(standin)
    assert ask(keel, "chat", False, user="carol").header.startswith("miss")  # the body's own end user
    assert upstream_calls(standin) == calls + 1


def test_passthrough_credentials_never_share_an_answer(standin: ServerThread,
                                                       start_keel: Callable[..., ServerThread]) -> None:
    """Two callers of a passthrough tenant, each with their own provider key, claiming one user."""
    byo = {"id": "byo", "default": True, "auth": {"passthrough": True}, "upstream": {"base_url": standin.url + "/v1"},
           **ON}
    keel = start_keel(keel_config(byo))
    same = {"x-keel-user": "the-same-user"}
    assert ask(keel, "chat", False, key="sk-provider-alice", headers=same).header.startswith("miss")
    assert ask(keel, "chat", False, key="sk-provider-bob", headers=same).header.startswith("miss")
    assert ask(keel, "chat", False, key="sk-provider-alice", headers=same).header == "hit"


def test_widened_to_the_tenant_an_answer_serves_every_caller(standin: ServerThread,
                                                             start_keel: Callable[..., ServerThread]) -> None:
    """stored.scope: tenant: the credential and X-Keel-User no longer separate entries; another tenant still does."""
    acme = tenant(standin.url + "/v1", cache={"responses": "on", "stored": {"scope": "tenant"}})
    acme["auth"] = {"keys": [f"sha256:{KEY_DIGEST}", digest(SECOND)]}
    other = {**tenant(standin.url + "/v1", **ON), "id": "other", "auth": {"keys": [digest(OTHER)]}}
    keel = start_keel(keel_config(acme, other))
    assert ask(keel, "responses", False, headers={"x-keel-user": "alice"}).header.startswith("miss")
    assert ask(keel, "responses", True, key=SECOND, headers={"x-keel-user": "bob"}).header == "hit"
    assert ask(keel, "responses", False, key=OTHER).header.startswith("miss")


@pytest.mark.parametrize("shape", SHAPES)
def test_a_sampled_request_is_cached_only_under_always(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                                       shape: str) -> None:
    """Without temperature 0 or a seed, `on` passes the request by; `always` caches it."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **ON)))
    calls = upstream_calls(standin)
    for _ in range(2):
        assert ask(keel, shape, False, deterministic=False).header == "bypass; reason=not-deterministic"
    assert upstream_calls(standin) == calls + 2
    if shape == "chat":
        assert ask(keel, shape, False, deterministic=False, seed=7).header.startswith("miss")
        assert ask(keel, shape, True, deterministic=False, seed=7).header == "hit"
    always = start_keel(keel_config(tenant(standin.url + "/v1", cache={"responses": "always"})))
    assert ask(always, shape, False, deterministic=False).header.startswith("miss")
    assert ask(always, shape, False, deterministic=False).header == "hit"


def test_no_store_bypasses_and_no_cache_refreshes(standin: ServerThread, keel_cached: ServerThread) -> None:
    """no-store: neither looked up nor kept; no-cache: goes upstream and keeps the fresh answer;
    max-age: an older answer is not served; x-keel-cache-ttl: kept that long."""
    calls = upstream_calls(standin)
    assert ask(keel_cached, "chat", False, headers={"cache-control": "no-store"}).header == "bypass; reason=no-store"
    assert ask(keel_cached, "chat", False).header == "miss; reason=absent"  # no-store kept nothing
    assert ask(keel_cached, "chat", False, headers={"cache-control": "no-store"}).header.startswith("bypass")
    assert ask(keel_cached, "chat", False, headers={"cache-control": "no-cache"}).header == "refresh; reason=no-cache"
    assert upstream_calls(standin) == calls + 4
    assert ask(keel_cached, "chat", False).header == "hit"
    time.sleep(1.1)
    assert ask(keel_cached, "chat", False, headers={"cache-control": "max-age=1"}).header == "miss; reason=max-age"
    short = {"x-keel-cache-ttl": "1"}
    assert ask(keel_cached, "messages", False, headers=short).header.startswith("miss")
    assert ask(keel_cached, "messages", False).header == "hit"
    assert "x-keel-cache-ttl" not in standin.app.state.standin.headers[-1]  # Keel's header, not the upstream's
    time.sleep(1.2)
    assert ask(keel_cached, "messages", False).header == "miss; reason=absent"


def test_what_the_provider_holds_is_never_cached(standin: ServerThread, keel_cached: ServerThread) -> None:
    """A Responses request the provider stores (store true, its default) or that continues upstream state."""
    client = openai.OpenAI(base_url=keel_cached.url + "/v1", api_key=KEY, max_retries=0)
    calls = upstream_calls(standin)
    for _ in range(2):
        raw = client.responses.with_raw_response.create(model="gpt-4o-mini", input="hi there", temperature=0)
        assert raw.headers[H] == "bypass; reason=store"
    first = raw.parse().id
    for _ in range(2):
        raw = client.responses.with_raw_response.create(model="gpt-4o-mini", input="and then?", temperature=0,
                                                        store=False, previous_response_id=first)
        assert raw.headers[H] == "bypass; reason=previous-response-id"
    assert upstream_calls(standin) == calls + 4
    assert ask(keel_cached, "chat", False, store=True).header == "bypass; reason=store"  # a stored completion


@pytest.mark.parametrize("shape", SHAPES)
def test_errors_and_cut_streams_are_not_kept(standin: ServerThread, keel_cached: ServerThread, shape: str) -> None:
    """An upstream error and a stream cut before its end marker are relayed as they are, never kept."""
    with pytest.raises((openai.APIStatusError, anthropic.APIStatusError)):
        ask(keel_cached, shape, False, text="fail please [[error 503]]")
    with pytest.raises((openai.APIStatusError, anthropic.APIStatusError)):
        ask(keel_cached, shape, False, text="fail please [[error 503]]")
    body = {"chat": {"model": "m", "messages": [{"role": "user", "content": "cut me off [[cut]] one two three"}]},
            "responses": {"model": "m", "input": "cut me off [[cut]] one two three", "store": False},
            "messages": {"model": "c", "max_tokens": 20,
                         "messages": [{"role": "user", "content": "cut me off [[cut]] one two three"}]}}[shape]
    calls = upstream_calls(standin)
    for _ in range(2):
        reply = httpx.post(f"{keel_cached.url}/v1/{shape.replace('chat', 'chat/completions')}",
                           json={**body, "stream": True, "temperature": 0}, headers={"authorization": f"Bearer {KEY}"})
        assert reply.headers[H].startswith("miss") and b'"error"' in reply.content
    assert upstream_calls(standin) == calls + 2


def test_identical_requests_in_flight_share_one_upstream_call(standin: ServerThread,
                                                              keel_cached: ServerThread) -> None:
    """Six identical requests, streamed and not, while the first is still being answered: one
    upstream call, six whole answers, each in its own form."""
    text = "share this answer [[sleep 1.5]]"
    calls = upstream_calls(standin)
    with ThreadPoolExecutor(6) as pool:
        leader = pool.submit(ask, keel_cached, "chat", True, text)
        time.sleep(0.3)
        followers = [pool.submit(ask, keel_cached, "chat", stream, text) for stream in (True, False, True, False, True)]
        replies = [leader.result(), *(f.result() for f in followers)]
    assert upstream_calls(standin) == calls + 1
    assert replies[0].header.startswith("miss")
    # coalesced, or (a follower slower than the upstream on a loaded machine) served from the stored answer
    assert all(r.header in ("hit; reason=coalesced", "hit") or r.header.startswith("hit;") for r in replies[1:])
    assert sum(r.header == "hit; reason=coalesced" for r in replies[1:]) >= 1
    assert len({r.text for r in replies}) == 1 and len({r.usage for r in replies}) == 1


@pytest.mark.parametrize("leaving", ["follower", "leader"])
def test_one_client_leaving_never_cuts_another(standin: ServerThread, keel_cached: ServerThread, leaving: str) -> None:
    """Of two clients of one flight, the one that disconnects mid-stream does so alone: the other
    gets the whole stream, and the answer is kept."""
    body = {"model": "m", "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "[[drip 0.05]] " + "slowly " * 20}]}
    url, auth = keel_cached.url + "/v1/chat/completions", {"authorization": f"Bearer {KEY}"}
    calls = upstream_calls(standin)
    first, second = httpx.Client(timeout=30), httpx.Client(timeout=30)
    with first.stream("POST", url, json=body, headers=auth) as a:
        time.sleep(0.2)
        with second.stream("POST", url, json=body, headers=auth) as b:
            assert b.headers[H] == "hit; reason=coalesced"
            stays, goes = (a, b) if leaving == "follower" else (b, a)
            next(goes.iter_raw())
            goes.close()
            whole = b"".join(stays.iter_raw())
    first.close()
    second.close()
    assert whole.rstrip().endswith(b"data: [DONE]") and b'"error"' not in whole
    assert upstream_calls(standin) == calls + 1
    assert eventually(lambda: httpx.post(url, json={**body, "stream": False}, headers=auth).headers[H] == "hit")


def test_when_every_client_leaves_the_answer_is_let_go(standin: ServerThread, keel_cached: ServerThread) -> None:
    """A lone client that leaves mid-stream closes the upstream call as without the cache; the
    half answer is not kept, and the next identical request gets a whole one of its own."""
    body = {"model": "m", "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "[[drip 0.05]] " + "slowly " * 20}]}
    url, auth = keel_cached.url + "/v1/chat/completions", {"authorization": f"Bearer {KEY}"}
    calls = upstream_calls(standin)
    with httpx.Client(timeout=30) as client, client.stream("POST", url, json=body, headers=auth) as gone:
        next(gone.iter_raw())
    time.sleep(0.3)
    again = httpx.post(url, json=body, headers=auth, timeout=30)
    assert again.headers[H] == "miss; reason=absent" and again.content.rstrip().endswith(b"data: [DONE]")
    assert upstream_calls(standin) == calls + 2


def test_with_features_on_a_hit_is_the_answer_the_client_was_shown(standin: ServerThread,
                                                                   start_keel: Callable[..., ServerThread]) -> None:
    """Tools deferred and a tool_search round answered inside the turn: the cached answer is the
    client's (its own tool call, no tool_search), and a hit serves it without planning or an upstream call."""
    from conftest import small_catalog

    from proxy.standin.script import hidden_call

    features = {"tools": {"enabled": True}, "context": {"stable": True}, "cache": {"responses": "on"}}
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **features)))
    client = openai.OpenAI(base_url=keel.url + "/v1", api_key=KEY, max_retries=0)
    request = {"model": "gpt-4o-mini", "temperature": 0, "tools": small_catalog(),
               "messages": [{"role": "user", "content": "tidy up " + hidden_call("archive_ticket", '{"id": "7"}')}]}
    first = client.chat.completions.with_raw_response.create(**request)
    calls = upstream_calls(standin)
    again = client.chat.completions.with_raw_response.create(**request, stream=True)
    chunks = list(again.parse())
    assert again.headers[H] == "hit" and upstream_calls(standin) == calls
    shown = first.parse().choices[0].message.tool_calls
    assert shown is not None and [c.function.name for c in shown] == ["archive_ticket"]
    streamed = [d.function.name for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert streamed == ["archive_ticket"]


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_a_partly_cached_embeddings_batch_sends_only_the_missing_items(standin: ServerThread,
                                                                       start_keel: Callable[..., ServerThread],
                                                                       encoding: str) -> None:
    """Cached items are not sent again; every vector comes back at its index, in the client's
    order, and the usage counts what was actually sent."""
    config = keel_config(tenant(standin.url + "/v1", cache={"embeddings": "on"}))
    recording = RecordingUpstream(create_upstream(config.server))
    keel = start_keel(config, upstream=recording)
    direct = openai.OpenAI(base_url=standin.url + "/v1", api_key="x", max_retries=0)
    client = openai.OpenAI(base_url=keel.url + "/v1", api_key=KEY, max_retries=0)
    batch = ["beta", "gamma", "alpha", "delta words", "gamma"]
    expected = direct.embeddings.create(model="text-embedding-3-small", input=batch, encoding_format=encoding)
    state = standin.app.state.standin
    before = state.embedding_inputs
    first = client.embeddings.with_raw_response.create(model="text-embedding-3-small", input=["alpha", "beta"],
                                                       encoding_format=encoding)
    assert first.headers[H] == "miss; cached=0/2" and state.embedding_inputs == before + 2
    raw = client.embeddings.with_raw_response.create(model="text-embedding-3-small", input=batch,
                                                     encoding_format=encoding)
    assert raw.headers[H] == "miss; cached=2/5"
    assert state.embedding_inputs == before + 4 and orjson.loads(recording.sent[-1].content or b"")["input"] == [
        "gamma", "delta words"]
    got = raw.parse()
    assert [d.index for d in got.data] == [0, 1, 2, 3, 4]
    assert [d.embedding for d in got.data] == [d.embedding for d in expected.data]
    sent = direct.embeddings.create(model="text-embedding-3-small", input=["gamma", "delta words"])
    assert got.usage.prompt_tokens == sent.usage.prompt_tokens
    again = client.embeddings.with_raw_response.create(model="text-embedding-3-small", input=batch,
                                                       encoding_format=encoding)
    assert again.headers[H] == "hit; cached=5/5" and again.parse().usage.prompt_tokens == 0
    assert [d.embedding for d in again.parse().data] == [d.embedding for d in expected.data]
    other = client.embeddings.with_raw_response.create(model="text-embedding-3-small", input=batch, dimensions=8,
                                                       encoding_format=encoding)
    assert other.headers[H] == "miss; cached=0/5"  # another size is another vector


def test_a_purge_forgets_the_tenants_answers(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """DELETE /v1/keel/cache with the tenant's admin key: nothing it kept is served again."""
    acme = tenant(standin.url + "/v1", cache={"responses": "on", "embeddings": "on"})
    acme["auth"] = {"keys": [f"sha256:{KEY_DIGEST}"], "admin_keys": [digest(ADMIN)]}
    keel = start_keel(keel_config(acme))
    ask(keel, "chat", False)
    assert ask(keel, "chat", False).header == "hit"
    refused = httpx.delete(keel.url + "/v1/keel/cache", headers={"authorization": f"Bearer {KEY}"})
    assert refused.status_code == 403
    purged = httpx.delete(keel.url + "/v1/keel/cache", headers={"authorization": f"Bearer {ADMIN}"})
    assert purged.status_code == 200 and purged.json() == {"tenant": "acme", "purged": 1}
    assert ask(keel, "chat", False).header == "miss; reason=absent"


def test_hits_and_dollars_saved_are_counted(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """/metrics counts hits, bytes and dollars saved; the savings page's figures and `keel report`
    show them as a cause of their own."""
    acme = tenant(standin.url + "/v1", **ON)
    acme["auth"] = {"keys": [f"sha256:{KEY_DIGEST}"], "admin_keys": [digest(ADMIN)]}
    config = {"store": {"url": f"sqlite:///{tmp_path / 'keel.db'}"}, "tenants": [acme]}
    (tmp_path / "keel.yaml").write_text(yaml.safe_dump(config))
    keel = start_keel(parse_config(config, "test"))
    ask(keel, "messages", True)
    assert landed(keel)
    ask(keel, "messages", False)
    metrics = httpx.get(keel.url + "/metrics").text
    assert 'keel_response_cache_requests_total{cache="responses",outcome="hit",tenant="acme"} 1.0' in metrics
    saved = [line for line in metrics.splitlines() if line.startswith("keel_response_cache_saved_usd_total")]
    assert saved and float(saved[0].rsplit(" ", 1)[1]) > 0

    def summary() -> dict[str, Any]:
        reply = httpx.get(keel.url + "/keel/api/summary?since=1h", headers={"authorization": f"Bearer {ADMIN}"})
        figures: dict[str, Any] = reply.json()
        return figures

    assert eventually(lambda: summary()["response_cache"]["hits"] == 1)
    figures = summary()
    assert figures["dollars"]["by_cause"]["answers"] > 0 and figures["dollars"]["saved"] > 0
    assert main(["report", "--config", str(tmp_path / "keel.yaml"), "--since", "1h"]) == 0
    printed = capsys.readouterr().out
    assert "answered from Keel's cache" in printed and "response cache: 1 answers" in printed
