"""Fuzzing (hypothesis, bounded): odd request bodies and odd upstream replies, features on and off.

Whatever arrives, Keel answers with no 5xx of its own (an upstream's own status is relayed),
every stream it answers ends with `data: [DONE]` or one error event, and it serves on.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from conftest import KEY, ServerThread, keel_config, small_catalog, tenant
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recorder import lifespan, read_body

from proxy.shapes.chat import CHAT

ON: dict[str, Any] = {"tools": {"enabled": True}, "context": {"stable": True},
                      "cache": {"prompt_cache_key": "auto", "breakpoints": "auto"}}
AUTH = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(max_size=8).filter(lambda k: k != "_keel"), inner, max_size=4),  # that one: see test_invariant_fidelity
    max_leaves=12)


class ScriptedUpstream:
    """A raw ASGI upstream whose next reply the test sets: status, content type and body chunks."""

    def __init__(self) -> None:
        self.reply: tuple[int, bytes, list[bytes]] = (200, b"application/json", [b"{}"])
        self.gzip = False  # compress the reply as a provider behind a CDN does, a flush per chunk

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await lifespan(scope, receive, send):
            return
        await read_body(receive)
        status, kind, chunks = self.reply
        headers = [(b"content-type", kind)]
        packer = zlib.compressobj(wbits=zlib.MAX_WBITS | 16) if self.gzip else None
        if packer is not None:
            headers.append((b"content-encoding", b"gzip"))
            chunks = [packer.compress(c) + packer.flush(zlib.Z_SYNC_FLUSH) for c in chunks] + [packer.flush()]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


@pytest.fixture
def scripted() -> Iterator[tuple[ScriptedUpstream, ServerThread]]:
    upstream = ScriptedUpstream()
    with ServerThread(upstream) as server:
        yield upstream, server


def keels(start_keel: Callable[..., ServerThread], url: str) -> list[ServerThread]:
    """Keel with every feature off, and with them on."""
    return [start_keel(keel_config(tenant(url))), start_keel(keel_config(tenant(url, **ON)))]


def assert_keel_answered(response: httpx.Response, stream: bool, upstream_whole: bool = False) -> None:
    """`upstream_whole`: the upstream always finishes its answers, so an error event would be Keel's."""
    own_failure = response.status_code >= 500 and b'"internal_error"' in response.content
    assert not own_failure, response.content[:300]
    if stream and response.status_code == 200 and response.headers.get("content-type", "").startswith(
            "text/event-stream"):
        events = [e for e in response.content.replace(b"\r\n", b"\n").split(b"\n\n")
                  if e.strip() and not e.startswith(b":")]  # comments (keep-alives) carry nothing
        last = events[-1] if events else b""
        errors = [e for e in events if e.startswith(b'data: {"error"')]
        # [DONE] (whatever an odd upstream sent after it, relayed as sent), or an error event last
        assert b"data: [DONE]" in events or last.startswith(b'data: {"error"'), last[:200]
        assert not (upstream_whole and errors), errors[0][:300]


# --- odd upstream replies --------------------------------------------------------------------

def sse(*payloads: Any) -> list[bytes]:
    return [b"data: " + (p if isinstance(p, bytes) else json.dumps(p).encode()) + b"\n\n" for p in payloads]


chunk_json = st.fixed_dictionaries({"id": st.text(max_size=5), "object": st.just("chat.completion.chunk")}, optional={
    "choices": st.one_of(json_values, st.lists(st.fixed_dictionaries({"index": st.just(0)}, optional={
        "delta": st.one_of(json_values, st.fixed_dictionaries({}, optional={
            "content": st.one_of(st.text(max_size=10), json_values),
            "role": st.just("assistant"),
            "tool_calls": st.one_of(json_values, st.lists(st.fixed_dictionaries({"index": st.integers(0, 3)}, optional={
                "id": st.one_of(st.none(), st.text(max_size=6)),
                "function": st.one_of(json_values, st.fixed_dictionaries({}, optional={
                    "name": st.sampled_from(["tool_search", "call_tool", "close_ticket", "x"]),
                    "arguments": st.one_of(st.text(max_size=20), st.integers(), st.just('{"query": "ticket"}'))}))}),
                max_size=3))})),
        "finish_reason": st.one_of(st.none(), st.sampled_from(["stop", "tool_calls"]))}), max_size=2)),
    "usage": json_values})

upstream_streams = st.lists(st.one_of(chunk_json.map(lambda c: sse(c)[0]), st.just(b"data: [DONE]\n\n"),
                                      st.binary(max_size=30), st.just(b": keep-alive\n\n"),
                                      st.just(b"data: not json\n\n")), max_size=8)

message_json = st.fixed_dictionaries({"role": st.just("assistant")}, optional={
    "content": json_values,
    "tool_calls": st.one_of(json_values, st.lists(st.fixed_dictionaries({}, optional={
        "id": st.one_of(st.none(), st.integers(), st.text(max_size=6)), "type": st.just("function"),
        "function": st.one_of(json_values, st.fixed_dictionaries({}, optional={
            "name": st.sampled_from(["tool_search", "call_tool", "close_ticket"]),
            "arguments": st.one_of(st.text(max_size=20), st.integers(), st.just('{"query":"ticket"}'))}))}),
        max_size=3))})
upstream_bodies = st.one_of(
    st.binary(max_size=60),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"id": st.just("c")}, optional={
        "choices": st.one_of(json_values, st.lists(st.fixed_dictionaries({"index": st.just(0)}, optional={
            "message": st.one_of(json_values, message_json), "finish_reason": st.just("stop")}), max_size=2)),
        "usage": json_values}).map(lambda v: json.dumps(v).encode()))


@pytest.fixture
def scripted_keels(scripted: tuple[ScriptedUpstream, ServerThread],
                   start_keel: Callable[..., ServerThread]) -> tuple[ScriptedUpstream, list[ServerThread]]:
    return scripted[0], keels(start_keel, scripted[1].url + "/v1")


@FUZZ
@given(stream=st.booleans(), status=st.sampled_from([200, 200, 200, 400, 429, 500]),
       events=upstream_streams, body=upstream_bodies, as_sse=st.booleans(), gzipped=st.booleans())
def test_odd_upstream_replies(scripted_keels: tuple[ScriptedUpstream, list[ServerThread]], stream: bool,
                              status: int, events: list[bytes], body: bytes, as_sse: bool, gzipped: bool) -> None:
    """Whatever the upstream answers, plain or gzipped, with features on or off, Keel does not
    fail on its own account. A gzipped stream Keel relays as it came cannot carry a plain error
    event: one that ends before its end marker is cut instead, which the client's library sees."""
    upstream, servers = scripted_keels
    upstream.reply = (status, b"text/event-stream", events) if as_sse else (status, b"application/json", [body])
    upstream.gzip = gzipped
    request = {"model": "m", "stream": stream, "tools": small_catalog(),
               "messages": [{"role": "user", "content": "close the ticket please"}]}
    for keel in servers:
        try:
            response = httpx.post(keel.url + "/v1/chat/completions", json=request,
                                  headers={**AUTH, "accept-encoding": "gzip"}, timeout=10)
        except httpx.RemoteProtocolError:
            ended = CHAT.stream_end.search(b"".join(events))  # the end marker as Keel reads it
            assert gzipped and as_sse and status == 200 and not ended, "cut for no reason"
            continue
        assert_keel_answered(response, stream)


# --- odd request bodies ----------------------------------------------------------------------

fields = st.dictionaries(st.sampled_from(["model", "stream", "stream_options", "tools", "tool_choice", "user",
                                          "metadata", "prompt_cache_key", "response_format", "n", "x_unknown"]),
                         json_values, max_size=5)
messages = st.lists(st.one_of(json_values, st.fixed_dictionaries({"role": st.sampled_from(
    ["user", "assistant", "system", "tool", "developer", "x"])}, optional={
    "content": st.one_of(json_values, st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"])},
                                                                        optional={"text": json_values}), max_size=3)),
    "tool_calls": json_values, "tool_call_id": json_values})), max_size=5)


@pytest.fixture
def standin_keels(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> list[ServerThread]:
    return keels(start_keel, standin.url + "/v1")


@FUZZ
@given(extra=fields, history=messages, with_tools=st.booleans())
def test_odd_request_bodies(standin_keels: list[ServerThread], extra: dict[str, Any], history: list[Any],
                            with_tools: bool) -> None:
    """Wrong types anywhere in a chat body: a clear 4xx, the upstream's own answer, or a 200."""
    body: dict[str, Any] = {"model": "m", "messages": [*history, {"role": "user", "content": "hi"}], **extra}
    if with_tools:
        body["tools"] = small_catalog()
    for keel in standin_keels:
        response = httpx.post(keel.url + "/v1/chat/completions", content=json.dumps(body).encode(), headers=AUTH,
                              timeout=10)
        assert_keel_answered(response, bool(body.get("stream")), upstream_whole=True)


def test_keel_serves_on_after_fuzzing(standin_keels: list[ServerThread]) -> None:
    """After odd traffic (this module's other tests), a plain request is answered as usual."""
    for keel in standin_keels:
        response = httpx.post(keel.url + "/v1/chat/completions", headers=AUTH, timeout=10,
                              json={"model": "m", "messages": [{"role": "user", "content": "ping"}]})
        assert response.json()["choices"][0]["message"]["content"] == "You said: ping"
