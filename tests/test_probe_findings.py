"""What the reliability probe found, each reproduced through HTTP: paths, slow clients, keys,
headers, truncated and refused continuations, large replies, store files and bounded caches."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import KEY, ServerThread, keel_config, small_catalog, tenant, tool
from recorder import Recorder, lifespan, read_body

from proxy.standin.script import hidden_call
from proxy.tokens import TokenCounter
from proxy.tools.catalog import CatalogCache

AUTH = {"authorization": f"Bearer {KEY}"}
TOOLS_ON: dict[str, Any] = {"tools": {"enabled": True}}


@pytest.fixture
def recorded(start_keel: Callable[..., ServerThread]) -> Iterator[tuple[Recorder, ServerThread]]:
    recorder = Recorder(chunks=[b'{"ok":true}'])
    with ServerThread(recorder) as upstream:
        yield recorder, start_keel(keel_config(tenant(upstream.url + "/v1"), server={
            "timeouts": {"client_header": 0.5, "client_body": 0.5}}))


def raw_http(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(request)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
        return received


@pytest.mark.parametrize("path", ["/v1/..%2F..%2Fadmin%2Fsecrets", "/v1/files/%2e%2e/%2e%2e/admin",
                                  "/v1/files/%252e%252e%252fadmin", "/v1/files/a%00b", "/v1/files/a%0Ab"])
def test_paths_that_climb_or_carry_controls_are_refused(recorded: tuple[Recorder, ServerThread], path: str) -> None:
    """No path reaches the upstream with Keel's key that the client could not have sent directly."""
    recorder, keel = recorded
    reply = raw_http(keel.port, f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                                "Connection: close\r\n\r\n".encode())
    assert reply.startswith((b"HTTP/1.1 400", b"HTTP/1.1 404")), reply[:200]  # a newline matches no route
    assert b'"invalid_path"' in reply or b"%0A" in path.encode()
    assert recorder.received == []


def test_paths_are_forwarded_as_received(recorded: tuple[Recorder, ServerThread]) -> None:
    """An encoded slash or space stays encoded on the way upstream."""
    recorder, keel = recorded
    response = httpx.get(keel.url + "/v1/files/a%2Fb%20c", headers=AUTH)
    assert response.status_code == 200
    assert recorder.received[0].raw_path == b"/v1/files/a%2Fb%20c"


def test_slow_headers_are_cut_off(recorded: tuple[Recorder, ServerThread]) -> None:
    """A client that dribbles its headers (slowloris) is disconnected after timeouts.client_header."""
    _, keel = recorded
    with socket.create_connection(("127.0.0.1", keel.port), timeout=5) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        while not _closed(conn) and time.monotonic() - started < 3:
            try:
                conn.sendall(b"X-Slow: 1\r\n")  # one more header line, never the blank line
            except OSError:
                break
            time.sleep(0.2)
        assert _closed(conn), "the connection is still open"


def test_idle_connection_is_cut_off(recorded: tuple[Recorder, ServerThread]) -> None:
    """A connection that never sends a byte is closed too."""
    _, keel = recorded
    with socket.create_connection(("127.0.0.1", keel.port), timeout=5) as conn:
        time.sleep(0.9)
        assert _closed(conn)


def test_connections_past_the_limit_get_503(start_keel: Callable[..., ServerThread]) -> None:
    """Past server.max_client_connections a request is answered 503 at once (never queued behind
    held connections), and served again once they close."""
    recorder = Recorder(chunks=[b'{"ok":true}'])
    with ServerThread(recorder) as upstream:
        keel = start_keel(keel_config(tenant(upstream.url + "/v1"), server={"max_client_connections": 4}))
        held = [socket.create_connection(("127.0.0.1", keel.port), timeout=5) for _ in range(4)]
        try:
            time.sleep(0.1)
            assert httpx.get(keel.url + "/healthz").status_code == 503
        finally:
            for conn in held:
                conn.close()
        time.sleep(0.1)
        assert httpx.get(keel.url + "/healthz").status_code == 200


def _connect_from(address: str, port: int) -> socket.socket:
    conn = socket.socket()
    conn.bind((address, 0))  # another loopback address: another client
    conn.connect(("127.0.0.1", port))
    return conn


def test_one_client_cannot_take_every_connection(start_keel: Callable[..., ServerThread]) -> None:
    """2,100 trickling connections from one client left others 503s: the cap was global. One address
    may hold `server.max_connections_per_client` (half the cap by default); past it that client is
    answered 503 at once, and another client is still served."""
    recorder = Recorder(chunks=[b'{"ok":true}'])
    with ServerThread(recorder) as upstream:
        keel = start_keel(keel_config(tenant(upstream.url + "/v1"), server={"max_client_connections": 6}))
        assert keel.app.state.keel.config.server.max_connections_per_client == 3
        held = [_connect_from("127.0.0.1", keel.port) for _ in range(6)]
        try:
            time.sleep(0.2)
            refused = [conn for conn in held if _closed(conn) or _waiting(conn)]
            assert len(refused) == 3 and refused[0].recv(100).startswith(b"HTTP/1.1 503")
            other = _connect_from("127.0.0.2", keel.port)
            other.sendall(f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                          "Connection: close\r\n\r\n".encode())
            assert other.recv(100).startswith(b"HTTP/1.1 200")
            other.close()
        finally:
            for conn in held:
                conn.close()
        time.sleep(0.1)
        assert httpx.get(keel.url + "/healthz").status_code == 200


def _waiting(conn: socket.socket) -> bool:
    """Has the server already said something on this connection?"""
    conn.setblocking(False)
    try:
        return bool(conn.recv(1, socket.MSG_PEEK))
    except BlockingIOError:
        return False
    finally:
        conn.setblocking(True)


def _closed(conn: socket.socket) -> bool:
    try:
        conn.setblocking(False)
        data = conn.recv(1, socket.MSG_PEEK)
        return data == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        conn.setblocking(True)


def test_slow_body_gets_408(recorded: tuple[Recorder, ServerThread]) -> None:
    """A body that does not arrive within timeouts.client_body is a 408, never a held connection."""
    recorder, keel = recorded
    with socket.create_connection(("127.0.0.1", keel.port), timeout=5) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                     + b"\r\nContent-Length: 100\r\n\r\n{")
        reply = b""
        while b"}}" not in reply and (chunk := conn.recv(65536)):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408") and b"request_timeout" in reply
    assert recorder.received == []


def test_mistyped_keel_key_is_not_forwarded(start_keel: Callable[..., ServerThread]) -> None:
    """With a default passthrough tenant, a Keel-looking key that matches nothing is a 401, not a
    provider key sent upstream; a provider key is forwarded as before."""
    recorder = Recorder()
    with ServerThread(recorder) as upstream:
        byo = {"id": "byo", "default": True, "auth": {"passthrough": True}, "upstream": {"base_url": upstream.url}}
        keel = start_keel(keel_config(tenant(upstream.url), byo))
        wrong = httpx.get(keel.url + "/v1/models", headers={"authorization": "Bearer sk-keel-tset"})
        provider = httpx.get(keel.url + "/v1/models", headers={"authorization": "Bearer sk-proj-abc"})
    assert wrong.status_code == 401 and provider.status_code == 200
    assert [r.headers["authorization"] for r in recorder.received] == ["Bearer sk-proj-abc"]


def test_one_date_and_server_header(start_keel: Callable[..., ServerThread]) -> None:
    """The upstream's Date and Server reach the client once (uvicorn adds none of its own)."""
    upstream_headers = [(b"date", b"Mon, 30 Nov 2026 10:00:00 GMT"), (b"server", b"provider")]
    with ServerThread(Replies([(200, b"application/json", [b"{}"], upstream_headers)])) as upstream:
        keel = start_keel(keel_config(tenant(upstream.url + "/v1")))
        response = httpx.post(keel.url + "/v1/chat/completions", headers=AUTH,
                              json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    raw = [(k.lower(), v) for k, v in response.headers.raw]
    assert [v for k, v in raw if k == b"date"] == [b"Mon, 30 Nov 2026 10:00:00 GMT"]
    assert [v for k, v in raw if k == b"server"] == [b"provider"]


def test_metrics_key(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """With server.metrics_keys set, /metrics needs one of them."""
    import hashlib

    digest = hashlib.sha256(b"scrape-me").hexdigest()
    keel = start_keel(keel_config(tenant(standin.url + "/v1"), server={"metrics_keys": [f"sha256:{digest}"]}))
    assert httpx.get(keel.url + "/metrics").status_code == 401
    assert httpx.get(keel.url + "/metrics", headers={"authorization": "Bearer nope"}).status_code == 401
    ok = httpx.get(keel.url + "/metrics", headers={"authorization": "Bearer scrape-me"})
    assert ok.status_code == 200 and "keel_requests_total" in ok.text


def test_metrics_are_loopback_only_unless_opened(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """/metrics was open to any address by default (tenant names, traffic, error rates). Now, without
    `server.metrics_keys`, it answers loopback only (a caller a local proxy forwards, by X-Forwarded-For,
    is not loopback): 403 to others, unless `server.metrics_open` says to serve everyone."""
    remote = {"x-forwarded-for": "203.0.113.7"}  # uvicorn trusts it from 127.0.0.1: a local proxy's caller
    closed = start_keel(keel_config(tenant(standin.url + "/v1")))
    assert httpx.get(closed.url + "/metrics").status_code == 200
    refused = httpx.get(closed.url + "/metrics", headers=remote)
    assert refused.status_code == 403 and "metrics_open" in refused.json()["error"]["message"]
    opened = start_keel(keel_config(tenant(standin.url + "/v1"), server={"metrics_open": True}))
    assert httpx.get(opened.url + "/metrics", headers=remote).status_code == 200


def gauge(keel: ServerThread) -> float:
    value = keel.app.state.keel.metrics.registry.get_sample_value("keel_streams_open", {"tenant": "acme"})
    return value or 0.0


def test_streams_open_counts_responder_streams(standin: ServerThread, start_keel: Callable[..., ServerThread]) -> None:
    """keel_streams_open rises while a tool_search stream is open and falls when it ends."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **TOOLS_ON)))
    body = {"model": "m", "stream": True, "tools": small_catalog(),
            "messages": [{"role": "user", "content": "[[drip 0.1]] " + hidden_call("archive_ticket")}]}
    with httpx.stream("POST", keel.url + "/v1/chat/completions", json=body, headers=AUTH) as response:
        chunks = response.iter_raw()
        next(chunks)
        during = gauge(keel)
        rest = b"".join(chunks)
    time.sleep(0.1)
    assert during == 1 and gauge(keel) == 0
    assert rest.endswith(b"data: [DONE]\n\n")


def sse(*events: Any) -> list[bytes]:
    return [b"data: " + orjson.dumps(e) + b"\n\n" for e in events]


def delta(**d: Any) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d, "finish_reason": None}]}


class Replies(Recorder):
    """Answers each request with the next (status, content type, chunks, headers)."""

    def __init__(self, replies: list[tuple[int, bytes, list[bytes], list[tuple[bytes, bytes]]]]) -> None:
        super().__init__()
        self.replies = replies

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await lifespan(scope, receive, send):
            return
        await read_body(receive)
        status, kind, chunks, headers = self.replies[min(len(self.received), len(self.replies) - 1)]
        self.received.append(None)  # type: ignore[arg-type]
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", kind), *headers]})
        for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


SEARCH_CALL = delta(tool_calls=[{"index": 0, "id": "c1", "type": "function",
                                 "function": {"name": "tool_search", "arguments": '{"query": "archive"}'}}])
FINISH_CALLS = {"id": "x", "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}


def stream_through(start_keel: Callable[..., ServerThread], replies: Any, features: dict[str, Any]) -> bytes:
    with ServerThread(Replies(replies)) as upstream:
        keel = start_keel(keel_config(tenant(upstream.url + "/v1", **features)))
        body = {"model": "m", "stream": True, "tools": small_catalog(),
                "messages": [{"role": "user", "content": "hello"}]}
        return httpx.post(keel.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=10).content


@pytest.mark.parametrize("features", [{}, TOOLS_ON], ids=["off", "on"])
def test_stream_that_ends_early_is_reported(start_keel: Callable[..., ServerThread], features: dict[str, Any]) -> None:
    """An upstream stream that stops before its answer does ends with an error event, not [DONE]."""
    cut = [*sse(delta(role="assistant", content=""), delta(content="Hel")), b'data: {"id":"x","cho']
    received = stream_through(start_keel, [(200, b"text/event-stream", cut, [])], features)
    assert b"[DONE]" not in received
    assert received.rstrip().splitlines()[-1].startswith(b'data: {"error"')


def test_refused_continuation_reports_status_and_retry_after(start_keel: Callable[..., ServerThread]) -> None:
    """A 429 on the call Keel makes after answering tool_search reaches the client as such."""
    first = [*sse(delta(role="assistant", content=""), SEARCH_CALL, FINISH_CALLS), b"data: [DONE]\n\n"]
    refused = (429, b"application/json", [b'{"error":{"message":"slow down"}}'], [(b"retry-after", b"20")])
    received = stream_through(start_keel, [(200, b"text/event-stream", first, []), refused], TOOLS_ON)
    last = received.rstrip().splitlines()[-1]
    assert last.startswith(b'data: {"error"') and b"429" in last and b"retry after 20" in last


def test_continuation_that_is_not_a_stream_is_reported(start_keel: Callable[..., ServerThread]) -> None:
    """A continued call answering 200 with a JSON body instead of events is an error, not an empty turn."""
    first = [*sse(delta(role="assistant", content=""), SEARCH_CALL, FINISH_CALLS), b"data: [DONE]\n\n"]
    received = stream_through(start_keel, [(200, b"text/event-stream", first, []),
                                           (200, b"application/json", [b'{"choices":[]}'], [])], TOOLS_ON)
    assert received.rstrip().splitlines()[-1].startswith(b'data: {"error"') and b"[DONE]" not in received


def test_large_json_reply_streams_through_intact(start_keel: Callable[..., ServerThread]) -> None:
    """A 6 MB JSON reply (over the 4 MiB Keel holds to read) reaches the client byte for byte."""
    big = b'{"id":"x","choices":[],"blob":"' + b"a" * (6 * 1024 * 1024) + b'"}'
    recorder = Recorder(chunks=[big[i:i + 65536] for i in range(0, len(big), 65536)])
    with ServerThread(recorder) as upstream:
        for features in ({}, TOOLS_ON):
            keel = start_keel(keel_config(tenant(upstream.url + "/v1", **features)))
            response = httpx.post(keel.url + "/v1/chat/completions", headers=AUTH, timeout=30, json={
                "model": "m", "tools": small_catalog(), "messages": [{"role": "user", "content": "hi"}]})
            assert response.content == big


async def test_deleted_sqlite_file_is_recreated(tmp_path: Path) -> None:
    """A database file deleted under a running Keel: the health probe reconnects, and writes land
    in the new file instead of vanishing with the old one."""
    from proxy.stores.sqlite import SqliteStore

    path = tmp_path / "keel.db"
    store = SqliteStore(str(path))
    await store.set("k", b"1")
    path.unlink()
    assert await store.ping()
    await store.set("k2", b"2")
    await store.close()
    again = SqliteStore(str(path))
    assert await again.get("k2") == b"2"
    await again.close()


def test_catalog_cache_is_bounded_by_bytes() -> None:
    """Distinct large catalogs evict each other by estimated size, not only by count, and an
    evicted catalog's per-tool entries go with it."""
    cache = CatalogCache(TokenCounter(), size=64, max_bytes=10_000_000)
    sizes = []
    for n in range(8):
        tools = [tool(f"t{n}_{i}", "x" * 400, a="string") for i in range(300)]
        catalog = cache.get(tools)
        assert catalog is not None
        sizes.append(sum(e.chars for e in catalog.entries) * cache.BYTES_PER_SCHEMA_BYTE)
    assert 2_000_000 < sizes[0] < 5_000_000
    assert len(cache._catalogs) <= 4 and cache._bytes <= 10_000_000
    assert len(cache._entries) == 300 * len(cache._catalogs)


@pytest.mark.parametrize("authorization", ["keel-x", "Bearer\tsk-keel-test", "Token sk-keel-test", "Bearer:sk-keel-test",
                                           "Bearer SK-KEEL-typo", "Bearer Keel-acme-1x"])
def test_keel_keys_in_any_form_are_never_forwarded(start_keel: Callable[..., ServerThread], authorization: str) -> None:
    """A Keel key (or a Keel-looking token) in any scheme, case or spacing is not a provider key."""
    recorder = Recorder()
    with ServerThread(recorder) as upstream:
        byo = {"id": "byo", "default": True, "auth": {"passthrough": True}, "upstream": {"base_url": upstream.url}}
        keel = start_keel(keel_config(tenant(upstream.url), byo))
        response = httpx.get(keel.url + "/v1/models", headers={"authorization": authorization})
    assert response.status_code in (200, 401)
    assert all(KEY not in str(r.headers) and "keel" not in str(r.headers).lower() for r in recorder.received)
    if "sk-keel-test" in authorization and authorization.lower().startswith("bearer\t"):
        assert response.status_code == 200, "a tab after Bearer is still the Keel key"


def test_passthrough_x_api_key_is_forwarded(start_keel: Callable[..., ServerThread]) -> None:
    """A passthrough caller authenticating with x-api-key (Anthropic style) keeps it upstream."""
    recorder = Recorder()
    with ServerThread(recorder) as upstream:
        byo = {"id": "byo", "default": True, "auth": {"passthrough": True}, "upstream": {"base_url": upstream.url}}
        keel = start_keel(keel_config(byo))
        assert httpx.get(keel.url + "/v1/models", headers={"x-api-key": "sk-ant-provider"}).status_code == 200
    assert recorder.received[0].headers["x-api-key"] == "sk-ant-provider"


@pytest.mark.parametrize("path", ["/v1/..;/admin", "/v1/models/%2e%2e%3fq=1", "/v1/a/..%3Bx/b"])
def test_dot_segments_with_parameters_are_refused(recorded: tuple[Recorder, ServerThread], path: str) -> None:
    recorder, keel = recorded
    reply = raw_http(keel.port, f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                                "Connection: close\r\n\r\n".encode())
    assert reply.startswith(b"HTTP/1.1 400") and recorder.received == []


def test_stream_with_done_but_no_finish_reason_is_complete(start_keel: Callable[..., ServerThread]) -> None:
    """An upstream that ends with [DONE] but never says finish_reason has answered: not an error."""
    events = [*sse(delta(role="assistant", content=""), delta(content="Hello")), b"data: [DONE]\n\n"]
    received = stream_through(start_keel, [(200, b"text/event-stream", events, [])], TOOLS_ON)
    assert received.endswith(b"data: [DONE]\n\n") and b'"error"' not in received


@pytest.mark.parametrize("calls", [5, "call", {"id": "c1"}, [5, None, "x"]], ids=["number", "string", "object", "list-of-odd"])
def test_odd_tool_calls_are_the_clients_own_input(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                                  calls: Any) -> None:
    """An assistant `tool_calls` that is a number (or another odd value) made a stage raise, a planner
    failure in metrics; it is the client's own input: every stage reads it as no calls, the turn is
    planned, and the upstream gets the value as the client sent it."""
    features = {"tools": {"enabled": True, "defer": {"min_tools": 3}}, "context": {"stable": True}}
    keel = start_keel(keel_config(tenant(standin.url + "/v1", **features)))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok", "tool_calls": calls},
                {"role": "user", "content": "archive ticket 7"}]
    reply = httpx.post(keel.url + "/v1/chat/completions", headers=AUTH,
                       json={"model": "m", "tools": small_catalog(), "messages": messages})
    assert reply.status_code == 200 and "x-keel-tools" in reply.headers
    failures = keel.app.state.keel.metrics.registry.get_sample_value(
        "keel_planner_failures_total", {"tenant": "acme", "planner": "locate"})
    assert not failures and not [line for line in httpx.get(keel.url + "/metrics").text.splitlines()
                                 if line.startswith("keel_planner_failures_total{")]
    sent = standin.app.state.standin.requests[-1]["messages"]
    assert [m["tool_calls"] for m in sent if m["role"] == "assistant"] == [calls]


SEARCH_ANSWER = {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
    "role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "tool_search", "arguments": '{"query": "archive"}'}}]}}]}


@pytest.mark.parametrize("kind", [b"text/html", b"text/plain", b"application/octet-stream"])
def test_continuation_that_is_not_json_is_a_502(start_keel: Callable[..., ServerThread], kind: bytes) -> None:
    """A continued call (after Keel answered tool_search) that answered 200 with an HTML page was relayed
    labelled application/json; it is a 502 in the client's shape, saying what came back."""
    first = (200, b"application/json", [orjson.dumps(SEARCH_ANSWER)], [])
    page = (200, kind, [b"<html><body>maintenance</body></html>"], [])
    with ServerThread(Replies([first, page])) as upstream:
        keel = start_keel(keel_config(tenant(upstream.url + "/v1", **TOOLS_ON)))
        reply = httpx.post(keel.url + "/v1/chat/completions", headers=AUTH, timeout=10,
                           json={"model": "m", "tools": small_catalog(), "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 502 and reply.headers["content-type"] == "application/json"
    assert kind.decode() in reply.json()["error"]["message"]
