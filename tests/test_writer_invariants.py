"""What relay.Writer and sender.Sender promise for every answer, held through HTTP on all three
API shapes, streamed and not: the open-streams gauge comes back to 0 (whole streams, a client that
leaves, an upstream that breaks, a tool_search round loop, cache hits and coalesced followers, an
embeddings reply too large to hold), each request gets exactly one access log line and one
keel_requests_total count, a broken stream ends with one error event in the client's shape, and
the work a turn leaves for its first 2xx (its memory job) is offered once, never for a refusal."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import KEY, ServerThread, eventually, keel_config, small_catalog, tenant
from recorder import Recorder

from proxy.defaults import create_upstream
from proxy.respcache.embeddings import READ_LIMIT
from proxy.standin.script import hidden_call
from proxy.stores.sqlite import SqliteStore
from proxy.testing import FaultyStore

AUTH = {"authorization": f"Bearer {KEY}"}
SHAPES = ["chat", "responses", "messages"]
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def body(shape: str, text: str, stream: bool = True, **extra: Any) -> dict[str, Any]:
    if shape == "chat":
        return {"model": "m", "stream": stream, "messages": [{"role": "user", "content": text}], **extra}
    if shape == "responses":
        return {"model": "m", "stream": stream, "input": text, "store": False, **extra}
    return {"model": "c", "max_tokens": 64, "stream": stream, "messages": [{"role": "user", "content": text}], **extra}


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.request_ids: list[str] = []
        self.errors: list[object] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "request":
            self.request_ids.append(str(getattr(record, "request_id", "")))
            self.errors.append(getattr(record, "error", None))


@pytest.fixture
def access() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("keel.access")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def sample(keel: ServerThread, name: str, labels: dict[str, str] | None = None) -> float:
    registry = keel.app.state.keel.metrics.registry
    if labels is not None:
        return registry.get_sample_value(name, labels) or 0.0
    return sum(s.value for metric in registry.collect() for s in metric.samples if s.name == name)


def settled(keel: ServerThread, access: Lines, requests: int) -> None:
    """The gauge is back to 0, and each of `requests` has its one line and one count."""
    assert eventually(lambda: sample(keel, "keel_streams_open", {"tenant": "acme"}) == 0
                      and len(access.request_ids) >= requests), (sample(keel, "keel_streams_open", {"tenant": "acme"}),
                                                                access.request_ids)
    time.sleep(0.2)  # a second report would come now
    assert len(access.request_ids) == requests, access.request_ids
    assert len(set(access.request_ids)) == requests
    assert sample(keel, "keel_requests_total") == requests
    assert sample(keel, "keel_streams_open", {"tenant": "acme"}) == 0


def events(raw: bytes) -> list[bytes]:
    return [e for e in raw.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]


def error_events(shape: str, raw: bytes) -> list[bytes]:
    if shape == "chat":
        return [e for e in events(raw) if e.startswith(b'data: {"error"')]
    return [e for e in events(raw) if e.startswith(b"event: error")]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_whole_stream_is_counted_once_and_closes_the_gauge(keel: ServerThread, access: Lines, shape: str) -> None:
    for _ in range(2):
        reply = httpx.post(keel.url + PATHS[shape], json=body(shape, "[[words 5]]"), headers=AUTH, timeout=10)
        assert reply.status_code == 200 and not error_events(shape, reply.content)
    settled(keel, access, 2)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_client_leaving_mid_stream_is_counted_once_and_closes_the_gauge(keel: ServerThread, access: Lines,
                                                                          shape: str) -> None:
    with httpx.stream("POST", keel.url + PATHS[shape], json=body(shape, "[[drip 0.05]] [[words 2000]]"),
                      headers=AUTH, timeout=10) as reply:
        chunks = reply.iter_raw()
        next(chunks)
        assert sample(keel, "keel_streams_open", {"tenant": "acme"}) == 1
    settled(keel, access, 1)
    assert access.errors == ["client_disconnected"]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_stream_the_upstream_breaks_ends_with_one_error_event_in_its_shape(keel: ServerThread, access: Lines,
                                                                              shape: str) -> None:
    reply = httpx.post(keel.url + PATHS[shape], json=body(shape, "[[words 9]] [[cut]]"), headers=AUTH, timeout=10)
    assert reply.status_code == 200
    errors = error_events(shape, reply.content)
    assert len(errors) == 1, reply.content[-600:]
    assert events(reply.content)[-1] == errors[0]
    if shape == "messages":
        assert b'"type":"error"' in errors[0].replace(b" ", b"") and b'"error":{' in errors[0].replace(b" ", b"")
    settled(keel, access, 1)
    assert access.errors == ["upstream_reset"]


@pytest.mark.parametrize("shape", SHAPES)
def catalog(shape: str) -> list[dict[str, Any]]:
    tools = small_catalog()
    if shape == "responses":
        return [{"type": "function", **t["function"]} for t in tools]
    if shape == "messages":
        return [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                 "input_schema": t["function"]["parameters"]} for t in tools]
    return tools


@pytest.mark.parametrize("shape", SHAPES)
def test_a_tool_search_round_loop_stream_closes_the_gauge(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                                         access: Lines, shape: str) -> None:
    keel = start_keel(keel_config(tenant(standin.url + "/v1", tools={"enabled": True})))
    tools = catalog(shape)
    reply = httpx.post(keel.url + PATHS[shape], json=body(shape, hidden_call("archive_ticket"), tools=tools),
                       headers=AUTH, timeout=20)
    assert reply.status_code == 200 and not error_events(shape, reply.content)
    assert reply.headers.get("x-keel-tool-search-rounds") == "1" or len(standin.app.state.standin.requests) == 2
    with httpx.stream("POST", keel.url + PATHS[shape], headers=AUTH, timeout=20,
                      json=body(shape, "[[drip 0.05]] [[words 400]] " + hidden_call("archive_ticket"), tools=tools)) as r:
        next(r.iter_raw())
    settled(keel, access, 2)


@pytest.mark.parametrize("shape", SHAPES)
def test_cached_and_coalesced_streams_close_the_gauge(standin: ServerThread, start_keel: Callable[..., ServerThread],
                                                      access: Lines, shape: str) -> None:
    keel = start_keel(keel_config(tenant(standin.url + "/v1", cache={"responses": "on"})))
    ask = body(shape, "share this [[sleep 0.6]] [[words 20]]", temperature=0)
    with ThreadPoolExecutor(3) as pool:
        leader = pool.submit(httpx.post, keel.url + PATHS[shape], json=ask, headers=AUTH, timeout=20)
        time.sleep(0.3)
        followers = [pool.submit(httpx.post, keel.url + PATHS[shape], json=ask, headers=AUTH, timeout=20)
                     for _ in range(2)]
        replies = [leader.result(), *(f.result() for f in followers)]
    assert eventually(lambda: len(keel.app.state.keel.answers.flights) == 0)
    hit = httpx.post(keel.url + PATHS[shape], json=ask, headers=AUTH, timeout=20)
    assert hit.headers["x-keel-response-cache"].startswith("hit")
    with httpx.stream("POST", keel.url + PATHS[shape], json=ask, headers=AUTH, timeout=20) as r:  # a hit left early
        next(r.iter_raw())
    assert all(r.status_code == 200 for r in replies)
    settled(keel, access, 5)


def test_an_embeddings_reply_too_large_to_hold_closes_the_gauge(start_keel: Callable[..., ServerThread],
                                                                access: Lines) -> None:
    piece = b"0" * (1 << 20)
    big = Recorder(chunks=[b'{"data":[{"index":0,"embedding":"'] + [piece] * (READ_LIMIT // len(piece) + 1) + [b'"}]}'])
    with ServerThread(big) as upstream:
        keel = start_keel(keel_config(tenant(upstream.url + "/v1", cache={"embeddings": "on"})))
        with httpx.stream("POST", keel.url + "/v1/embeddings", json={"model": "e", "input": "x"}, headers=AUTH,
                          timeout=30) as reply:
            size = sum(len(c) for c in reply.iter_raw())
        assert reply.status_code == 200 and size > READ_LIMIT
        with httpx.stream("POST", keel.url + "/v1/embeddings", json={"model": "e", "input": "y"}, headers=AUTH,
                          timeout=30) as reply:
            next(reply.iter_raw())
        settled(keel, access, 2)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_client_gone_before_the_stream_starts_is_counted_once_and_closes_the_gauge(
        keel: ServerThread, access: Lines, shape: str) -> None:
    """The client leaves while the upstream is still thinking: by the time Keel has a stream to
    write, nobody reads it. It still counts once, and the gauge comes back to 0."""
    payload = orjson.dumps(body(shape, "[[sleep 0.8]] [[words 5]]"))
    host, port = keel.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(f"POST {PATHS[shape]} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n"
                     f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n".encode() + payload)
        time.sleep(0.3)
    time.sleep(1.0)  # the upstream answers; Keel has a stream for a client that is gone
    settled(keel, access, 1)


class RefuseSecond:
    """The upstream, with its second call of a turn refused (503): a round loop broken mid-stream."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, 0

    async def open(self, method: str, url: str, headers: Any, content: bytes | None) -> Any:
        self.calls += 1
        if self.calls == 2 and content:
            content = content.replace(b"ROUND-ONE-ONLY", b"[[error 503]]")
        return await self.inner.open(method, url, headers, content)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.parametrize("shape", SHAPES)
def test_a_round_loop_refused_mid_stream_ends_with_one_error_event_in_its_shape(
        standin: ServerThread, start_keel: Callable[..., ServerThread], access: Lines, shape: str) -> None:
    config = keel_config(tenant(standin.url + "/v1", tools={"enabled": True}))
    refusing = RefuseSecond(create_upstream(config.server))
    keel = start_keel(config, upstream=refusing)
    reply = httpx.post(keel.url + PATHS[shape], headers=AUTH, timeout=20,
                       json=body(shape, "ROUND-ONE-ONLY " + hidden_call("archive_ticket"), tools=catalog(shape)))
    assert refusing.calls == 2 and reply.status_code == 200
    errors = error_events(shape, reply.content)
    assert len(errors) == 1 and events(reply.content)[-1] == errors[0], reply.content[-600:]
    assert b"503" in errors[0]
    settled(keel, access, 1)


def asks(keel: ServerThread) -> float:
    registry = keel.app.state.keel.metrics.registry
    return sum(registry.get_sample_value("keel_memory_asks_total", {"tenant": "acme", "outcome": o}) or 0.0
               for o in ("queued", "spooled", "duplicate", "lost"))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("shape", SHAPES)
def test_accepted_work_runs_once_across_a_round_loop_and_never_for_a_refused_turn(
        standin: ServerThread, start_keel: Callable[..., ServerThread], access: Lines, shape: str, stream: bool) -> None:
    """A turn whose answer took two upstream calls (a tool_search round) offers its memory job once;
    a turn the upstream refused offers none."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1", tools={"enabled": True},
                                         memory={"enabled": True, "gate": {"audit_rate": 0.0}})))
    user = {**AUTH, "x-keel-user": "ana"}
    refused = httpx.post(keel.url + PATHS[shape], headers=user, timeout=20,
                         json=body(shape, "please remember that my color is teal [[error 503]]", stream))
    assert refused.status_code == 503
    time.sleep(0.3)
    assert asks(keel) == 0
    calls = len(standin.app.state.standin.requests)
    looped = httpx.post(keel.url + PATHS[shape], headers=user, timeout=20, json=body(
        shape, "please remember that my city is Porto " + hidden_call("archive_ticket"), stream, tools=catalog(shape)))
    assert looped.status_code == 200 and not error_events(shape, looped.content)
    assert len([r for r in list(standin.app.state.standin.requests)[calls:] if "set_memory" not in str(r.get("tools"))]) == 2
    assert eventually(lambda: asks(keel) >= 1)
    time.sleep(0.3)
    assert asks(keel) == 1
    settled(keel, access, 2)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("shape", SHAPES)
def test_a_savings_batch_the_store_refuses_costs_the_turn_nothing(
        standin: ServerThread, start_keel: Callable[..., ServerThread], access: Lines, tmp_path: Path, shape: str,
        stream: bool) -> None:
    """Store.batch (the savings ledger's two round trips, after the answer) failing as StoreError:
    each turn is still answered whole and counted once."""
    store = FaultyStore(SqliteStore(str(tmp_path / "k.db")), "raise", only={"batch"})
    keel = start_keel(keel_config(tenant(standin.url + "/v1", context={"stable": True}), savings={"enabled": True}),
                      store=store)
    usage = {"stream_options": {"include_usage": True}} if shape == "chat" and stream else {}  # no usage: nothing to write
    for text in ("first [[words 5]]", "second [[words 5]]"):
        reply = httpx.post(keel.url + PATHS[shape], json=body(shape, text, stream, **usage), headers=AUTH, timeout=20)
        assert reply.status_code == 200 and not error_events(shape, reply.content)
        assert b"word4" in reply.content
    assert eventually(lambda: store.faults["batch"] >= 2), store.faults
    settled(keel, access, 2)


class SlowlyClosed:
    """An upstream response whose close takes a moment (a client library that awaits its socket)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.status, self.headers = inner, inner.status, inner.headers

    def iter_raw(self) -> Any:
        return self.inner.iter_raw()

    async def read(self) -> bytes:
        data: bytes = await self.inner.read()
        return data

    async def aclose(self) -> None:
        await asyncio.sleep(0.05)
        await self.inner.aclose()


class SlowClose:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def open(self, method: str, url: str, headers: Any, content: bytes | None) -> Any:
        return SlowlyClosed(await self.inner.open(method, url, headers, content))

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.parametrize("shape", SHAPES)
def test_a_client_leaving_while_the_upstream_closes_slowly_is_still_counted(
        standin: ServerThread, start_keel: Callable[..., ServerThread], access: Lines, shape: str) -> None:
    """The client leaves mid-stream; closing the upstream's reply awaits (and the cancelled request
    is cancelled again there). The stream is still taken off the gauge and counted once."""
    config = keel_config(tenant(standin.url + "/v1"))
    keel = start_keel(config, upstream=SlowClose(create_upstream(config.server)))
    with httpx.stream("POST", keel.url + PATHS[shape], json=body(shape, "[[drip 0.05]] [[words 2000]]"),
                      headers=AUTH, timeout=10) as reply:
        next(reply.iter_raw())
    settled(keel, access, 1)


@pytest.fixture
def no_collection() -> Iterator[None]:
    """A serving process's posture taken further (proxy/gcposture.py freezes what start-up built and
    collects rarely): no cyclic collection at all while the test runs; put back after."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(10_000_000, 10, 10)
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_client_leaving_a_fast_stream_is_counted_at_once_with_no_collection(
        standin: ServerThread, start_keel: Callable[..., ServerThread], access: Lines, no_collection: None,
        shape: str) -> None:
    """A client leaves a stream that fills its socket: with no cyclic collection to close what a
    cycle holds, the stream is still taken off the gauge and counted at once (closed by the
    writer, not by the collector)."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1")))
    with httpx.stream("POST", keel.url + PATHS[shape], json=body(shape, "[[words 200000]]"), headers=AUTH,
                      timeout=10) as reply:
        next(reply.iter_raw())
    settled(keel, access, 1)


@pytest.mark.parametrize("shape", ["chat", "responses"])
def test_a_client_leaving_a_stream_whose_ids_are_watched_is_counted_at_once(
        standin: ServerThread, start_keel: Callable[..., ServerThread], access: Lines, no_collection: None,
        shape: str) -> None:
    """A stored reply's stream (chat with store, Responses by default) passes through the owner
    watch (proxy/owners.py) on its way out: a client leaving it still closes the writer's stream."""
    keel = start_keel(keel_config(tenant(standin.url + "/v1")))
    with httpx.stream("POST", keel.url + PATHS[shape], json=body(shape, "[[drip 0.02]] [[words 2000]]", store=True),
                      headers=AUTH, timeout=10) as reply:
        next(reply.iter_raw())
    settled(keel, access, 1)
    with httpx.stream("POST", keel.url + PATHS[shape], json=body(shape, "[[words 200000]]", store=True),
                      headers=AUTH, timeout=10) as reply:
        next(reply.iter_raw())
    settled(keel, access, 2)
